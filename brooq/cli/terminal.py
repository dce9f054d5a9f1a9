"""What the operator's commands print for a person: text from jobs and masters (handler
log lines, error texts, progress messages, topics, hostnames) made harmless on a
terminal.

A job's text is written by whoever enqueued or ran it; printed raw, its escape sequences
would act on the operator's terminal (clear the screen, set the window title, write the
clipboard with OSC 52, ask the terminal to answer). Every human-readable line goes
through ``say`` (or ``visible``, for a line drawn another way, as `brooq top` draws its
frames), which shows each such character as text, as git and ``less -R`` do: a C0
control but newline and tab, and DEL, in caret notation (ESC is ``^[``, CR ``^M``, DEL
``^?``); a C1 control (U+0080 to U+009F), a bidirectional override or isolate, and a
line or paragraph separator as ``<U+202E>``. ``--json`` is left as it is: JSON escapes
the C0 controls itself, and a program reads it.

Owns: ``visible``, ``one_line``, ``say``, ``say_lines``.
Must never: change a character that is printable, newline or tab (``visible``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import click

# C0 controls but tab and newline, DEL, C1 controls, the bidirectional marks, embeddings,
# overrides and isolates, and the line and paragraph separators.
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
_ONE_LINE_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


def _shown(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    if code < 0x20:
        return "^" + chr(code + 0x40)  # ESC -> ^[, CR -> ^M
    if code == 0x7F:
        return "^?"
    return f"<U+{code:04X}>"


def visible(text: object) -> str:
    """``text`` with every character that would act on a terminal shown as text;
    newlines and tabs kept."""
    shown = str(text)
    if shown.isprintable():  # the usual case: nothing to look for
        return shown
    return _UNSAFE.sub(_shown, shown)


def one_line(text: object) -> str:
    """``visible``, with newlines and tabs shown too (``^J``, ``^I``): for a value that
    must stay on its line (a table cell, a field)."""
    shown = str(text)
    if shown.isprintable():
        return shown
    return _ONE_LINE_UNSAFE.sub(_shown, shown)


def say(text: object = "", err: bool = False) -> None:
    """Print ``text`` for a person (``visible``), on stderr with ``err``."""
    click.echo(visible(text), err=err)


def say_lines(lines: Iterable[str]) -> None:
    """Print lines that are one line each (``one_line``: a newline inside one is shown,
    it cannot start a line of its own)."""
    for line in lines:
        click.echo(one_line(line))
