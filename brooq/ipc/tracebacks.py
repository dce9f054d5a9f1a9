"""A failed attempt's traceback as the error history keeps it (job.errors, the entry's
``traceback``): written by a child for what a handler raised, and by the master for the
stack it read before killing a child. Both sides cut the same way, so the text a user
reads has one shape whichever process wrote it.

The shape: Python's own (most recent call last), from the application's first frame:
brooq's loop around the handler (and the interpreter's start, for a killed child) is left
out, middleware and everything the handler called stay, brooq's frames below the
application's included. Bounded to TRACEBACK_MAX characters: when it does not fit, the
frames in the middle of a stack go first (the outermost application frame, the
handler's, and the innermost frames stay, with a line saying how many were left out),
then the older exceptions of a chain (the one raised stays), then an exception's
message is cut in its middle. The innermost frames and the exception's type are never
the part cut.

Owns: ``format_exception`` (a child: an exception to its kept text) and ``killed_stack``
(the master: a faulthandler dump, with an async job's await chain, to its kept text).
Must never: import brooq beyond this room, read or write anything but the text it is
given (source lines are read the way Python's traceback module reads them: linecache, in
the child only).
"""

from __future__ import annotations

import os
import re
import sysconfig
import traceback
from collections.abc import Sequence
from pathlib import Path

__all__ = ["TRACEBACK_MAX", "format_exception", "killed_stack"]

TRACEBACK_MAX = 8192  # characters of one kept traceback
MESSAGE_MAX = 2000  # characters of one exception's "Type: message" lines in it
_MIN_EARLIER = 400  # an older exception of a chain is kept only with this much room left
# Frames of one stack formatted at most (the first and the innermost): a frame's text is
# longer than TRACEBACK_MAX / _FRAMES_READ, so the bound never holds more of them, and a
# recursion of a thousand frames is not formatted whole for a text that keeps a few.
_FRAMES_READ = 300

_BROOQ_DIR = str(Path(__file__).resolve().parent.parent) + os.sep
_STDLIB_DIRS = tuple(
    str(Path(p).resolve()) + os.sep
    for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
)
_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"
_NOT_KEPT = "  ... {} frames not kept (the middle of the stack) ...\n"


def _brooqs(filename: str) -> bool:
    return filename.startswith(_BROOQ_DIR)


def _application(filename: str) -> bool:
    return not filename.startswith((_BROOQ_DIR, "<frozen ", *_STDLIB_DIRS))


def _first_application_frame(filenames: Sequence[str]) -> int:
    """Where the kept stack starts: the first application frame that brooq's code called
    (after brooq's loop, the middleware chain or the interpreter's start); else after the
    leading brooq and standard-library frames; else the whole stack."""
    for i in range(1, len(filenames)):
        if _application(filenames[i]) and _brooqs(filenames[i - 1]):
            return i
    for i, name in enumerate(filenames):
        if _application(name):
            return i
    return 0


def _cut_middle(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters: its head and its longer tail, at line
    ends where it can, with what was cut said between them."""
    if len(text) <= limit:
        return text
    note = "\n... [{} characters not kept] ...\n"
    room = max(limit - len(note.format(len(text))), 2)
    head_room = room // 4
    head = text[:head_room]
    if "\n" in head:
        head = head[: head.rindex("\n")]
    tail = text[len(text) - (room - len(head)) :]
    if "\n" in tail[:-1]:
        tail = tail[tail.index("\n") + 1 :]
    return head + note.format(len(text) - len(head) - len(tail)) + tail


def _fit(header: str, units: list[str], footer: str, budget: int, skipped: int = 0) -> str | None:
    """``header``, the frames ``units`` (each a rendered frame) and ``footer`` in at most
    ``budget`` characters: every frame when they fit, else the first one and as many of
    the last ones as fit, with a line saying how many were left out; None when not even
    the innermost frame fits. ``skipped``: frames already left out after the first."""
    if not skipped:
        whole = header + "".join(units) + footer
        if len(whole) <= budget:
            return whole
    fixed = len(header) + len(footer) + len(_NOT_KEPT.format(len(units) + skipped))
    for head in (units[:1], []):
        room = budget - fixed - sum(map(len, head))
        tail: list[str] = []
        for unit in reversed(units[len(head) :]):
            if len(unit) > room:
                break
            tail.append(unit)
            room -= len(unit)
        if tail:
            tail.reverse()
            left_out = len(units) - len(head) - len(tail) + skipped
            return header + "".join(head) + _NOT_KEPT.format(left_out) + "".join(tail) + footer
    return None


# -- a child: what a handler raised ---------------------------------------------------------------


def format_exception(exc: BaseException, limit: int = TRACEBACK_MAX) -> str:
    """What ``exc`` (with its chain) looks like as Python prints it, from the application's
    first frame, in at most ``limit`` characters. Never raises: a failure to format is
    said in the text instead."""
    try:
        return _format(exc, limit)
    except Exception as failure:  # an exception's __str__ is application code
        return _cut_middle(
            f"(the traceback could not be formatted: {type(failure).__qualname__})\n"
            f"{type(exc).__qualname__}",
            limit,
        )


def _chain(exc: BaseException) -> list[tuple[traceback.TracebackException, str]]:
    """The exceptions of ``exc``'s chain, the one raised first, each with the line that
    follows it when Python prints the chain (oldest first)."""
    # Source lines are read for the frames kept only (when they are formatted).
    te = traceback.TracebackException.from_exception(exc, compact=True, lookup_lines=False)
    chain: list[tuple[traceback.TracebackException, str]] = []
    link = ""
    seen: set[int] = set()
    current: traceback.TracebackException | None = te
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append((current, link))
        if current.__cause__ is not None:
            current, link = current.__cause__, _CAUSE
        elif current.__context__ is not None and not current.__suppress_context__:
            current, link = current.__context__, _CONTEXT
        else:
            current = None
    return chain


def _render(te: traceback.TracebackException, budget: int) -> str | None:
    """One exception of a chain, its stack from the application's first frame."""
    frames = list(te.stack)
    start = _first_application_frame([f.filename for f in frames])
    stack = traceback.StackSummary.from_list(frames[start:])
    if getattr(te, "exceptions", None):  # an exception group: Python's text, cut as text
        te.stack = stack
        return _cut_middle("".join(te.format(chain=False)), budget)
    message = _cut_middle("".join(te.format_exception_only()), min(MESSAGE_MAX, budget // 2))
    header = "Traceback (most recent call last):\n" if frames else ""
    skipped = max(len(stack) - _FRAMES_READ, 0)  # more than any text of the bound holds
    if skipped:
        head, tail = stack[:1], stack[1 + skipped :]
        units = [*_summary(head).format(), *_summary(tail).format()]
        return _fit(header, units, message, budget, skipped)
    return _fit(header, list(stack.format()), message, budget)


def _summary(frames: list[traceback.FrameSummary]) -> traceback.StackSummary:
    return traceback.StackSummary.from_list(frames)


def _format(exc: BaseException, limit: int) -> str:
    chain = _chain(exc)
    parts: list[str] = []
    room = limit
    for i, (te, link) in enumerate(chain):
        if i and room < _MIN_EARLIER + len(link):
            parts.append(f"({len(chain) - i} earlier exceptions of the chain not kept)\n\n")
            break
        text = _render(te, room - len(link))
        if text is None:
            if i == 0:  # not even the innermost frame fits: the text, cut
                return _cut_middle(
                    "".join(traceback.format_exception(exc, chain=False)), limit
                ).rstrip()
            parts.append(f"({len(chain) - i} earlier exceptions of the chain not kept)\n\n")
            break
        parts.append(text + link)  # oldest first: this one, then how the next came
        room -= len(parts[-1])
    return "".join(reversed(parts)).rstrip()


# -- the master: the stack of a child it killed ---------------------------------------------------

_THREAD = re.compile(
    r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+ .*:$|^Stack \(most recent call first\):$"
)
_DUMPED = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+|\?\?\?) in (?P<name>.*)$')
_PRINTED = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+), in (?P<name>.*)$')
_AWAIT = "Task await chain (most recent call last):"


def killed_stack(dump: str, limit: int = TRACEBACK_MAX) -> str:
    """The stack the master read before it killed a child (brooq.supervisor.childproc's
    read_stack: an async job's await chain, then the faulthandler dump, the thread that
    ran the handler first) as the error history keeps it: that thread's frames from the
    application's first one, most recent call last, then the job's await chain (alone
    when that thread shows only the event loop: the job was suspended); the other threads
    are left out. "" for an empty dump."""
    lines = dump.strip("\n").splitlines()
    if not lines:
        return ""
    first_thread = next((i for i, ln in enumerate(lines) if _THREAD.match(ln)), len(lines))
    waited, dumped = lines[:first_thread], lines[first_thread:]
    parts = []
    current = []
    for line in dumped[1:]:
        if _THREAD.match(line) or not line.strip():
            break
        current.append(line)
    frames = [m for m in map(_DUMPED.match, current) if m]
    frames.reverse()  # faulthandler writes the most recent call first
    waits = bool(waited) and waited[0].strip() == _AWAIT
    if waits and not any(_application(m["file"]) for m in frames):
        frames = []  # an event loop waiting: the job is in its await chain alone
    if frames:
        start = _first_application_frame([m["file"] for m in frames])
        units = [
            f'  File "{m["file"]}", line {m["line"]}, in {m["name"]}\n' for m in frames[start:]
        ]
        parts.append(("Stack when killed (most recent call last):\n", units))
    if waits:
        units = []
        for line in waited[1:]:
            if _PRINTED.match(line) or not units:
                units.append(line + "\n")
            else:  # the source line under its frame
                units[-1] += line + "\n"
        files = [m["file"] if (m := _PRINTED.match(u.split("\n")[0])) else "" for u in units]
        parts.append((_AWAIT + "\n", units[_first_application_frame(files) :]))
    if not parts:  # not a dump this reads: the text, cut
        return _cut_middle(dump.strip(), limit)
    texts = []
    room = limit
    for header, units in parts:
        text = _fit(header, units, "", room - 1)
        if text is None:
            break
        texts.append(text)
        room -= len(text) + 1
    return "\n".join(texts).rstrip() or _cut_middle(dump.strip(), limit)
