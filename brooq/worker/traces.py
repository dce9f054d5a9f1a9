"""A running job's stack as text: the frames of a thread, or the await chain of a task.

Owns the rendering of `brooq jobs stack` (format_frames: from the application's first
frame under brooq's loop) and of what a suspended task awaits (await_frames,
format_await_chain), read by both loops from the control thread.

Must never run in the loop's thread or change what it reads: it only walks frames.
"""

from __future__ import annotations

import asyncio
import traceback
from pathlib import Path
from typing import Any

__all__ = ["await_frames", "format_await_chain", "format_frames"]

_WORKER_DIR = str(Path(__file__).resolve().parent)
_BROOQ_DIR = str(Path(__file__).resolve().parent.parent)


def format_frames(frames: traceback.StackSummary) -> str:
    """A stack as Python prints a traceback (most recent call last), from the first frame
    of the application's code under brooq's: the interpreter's start and brooq's own
    loop around the handler are left out (middleware frames stay)."""
    summaries = list(frames)
    first = 0
    for i in range(len(summaries) - 1):  # after the frame brooq's worker calls it from
        here, below = summaries[i].filename, summaries[i + 1].filename
        if here.startswith(_WORKER_DIR) and not below.startswith(_BROOQ_DIR):
            first = i + 1
            break
    lines = "".join(traceback.format_list(summaries[first:]))
    return f"Traceback (most recent call last):\n{lines}".rstrip()


def format_await_chain(task: asyncio.Task[Any]) -> str:
    """What a suspended task awaits, from its outermost coroutine down, as the
    `File "...", line N, in fn` lines of a traceback."""
    frames = await_frames(task)
    if not frames:
        return ""
    lines = "".join(traceback.format_list(frames))
    return f"Task await chain (most recent call last):\n{lines}".rstrip()


def await_frames(task: asyncio.Task[Any]) -> traceback.StackSummary:
    """The frames of a task's await chain, outermost first."""
    frames: list[traceback.FrameSummary] = []
    coro: Any = task.get_coro()
    seen = 0
    while coro is not None and seen < 100:
        seen += 1
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        frames.append(
            traceback.FrameSummary(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
        )
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return traceback.StackSummary.from_list(frames)
