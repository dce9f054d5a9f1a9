"""Which queues are worked when none are configured: the handlers' queues, at weight 1.

The master resolves them to say what it works (brooq.supervisor.command) and each child
to order its claims (brooq.worker.weights): both must come to the same list.

Must never do I/O: the answer is a pure function of the settings and the handlers.
"""

from __future__ import annotations

from collections.abc import Mapping

from brooq.handlers import Handler
from brooq.job import DEFAULT_QUEUE
from brooq.settings import QueueWeights

__all__ = ["worked_queues"]


def worked_queues(configured: QueueWeights, handlers: Mapping[str, Handler]) -> QueueWeights:
    """The queues a master works: those configured, else its handlers' queues, weight 1."""
    if configured:
        return configured
    declared = sorted({h.queue for h in handlers.values()}) or [DEFAULT_QUEUE]
    return tuple((name, 1) for name in declared)
