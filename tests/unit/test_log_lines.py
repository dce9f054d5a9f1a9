"""brooq's key=value lines are one line per record, whatever the texts hold: control
characters escaped, a message's continuation and an exception as quoted values that
decode back to the text."""

from __future__ import annotations

from brooq import logs
from brooq.logs import Event, KeyValueFormatter

FORGED = "ts=1 level=error logger=brooq.master pid=1 event=master_fatal"


def _line(message: str, exception: str = "") -> str:
    return KeyValueFormatter(False).line(Event("ERROR", "brooq.child", 7, 0.0, message, exception))


def test_a_traceback_is_one_quoted_value() -> None:
    tb = f'Traceback (most recent call last):\n  File "a.py"\nValueError: x\n{FORGED}'
    line = _line("event=job_dead job=1 error='x\\nts=1'\n" + tb, exception=tb)
    assert line.splitlines() == [line]
    assert line.startswith("level=error logger=brooq.child pid=7 event=job_dead job=1 ")
    found = dict(logs._PAIR.findall(line))
    assert logs._value(found["detail"]) == tb and logs._value(found["exception"]) == tb


def test_control_characters_in_the_first_line_are_escaped() -> None:
    line = _line(f"a\rb\x1b[2J\x85c\u2028d\u202ee\x7f {FORGED}")
    assert line.splitlines() == [line]
    assert "a\\rb\\u001b[2J\\u0085c\\u2028d\\u202ee\\u007f" in line
    assert line.isprintable()


def test_a_plain_message_is_unchanged() -> None:
    assert _line("event=job_done job=1 topic=t é") == (
        "level=error logger=brooq.child pid=7 event=job_done job=1 topic=t é"
    )
