"""Pure pieces of async handlers: the board's slots, the watchdog's verdicts
on a blocked loop, what a killed async child's jobs become, the kind rule of middleware,
the async chain, the await chain of a suspended task, the settings."""

from __future__ import annotations

import asyncio
import functools
import signal
import uuid
from typing import Any

import pytest

import brooq
from brooq import settings as settings_mod
from brooq.errors import InvalidSettings
from brooq.ipc.board import Board, Running
from brooq.ipc.reasons import ASYNC, LOOP_BLOCKED, MAX_EXECUTION_TIMEOUT
from brooq.supervisor.settlement import ChildEnd, SettleHeld, settle
from brooq.supervisor.watchdog import (
    BLOCKED_PAST_SOFT_LIMIT,
    BusyChild,
    Decision,
    LoopView,
    decide,
)
from brooq.worker.aio import format_await_chain
from brooq.worker.chain import compose_async


def running(n: int, started: float = 100.0, hard: float = 300.0, soft: float = 60.0) -> Running:
    return Running(uuid.UUID(int=n), f"t{n}", 1, started, hard, soft)


# -- the board -----------------------------------------------------------------------------


def test_a_board_of_many_slots_shows_every_job_and_each_slot_changes_alone() -> None:
    board = Board(100)
    assert board.read_all() == () and board.loop_beat() == 0.0 and board.culprit() is None
    jobs = [running(n) for n in range(1, 6)]
    for slot, job in zip((0, 7, 42, 98, 99), jobs, strict=True):
        board.post_running(job, slot)
    assert board.read_all() == tuple(jobs)
    board.clear(42)
    assert board.read_all() == (jobs[0], jobs[1], jobs[3], jobs[4])
    assert board.read() == jobs[0]  # the first slot: a sync child's job
    board.beat(123.5)
    board.set_culprit(jobs[1].id, 123.5)
    assert board.loop_beat() == 123.5 and board.culprit() == (jobs[1].id, 123.5)
    board.set_culprit(None, 0.0)
    assert board.culprit() is None
    board.hooks_running(True)
    assert board.in_hooks() and board.read_all() == (jobs[0], jobs[1], jobs[3], jobs[4])
    board.close()


def test_a_sync_board_keeps_one_slot_and_one_page() -> None:
    board = Board()
    assert board.capacity == 1 and len(board._mem) == 4096
    job = running(1)
    board.post_running(job)
    assert board.read_all() == (job,) and board.read() == job
    board.clear()
    assert board.read_all() == () and board.read() is None
    board.close()


# -- the watchdog on a blocked loop ------------------------------------------------------------


def test_a_silent_loop_is_killed_at_loop_block_timeout_charging_the_named_culprit() -> None:
    culprit, sibling = running(1, started=100.0), running(2, started=99.0)
    loop = LoopView(beat=101.0, culprit=culprit.id, block_timeout=5.0)
    child = BusyChild(pid=1, jobs=(sibling, culprit), stack_requested_at=None, loop=loop)
    assert decide([child], now=105.9, grace=30.0) == []  # culprit within its soft limit
    assert decide([child], now=106.0, grace=30.0) == [
        Decision(1, "dump_stack", LOOP_BLOCKED, culprit.id)
    ]


def test_a_culprit_past_its_own_soft_limit_is_killed_after_a_second_of_silence() -> None:
    culprit = running(1, started=100.0, soft=1.0)
    loop = LoopView(beat=100.2, culprit=culprit.id, block_timeout=5.0)
    child = BusyChild(pid=1, jobs=(running(2), culprit), stack_requested_at=None, loop=loop)
    silent_enough = 100.2 + BLOCKED_PAST_SOFT_LIMIT
    assert decide([child], now=silent_enough - 0.01, grace=30.0) == []
    assert decide([child], now=silent_enough, grace=30.0) == [
        Decision(1, "dump_stack", LOOP_BLOCKED, culprit.id)
    ]


def test_a_blocked_loop_with_nobody_named_is_killed_charging_nobody() -> None:
    loop = LoopView(beat=100.0, culprit=None, block_timeout=5.0)
    child = BusyChild(pid=1, jobs=(running(1), running(2)), stack_requested_at=None, loop=loop)
    assert decide([child], now=105.0, grace=30.0) == [Decision(1, "dump_stack", LOOP_BLOCKED)]


def test_a_beating_loop_or_one_that_never_ran_is_left_alone() -> None:
    jobs = (running(1, started=990.0, soft=1.0),)  # past its soft limit
    fresh = BusyChild(1, jobs, None, loop=LoopView(beat=999.95, culprit=None, block_timeout=5.0))
    booting = BusyChild(2, jobs, None, loop=LoopView(beat=0.0, culprit=None, block_timeout=5.0))
    assert decide([fresh, booting], now=1000.0, grace=30.0) == []


def test_the_hard_limit_of_one_slot_charges_that_job() -> None:
    late = running(2, started=10.0, hard=60.0)
    child = BusyChild(
        pid=3,
        jobs=(running(1, started=50.0), late, running(3, started=69.0)),
        stack_requested_at=None,
        loop=LoopView(beat=70.0, culprit=None, block_timeout=5.0),
    )
    assert decide([child], now=70.0, grace=30.0) == [
        Decision(3, "dump_stack", MAX_EXECUTION_TIMEOUT, late.id)
    ]


# -- what a killed async child's jobs become ------------------------------------------------------


def async_end(**kw: Any) -> ChildEnd:
    base: dict[str, Any] = dict(
        code=-signal.SIGKILL,
        kill_reason=None,
        retiring=None,
        ready=True,
        jobs=(running(1), running(2), running(3)),
        stopping=False,
        now=110.0,
        kind=ASYNC,
    )
    base.update(kw)
    return ChildEnd(**base)


def test_a_blocked_loop_charges_the_culprit_and_returns_its_siblings() -> None:
    s = settle(async_end(kill_reason=LOOP_BLOCKED, kill_job=uuid.UUID(int=2), kill_detail="; x"))
    culprit = uuid.UUID(int=2)
    assert s.jobs == SettleHeld(
        culprit,
        "killed: the event loop was blocked by this job (ran 10.0s without yielding); x",
        because=f"sibling_of={culprit}",
    )
    assert s.label == LOOP_BLOCKED


def test_a_hard_limit_kill_charges_the_slot_past_it_only() -> None:
    s = settle(async_end(kill_reason=MAX_EXECUTION_TIMEOUT, kill_job=uuid.UUID(int=3)))
    assert isinstance(s.jobs, SettleHeld) and s.jobs.job == uuid.UUID(int=3)
    assert s.jobs.because == f"sibling_of={uuid.UUID(int=3)}" and s.jobs.suspects == ()


def test_a_crash_with_many_in_flight_and_no_culprit_makes_them_suspects() -> None:
    s = settle(async_end(code=-signal.SIGSEGV))
    assert s.jobs == SettleHeld(
        None, "worker died: SIGSEGV", tuple(uuid.UUID(int=n) for n in (1, 2, 3)), "suspect"
    )
    # The culprit its control thread named is charged instead.
    named = settle(async_end(code=-signal.SIGSEGV, culprit=uuid.UUID(int=1)))
    assert isinstance(named.jobs, SettleHeld) and named.jobs.job == uuid.UUID(int=1)
    assert named.jobs.suspects == ()
    # One job in flight is that job, as in a sync child.
    alone = settle(async_end(code=-signal.SIGSEGV, jobs=(running(9),)))
    assert alone.jobs == SettleHeld(uuid.UUID(int=9), "worker died: SIGSEGV")


def test_a_blocked_loop_with_nobody_named_returns_everyone_as_a_suspect() -> None:
    s = settle(async_end(kill_reason=LOOP_BLOCKED))
    assert isinstance(s.jobs, SettleHeld) and s.jobs.job is None
    assert len(s.jobs.suspects) == 3 and s.jobs.because == "suspect"


# -- middleware kinds, the async chain -------------------------------------------------------------


async def ahandler(claim: Any) -> Any:
    return ["handler"]


def test_a_middleware_of_the_other_kind_is_refused_naming_the_topic_and_index() -> None:
    queue = brooq.Queue()

    def sync_mw(claim: Any, call_next: Any) -> Any:
        return call_next(claim)

    async def async_mw(claim: Any, call_next: Any) -> Any:
        return await call_next(claim)

    with pytest.raises(InvalidSettings) as info:
        queue.handler("a.t", middleware=[async_mw, sync_mw])(ahandler)
    assert info.value.problems == [
        "a.t: middleware[1] is a sync function and the handler is async: its "
        "call_next(claim) would return before the job ran; write it as async def "
        "fn(claim, call_next)"
    ]
    with pytest.raises(InvalidSettings) as info:
        queue.handler("s.t", middleware=[async_mw])(lambda claim: None)
    assert "s.t: middleware[0] is async and the handler is sync" in info.value.problems[0]
    # Global middleware of either kind is taken: each wraps the handlers of its kind.
    queue.middleware(sync_mw)
    queue.middleware(async_mw)
    assert len(queue.middlewares) == 2


def test_async_kind_is_seen_through_partials_and_callable_objects() -> None:
    queue = brooq.Queue()

    class Handler:
        async def __call__(self, claim: Any) -> None:
            return None

    async def with_arg(extra: int, claim: Any) -> None:
        return None

    queue.handler("a.partial")(functools.partial(with_arg, 1))
    queue.handler("a.object")(Handler())
    queue.handler("s.plain")(lambda claim: None)
    kinds = {t: h.is_async for t, h in queue.handlers.items()}
    assert kinds == {"a.partial": True, "a.object": True, "s.plain": False}


def test_compose_async_runs_the_first_middleware_outermost() -> None:
    def layer(name: str) -> Any:
        async def mw(claim: Any, call_next: Any) -> Any:
            return [f"{name}>", *(await call_next(claim)), f"<{name}"]

        return mw

    assert compose_async(ahandler, ()) is ahandler  # no middleware: the handler itself
    runner = compose_async(ahandler, [layer("a"), layer("b")])
    assert asyncio.run(runner(None)) == ["a>", "b>", "handler", "<b", "<a"]


def test_the_await_chain_of_a_suspended_task_names_every_coroutine_down_to_the_wait() -> None:
    async def inner() -> None:
        await asyncio.sleep(30)

    async def outer() -> None:
        await inner()

    async def main() -> str:
        task = asyncio.ensure_future(outer())
        await asyncio.sleep(0.01)
        text = format_await_chain(task)
        task.cancel()
        return text

    text = asyncio.run(main())
    assert text.startswith("Task await chain (most recent call last):")
    assert text.index("in outer") < text.index("in inner") < text.index("in sleep")
    assert "await inner()" in text


# -- settings ------------------------------------------------------------------------------------


def test_concurrency_and_loop_block_timeout_are_bounded() -> None:
    s = settings_mod.load(environ={"QUEUE_CONCURRENCY": "250", "QUEUE_LOOP_BLOCK_TIMEOUT": "2s"})
    assert s.concurrency == 250 and s.loop_block_timeout == 2.0 and s.async_workers == 1
    assert settings_mod.Settings().concurrency == 100
    with pytest.raises(InvalidSettings) as info:
        settings_mod.load(
            environ={
                "QUEUE_CONCURRENCY": "0",
                "QUEUE_ASYNC_WORKERS": "0",
                "QUEUE_LOOP_BLOCK_TIMEOUT": "500ms",
            }
        )
    assert info.value.problems == [
        "concurrency must be at least 1, got 0",
        "async_workers must be at least 1, got 0",
        "loop_block_timeout must be at least 1s, got 0.5s",
    ]
    with pytest.raises(InvalidSettings) as info:
        settings_mod.load(flags={"concurrency": 10_001})
    assert info.value.problems == ["concurrency must be at most 10000, got 10001"]
