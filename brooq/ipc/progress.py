"""A running handler's progress: ``claim.progress(fraction, message)``.

Owns the checks of what a handler reports (a fraction from 0 to 1, a message of at most
MESSAGE_MAX characters) and where a report goes in this process: a worker child sets
``sink`` after the fork to write it on its board (brooq.ipc.board), from which the
master's progress tick carries it to the row within about a quarter of a second
(brooq.supervisor.duties.progress, job_write_progress); the attempt's last report is also
kept on the claim (``claim.reported``), which its outcome writes (brooq.worker.outcome).
Without a sink (a handler called directly) a report is checked and kept on the claim only;
under brooq.testing's drain the outcome writes it.
Must never do I/O: a report is a memory write, whatever the handler's pace.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from typing import Any

MESSAGE_MAX = 200  # characters; at most 800 bytes of UTF-8, what a board slot holds

# Set in a worker child: (job id, attempt, fraction, message) -> the message as stored on
# the board, or None when no slot runs the job (its attempt has ended: nothing kept).
sink: Callable[[uuid.UUID, int, float, str], str | None] | None = None


def check(fraction: object, message: object) -> tuple[float, str]:
    """``(fraction, message)`` as stored, or ValueError naming what is wrong."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise ValueError(
            f"progress fraction must be a number from 0 to 1, got {type(fraction).__name__}"
        )
    value = float(fraction)
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"progress fraction must be from 0 to 1, got {fraction!r}")
    if not isinstance(message, str):
        raise ValueError(f"progress message must be a str, got {type(message).__name__}")
    if len(message) > MESSAGE_MAX:
        raise ValueError(
            f"progress message is {len(message)} characters long, at most {MESSAGE_MAX}"
        )
    if "\x00" in message:
        raise ValueError("progress message must not contain NUL characters")
    return value, message


def report(claim: Any, fraction: float, message: str = "") -> None:
    """Say how far this attempt is: ``fraction`` from 0 to 1 and a short ``message`` (at
    most 200 characters). A memory write in the child, no round trip: the latest report
    reaches the job's row within about a quarter of a second (the master's progress
    tick), and the last one is written with the attempt's outcome, where
    ``queue.get(id).progress``, ``brooq top`` and the status page show it. Each new
    attempt starts with none. ValueError when either is not what it must be."""
    value, text = check(fraction, message)
    if sink is None:
        claim.reported = (value, text)
        return
    stored = sink(claim.id, claim.attempt, value, text)
    if stored is not None:  # after its attempt ended (a thread it left), nothing is kept
        claim.reported = (value, stored)


def text(fraction: float | None, message: str | None) -> str:
    """A job's progress as ``brooq top`` and the page show it: "40% resizing", or "-"."""
    if fraction is None:
        return "-"
    return f"{fraction * 100:.0f}% {message}" if message else f"{fraction * 100:.0f}%"
