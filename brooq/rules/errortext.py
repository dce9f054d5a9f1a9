"""How long a last_error may be, and the cut that keeps a text to it.

Read by the child when it writes what an attempt raised (brooq.worker.execute) and by the
master when it writes why a child's job failed with it (brooq.supervisor.maintenance):
both bound the same column the same way.

Must never do I/O or look at what the text says: it only cuts.
"""

from __future__ import annotations

LAST_ERROR_MAX = 2000

_TRUNCATED = " ... [truncated]"


def bounded(text: str, limit: int = LAST_ERROR_MAX) -> str:
    """``text`` cut to at most ``limit`` characters, marked as cut when it was."""
    return text if len(text) <= limit else text[: limit - len(_TRUNCATED)] + _TRUNCATED
