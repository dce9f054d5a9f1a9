"""A failed attempt's traceback as the error history keeps it (brooq.ipc.tracebacks): from
the application's first frame, bounded, the innermost frames and the exception never cut.
"""

from __future__ import annotations

import selectors
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from brooq.ipc.tracebacks import TRACEBACK_MAX, format_exception, killed_stack
from brooq.rules import worked_queues
from brooq.worker import attempt, child

ATTEMPT = str(Path(attempt.__file__).resolve())
SELECTORS = str(Path(selectors.__file__).resolve())  # the standard library's
CHILD = str(Path(child.__file__).resolve())


def raised(fn: Any, *args: Any) -> BaseException:
    try:
        fn(*args)
    except BaseException as exc:
        return exc
    raise AssertionError("did not raise")


def parse_order(n: int) -> float:
    return total_of(n) / n


def total_of(n: int) -> int:
    return n * 0


class Handlers(Mapping[str, Any]):
    """Handlers whose values() is application code brooq calls (as a handler is)."""

    def __getitem__(self, key: str) -> Any:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def values(self) -> Any:
        return [parse_order(0)]


def test_the_kept_text_starts_at_the_application_frame_brooq_called() -> None:
    text = format_exception(raised(worked_queues, (), Handlers()))
    lines = text.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    # brooq's frame and the caller above it (here the test, in a child the interpreter's
    # start and brooq's loop) are left out; the user's frames in call order follow.
    assert "rules.py" not in text and "raised" not in text
    frames = [ln.split(", in ")[1] for ln in lines if ln.startswith('  File "')]
    assert frames == ["values", "parse_order"]
    assert lines[-1] == "ZeroDivisionError: division by zero"
    assert "return total_of(n) / n" in text  # the source lines, as Python prints them


def test_a_chain_is_kept_oldest_first_as_python_prints_it() -> None:
    def wrap() -> None:
        try:
            parse_order(0)
        except ZeroDivisionError as exc:
            raise ValueError("the order is empty") from exc

    text = format_exception(raised(wrap))
    cause = text.index("ZeroDivisionError: division by zero")
    link = text.index("The above exception was the direct cause of the following exception:")
    assert cause < link < text.index("ValueError: the order is empty")
    assert text.endswith("ValueError: the order is empty")


def ping(n: int) -> int:
    return pong(n + 1)


def pong(n: int) -> int:
    return ping(n + 1)


def test_a_very_deep_stack_is_bounded_and_keeps_both_ends() -> None:
    exc = raised(ping, 0)
    whole = "".join(__import__("traceback").format_exception(exc))
    assert len(whole) > 4 * TRACEBACK_MAX
    text = format_exception(exc)
    assert len(text) <= TRACEBACK_MAX
    assert text.endswith("RecursionError: maximum recursion depth exceeded")
    lines = text.splitlines()
    assert ", in raised" in lines[1]  # the outermost application frame stays
    assert any("frames not kept (the middle of the stack)" in ln for ln in lines)
    # the innermost frames stay: the last frame before the exception is a ping or pong
    innermost = [ln for ln in lines if ln.startswith('  File "')][-1]
    assert innermost.endswith((", in ping", ", in pong"))


def test_one_function_recursing_is_folded_as_python_folds_it() -> None:
    def down(n: int) -> int:
        return down(n + 1)

    text = format_exception(raised(down, 0))
    assert "more times]" in text and len(text) < 2000


def test_a_huge_message_is_cut_in_its_middle_and_keeps_its_type() -> None:
    def shout() -> None:
        raise ValueError("begin " + "x" * 200_000 + " end")

    text = format_exception(shout_frames := raised(shout))
    assert shout_frames is not None
    assert len(text) <= TRACEBACK_MAX
    assert "ValueError: begin xxx" in text and text.endswith("xxx end")
    assert "characters not kept" in text and "in shout" in text


def test_a_long_chain_keeps_the_exception_raised_and_says_what_it_left_out() -> None:
    def layers(n: int) -> None:
        if n == 0:
            ping(0)
        try:
            layers(n - 1)
        except Exception as exc:
            raise RuntimeError(f"layer {n}") from exc

    text = format_exception(raised(layers, 30))
    assert len(text) <= TRACEBACK_MAX
    assert text.endswith("RuntimeError: layer 30")
    assert "earlier exceptions of the chain not kept" in text.splitlines()[0]


def test_an_exception_whose_str_raises_is_still_kept() -> None:
    class Odd(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    def odd() -> None:
        raise Odd

    text = format_exception(raised(odd))
    assert "Odd" in text and len(text) <= TRACEBACK_MAX


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception groups: Python 3.11")
def test_an_exception_group_is_kept_bounded() -> None:
    def many() -> None:
        errors = [ValueError("v" * 3000 + str(i)) for i in range(20)]
        raise ExceptionGroup("many", errors)  # noqa: F821 - Python 3.11

    text = format_exception(raised(many))
    assert len(text) <= TRACEBACK_MAX and "ExceptionGroup: many" in text


# -- the master's side: a killed child's stack --------------------------------------------------

DUMP = (
    "Current thread 0x00007f01 (most recent call first):\n"
    '  File "/srv/app/tasks.py", line 12 in crunch\n'
    '  File "/srv/app/tasks.py", line 20 in handler\n'
    f'  File "{ATTEMPT}", line 250 in call\n'
    f'  File "{CHILD}", line 300 in run\n'
    '  File "/srv/venv/bin/brooq-master", line 8 in <module>\n'
    "\n"
    "Thread 0x00007f02 (most recent call first):\n"
    '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n'
)


def test_a_killed_childs_stack_reads_as_a_traceback_from_the_handler() -> None:
    assert killed_stack(DUMP) == (
        "Stack when killed (most recent call last):\n"
        '  File "/srv/app/tasks.py", line 20, in handler\n'
        '  File "/srv/app/tasks.py", line 12, in crunch'
    )


def test_a_killed_deep_stack_keeps_the_handler_and_the_innermost_frames() -> None:
    frames = [f'  File "/srv/app/deep.py", line {n} in level_{n}\n' for n in range(3000, 0, -1)]
    dump = (
        "Current thread 0x00007f01 (most recent call first):\n"
        + "".join(frames)
        + f'  File "/srv/app/tasks.py", line 20 in handler\n  File "{ATTEMPT}", line 250 in call\n'
    )
    text = killed_stack(dump, 2000)
    lines = text.splitlines()
    assert len(text) <= 2000
    # the handler, then the innermost frames (faulthandler wrote them first)
    assert lines[1].endswith("in handler") and lines[-1].endswith("in level_3000")
    assert "frames not kept" in lines[2]


def test_an_async_jobs_await_chain_follows_its_thread() -> None:
    chain = (
        "Task await chain (most recent call last):\n"
        f'  File "{ATTEMPT}", line 10, in run_one\n'
        '  File "/srv/app/tasks.py", line 30, in a_swallow\n'
        "    await asyncio.sleep(1)\n"
    )
    text = killed_stack(chain + DUMP)
    assert text.startswith("Stack when killed (most recent call last):\n")
    assert text.endswith(
        "Task await chain (most recent call last):\n"
        '  File "/srv/app/tasks.py", line 30, in a_swallow\n'
        "    await asyncio.sleep(1)"
    )


def test_what_is_not_a_dump_is_kept_cut_and_nothing_is_nothing() -> None:
    assert killed_stack("") == ""
    text = killed_stack("garbage " * 5000, 1000)
    assert len(text) <= 1000 and text.startswith("garbage")


def test_a_suspended_async_job_is_kept_as_its_await_chain_alone() -> None:
    """The thread ran only the event loop (the job awaited): its frames say nothing of
    the job, the await chain does."""
    loop = (
        "Current thread 0x00007f01 (most recent call first):\n"
        f'  File "{SELECTORS}", line 468 in select\n'
        f'  File "{CHILD}", line 300 in main\n'
        '  File "<frozen runpy>", line 198 in _run_module_as_main\n'
    )
    chain = (
        "Task await chain (most recent call last):\n"
        f'  File "{ATTEMPT}", line 10, in run_one\n'
        '  File "/srv/app/tasks.py", line 30, in a_swallow\n'
        "    await asyncio.sleep(1)\n"
    )
    assert killed_stack(chain + loop) == chain.rstrip().replace(
        f'  File "{ATTEMPT}", line 10, in run_one\n', ""
    )
