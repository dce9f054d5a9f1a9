"""`brooq jobs show`'s screen with a traceback kept in the error history (show_lines, pure):
the newest traceback under its own heading; on a full screen its source lines go first,
then its middle, and the handler's frame and the innermost frames stay.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime, timezone
from typing import Any

import brooq
from brooq.cli.jobs import show_lines

NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)
SHORT = (
    "Traceback (most recent call last):\n"
    '  File "/srv/app/tasks.py", line 12, in price\n'
    "    return per_item(claim.payload)\n"
    '  File "/srv/app/tasks.py", line 8, in per_item\n'
    '    return total(order) / len(order["prices"])\n'
    "           ~~~~~~~~~~~~~^~~~~~~~~~~~~~~~~~~~~~\n"
    "ZeroDivisionError: division by zero"
)


def entry(attempt: int, traceback: str | None, kind: str = "raised") -> dict[str, Any]:
    return {
        "attempt": attempt,
        "at": "2029-12-31T23:59:00+00:00",
        "started_at": "2029-12-31T23:58:59+00:00",
        "worker": "web1:100:abcdef",
        "error": "ZeroDivisionError: division by zero",
        "kind": kind,
        "traceback": traceback,
    }


RECORD = brooq.JobRecord(
    id=uuid.UUID(int=1),
    topic="order.price",
    payload={"prices": []},
    state="dead",
    attempts=2,
    available_at=NOW,
    locked_by="web1:100:abcdef",
    locked_until=None,
    last_error="ZeroDivisionError: division by zero",
    idempotency_key=None,
    created_at=NOW,
    updated_at=NOW,
    errors=[entry(1, SHORT), entry(2, SHORT)],
)


def test_the_newest_traceback_is_shown_whole_when_it_fits() -> None:
    lines = show_lines(dataclasses.replace(RECORD, errors=[entry(1, SHORT)]), NOW)
    assert len(lines) <= 24
    at = lines.index("traceback (attempt 1, raised):")
    assert lines[at + 1 : at + 8] == ["  " + ln for ln in SHORT.splitlines()]
    assert lines[at - 1] == "last error:      ZeroDivisionError: division by zero"


def test_a_traceback_short_of_room_keeps_its_frames_and_exception() -> None:
    # Failed (waiting for its retry: an "available at" line) with two entries: the
    # traceback has two lines less than its full screen.
    lines = show_lines(dataclasses.replace(RECORD, state="failed"), NOW)
    at = lines.index("traceback (attempt 2, raised):")
    assert lines[at + 1 : at + 5] == [
        "  Traceback (most recent call last):",
        '    File "/srv/app/tasks.py", line 12, in price',
        '    File "/srv/app/tasks.py", line 8, in per_item',
        "  ZeroDivisionError: division by zero",
    ]


def test_a_long_traceback_keeps_the_handler_and_the_innermost_frames() -> None:
    frames = "".join(
        f'  File "/srv/app/deep.py", line {n}, in level_{n}\n    level_{n + 1}()\n'
        for n in range(1, 60)
    )
    long = (
        "Traceback (most recent call last):\n"
        '  File "/srv/app/tasks.py", line 3, in handler\n    level_1()\n'
        + frames
        + "RuntimeError: too deep"
    )
    record = dataclasses.replace(RECORD, errors=[entry(1, SHORT), entry(2, long)])
    lines = show_lines(record, NOW)
    assert len(lines) <= 24
    at = lines.index("traceback (attempt 2, raised):")
    end = next(i for i, ln in enumerate(lines) if ln.startswith("payload:"))
    block = lines[at + 1 : end]
    assert block[0] == "  Traceback (most recent call last):"
    assert block[1].endswith("in handler")  # where the handler started
    assert block[2].startswith("  … ") and "brooq jobs show" in block[2]
    assert block[-1] == "  RuntimeError: too deep"
    assert block[-2].endswith("in level_59")  # the innermost frame
    assert not any(ln.startswith("      ") for ln in block)  # the source lines went first


def test_the_newest_entry_with_a_traceback_is_the_one_shown() -> None:
    """A lease expiry after a raise has no traceback: the raise's is shown, with its
    attempt; an entry of an older release (no traceback key) shows none."""
    expired = {**entry(2, None, "lease_expired"), "error": "lease expired (1 of 5): ..."}
    lines = show_lines(dataclasses.replace(RECORD, errors=[entry(1, SHORT), expired]), NOW)
    assert "traceback (attempt 1, raised):" in lines
    old = {"attempt": 1, "at": "2029-12-31T23:59:00+00:00", "error": "E", "worker": "w"}
    lines = show_lines(dataclasses.replace(RECORD, errors=[old]), NOW)
    assert not any(ln.startswith("traceback") for ln in lines)


def test_a_killed_jobs_stack_shows_the_handlers_frame_not_the_end_of_last_error() -> None:
    """last_error of a kill holds the stack most recent call first, cut at its end: the
    screen used to keep that end (brooq's and the interpreter's frames)."""
    stack = (
        "Stack when killed (most recent call last):\n"
        '  File "/srv/app/tasks.py", line 20, in handler\n'
        '  File "/srv/app/tasks.py", line 12, in crunch'
    )
    killed = {**entry(1, stack, "killed"), "error": "killed: max_execution_timeout 2s exceeded"}
    last_error = (
        "killed: max_execution_timeout 2s exceeded (ran 2.1s); stack (most recent call first):\n"
        + "\n".join(f'  File "/venv/lib/brooq/x{n}.py", line {n} in f{n}' for n in range(40))
    )
    record = dataclasses.replace(RECORD, errors=[killed], last_error=last_error, attempts=1)
    lines = show_lines(record, NOW)
    at = lines.index("traceback (attempt 1, killed):")
    assert lines[at + 1 : at + 4] == ["  " + ln for ln in stack.splitlines()]
    assert lines[at - 1] == (
        "last error:      killed: max_execution_timeout 2s exceeded (ran 2.1s); stack (most "
        "recent call first):"
    )
