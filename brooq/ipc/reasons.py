"""Why a child stopped and why the master replaced it, spelled once for the whole fleet.

These words are the `reason=` of log lines and the `reason` label of
brooq_child_restarts_total and brooq_children_killed_total, so their text is part of the
operator's interface: alerts match on them. One style, snake_case, everywhere. The child's
own retire reasons were spelled `max-jobs` and `max-memory` until 2026-12; alert rules
written for them should match both spellings (see CHANGELOG.md).

The child's exit codes are here too: the master reads them to decide what a child's end
means (brooq.supervisor.settlement).
"""

from __future__ import annotations

from typing import Final, Literal

# -- the child tells the master it will stop (protocol message "retire") ------------------
RetireReason = Literal["max_jobs", "max_memory"]
MAX_JOBS: Final = "max_jobs"
MAX_MEMORY: Final = "max_memory"

# -- the master asks a child to stop (SIGTERM) ----------------------------------------------
StopReason = Literal["drain", "scale_down", "reload", "reload_failed"]
DRAIN: Final = "drain"
SCALE_DOWN: Final = "scale_down"
RELOAD: Final = "reload"
RELOAD_FAILED: Final = "reload_failed"

# -- the master kills a child (SIGKILL of its process group) ------------------------------
KillReason = Literal[
    "max_execution_timeout", "lease_lost", "stalled", "drain_timeout", "fatal", "loop_blocked"
]
MAX_EXECUTION_TIMEOUT: Final = "max_execution_timeout"
# An async child's event loop stopped reporting: a coroutine that never yields.
LOOP_BLOCKED: Final = "loop_blocked"
LEASE_LOST: Final = "lease_lost"
STALLED: Final = "stalled"
DRAIN_TIMEOUT: Final = "drain_timeout"
FATAL: Final = "fatal"

# brooq_children_killed_total{reason}: a child killed after its lease was lost is "hung".
KilledLabel = Literal[
    "max_execution_timeout", "hung", "stalled", "drain_timeout", "fatal", "loop_blocked"
]

# -- which handlers a child runs (fixed at fork; docs/async.md) -----------------------------
ChildKind = Literal["sync", "async"]
SYNC: Final = "sync"
ASYNC: Final = "async"

# -- how a child ended that nobody asked for ------------------------------------------------
CRASH: Final = "crash"
EXIT: Final = "exit"

# brooq_child_restarts_total{reason} and child_exited's reason=: the kill, else the stop
# or retire reason, else crash (non-zero exit) or exit.
RestartReason = KillReason | StopReason | RetireReason | Literal["crash", "exit"]

# -- child exit codes -----------------------------------------------------------------------
EXIT_OK: Final = 0
EXIT_CRASHED: Final = 1  # an exception outside any handler
EXIT_BOOT_ERROR: Final = 3  # died before it was ready
EXIT_APP_LOAD_ERROR: Final = 4  # could not re-import the application (reload)
EXIT_MASTER_GONE: Final = 70  # its master vanished and it did not finish in time


def killed_label(reason: KillReason) -> KilledLabel:
    return "hung" if reason == LEASE_LOST else reason
