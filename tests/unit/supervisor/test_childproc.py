"""A child's stack read (brooq.supervisor.childproc): the signalled thread first."""

from __future__ import annotations


def test_the_stack_read_puts_the_signalled_thread_first() -> None:
    from brooq.supervisor.childproc import current_thread_first

    dump = (
        'Thread 0x01 (most recent call first):\n  File "a.py", line 1 in control\n\n'
        'Current thread 0x02 (most recent call first):\n  File "h.py", line 9 in handler\n'
    )
    assert current_thread_first(dump) == (
        'Current thread 0x02 (most recent call first):\n  File "h.py", line 9 in handler\n\n'
        'Thread 0x01 (most recent call first):\n  File "a.py", line 1 in control'
    )
    assert current_thread_first("no threads here") == "no threads here"
