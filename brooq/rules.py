"""Rules both sides of the fork read: the master (brooq.supervisor) and its children
(brooq.worker) must agree on them, so they live below both and belong to neither.

Pure: no I/O, no clock, no process state. A rule changed here changes both processes at
once (a rolling reload forks children from the running master's code).

- backoff: the wait between attempts, and a handler's Delay clamped to backoff_max
  (the child in brooq.worker.execute, the master for a job that died with its child in
  brooq.supervisor.maintenance);
- the error text's bound: how long last_error may be, and the cut that keeps to it;
- timing: how long a job runs before it counts as long (its batchmates go back);
- worked queues: which queues a master and its children work when none are configured.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from brooq.declare.handlers import Handler
from brooq.job import DEFAULT_QUEUE
from brooq.settings import QueueWeights

# -- backoff: d = min(base * 2^(attempts-1), max), the wait uniform in [d/2, d] ------------
# The ceiling is checked before the power is taken, so attempt 10,000 gives backoff_max
# rather than an overflow. Computes seconds; SQL applies them.


def backoff_ceiling(attempts: int, base: float, maximum: float) -> float:
    """The upper bound d for the wait after ``attempts`` attempts (attempts >= 1)."""
    exponent = max(attempts, 1) - 1
    # 2.0 ** 1024 raises OverflowError; any exponent this large is past every ceiling.
    if exponent >= 1000:
        return maximum
    return min(base * 2.0**exponent, maximum)


def backoff(attempts: int, base: float, maximum: float, draw: float | None = None) -> float:
    """Seconds to wait before the next attempt: uniform in [d/2, d]. ``draw`` in [0, 1)
    replaces the random draw (for tests and for callers that draw themselves)."""
    d = backoff_ceiling(attempts, base, maximum)
    r = random.random() if draw is None else draw
    return d / 2 + r * (d / 2)


def delay_seconds(requested: float, maximum: float) -> float:
    """A handler's Delay(s), clamped to backoff_max."""
    return max(0.0, min(requested, maximum))


# -- the error text's bound ----------------------------------------------------------------
# The child (what an attempt raised) and the master (why a child's job failed with it)
# bound the same column the same way; the cut never looks at what the text says.

LAST_ERROR_MAX = 2000

_TRUNCATED = " ... [truncated]"


def bounded(text: str, limit: int = LAST_ERROR_MAX) -> str:
    """``text`` cut to at most ``limit`` characters, marked as cut when it was."""
    return text if len(text) <= limit else text[: limit - len(_TRUNCATED)] + _TRUNCATED


# -- timing: when a running job counts as long ---------------------------------------------
# A child claims a few short jobs at once; a job running LONG_JOB seconds gives back the
# jobs claimed after it in its batch, so that other children run them meanwhile. The child
# decides (brooq.worker.child) and the master writes the release when told
# (brooq.supervisor.enforce), so both read this one number.

LONG_JOB = 0.5


# -- worked queues ------------------------------------------------------------------------
# The master resolves them to say what it works (brooq.supervisor.command) and each child
# to order its claims (brooq.worker.weights): both must come to the same list.


def worked_queues(configured: QueueWeights, handlers: Mapping[str, Handler]) -> QueueWeights:
    """The queues a master works: those configured, else its handlers' queues, weight 1."""
    if configured:
        return configured
    declared = sorted({h.queue for h in handlers.values()}) or [DEFAULT_QUEUE]
    return tuple((name, 1) for name in declared)
