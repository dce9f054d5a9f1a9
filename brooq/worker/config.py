"""What a child is given at fork time, and the fixed numbers of its claim loop.

Owns ChildConfig (everything the master hands a child), identity_for (the child's
locked_by) and the worker's constants. The exit codes live in brooq.ipc.reasons, the
contract with the master; they are re-exported here and never defined again.

Must never hold state that changes while the child runs: this is read-only input.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from brooq.declare.handlers import Handler, Middleware
from brooq.ipc.board import Board
from brooq.ipc.reasons import SYNC, ChildKind
from brooq.settings import Settings

if TYPE_CHECKING:
    from brooq.metrics import Metrics

__all__ = [
    "BATCH_BUDGET",
    "PEAK_RSS_MAX_AGE",
    "TITLE_TICK",
    "ChildConfig",
    "identity_for",
]

# A batch holds at most about BATCH_BUDGET seconds of recent average work, so that the
# round trip between jobs is paid once per batch while nothing waits long behind its
# batchmates (a job longer than brooq.rules.LONG_JOB gives back the rest).
BATCH_BUDGET = 0.1
PEAK_RSS_MAX_AGE = 0.25
TITLE_TICK = 0.25  # how often the control thread refreshes the process title


@dataclass
class ChildConfig:
    """What the master hands a child at fork time."""

    identity: str
    dsn: str
    settings: Settings
    handlers: dict[str, Handler]
    to_master: int  # write end
    from_master: int  # read end
    stack_file: str
    app_spec: str = ""
    reload_baseline: frozenset[str] | None = None  # set after SIGHUP: re-import the app
    metrics: Metrics | None = None
    board: Board | None = None  # shared with the master; a private one when alone
    middleware: tuple[Middleware, ...] = ()  # the Queue's, outermost first
    child_start: tuple[Callable[[], object], ...] = ()  # @queue.on_child_start, in order
    kind: ChildKind = SYNC  # which handlers it runs (docs/async.md)
    children: int = 0  # the master's children of this kind (the claim's fair share); 0: workers


def identity_for(pid: int, tag: str) -> str:
    """locked_by of a child: unique on this host (hostname, pid) and across pid reuse (tag)."""
    return f"{socket.gethostname()}:{pid}:{tag}"
