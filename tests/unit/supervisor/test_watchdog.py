"""The watchdog's decisions (brooq.supervisor.watchdog): hard limits, a lost lease, a child without
progress, a blocked event loop.
"""

from __future__ import annotations

import uuid

from brooq.ipc.board import Running
from brooq.ipc.reasons import (
    LEASE_LOST,
    LOOP_BLOCKED,
    MAX_EXECUTION_TIMEOUT,
)
from brooq.supervisor.watchdog import (
    BLOCKED_PAST_SOFT_LIMIT,
    STACK_GRACE,
    BusyChild,
    Decision,
    LoopView,
    decide,
)


def test_a_child_holding_jobs_without_progress_is_killed_after_the_lease() -> None:
    from brooq.supervisor.watchdog import STACK_GRACE, Decision, HoldingChild, decide_stalled

    lease = 2.0
    fresh = HoldingChild(pid=1, progress_at=10.0, stack_requested_at=None)
    assert decide_stalled([fresh], now=11.9, limit=lease) == []
    assert decide_stalled([fresh], now=12.0, limit=lease) == [Decision(1, "dump_stack", "stalled")]
    asked = HoldingChild(pid=1, progress_at=10.0, stack_requested_at=12.0)
    assert decide_stalled([asked], now=12.0 + STACK_GRACE / 2, limit=lease) == []
    assert decide_stalled([asked], now=12.0 + STACK_GRACE * 1.5, limit=lease) == [
        Decision(1, "kill", "stalled")
    ]


# -- watchdog decisions --------------------------------------------------------------------------


def _running(started: float, limit: float, n: int = 1, soft: float = 0.0) -> Running:
    return Running(uuid.UUID(int=n), "t", 1, started, limit, soft)


def test_a_job_past_its_hard_limit_gets_a_stack_request_then_a_kill() -> None:
    job = _running(100.0, 5.0)
    busy = BusyChild(pid=1, jobs=(job,), stack_requested_at=None)
    assert decide([busy], now=104.9, grace=30.0) == []
    assert decide([busy], now=105.0, grace=30.0) == [
        Decision(1, "dump_stack", MAX_EXECUTION_TIMEOUT, job.id)
    ]
    asked = BusyChild(1, (job,), stack_requested_at=105.0)
    assert decide([asked], now=105.0 + STACK_GRACE / 2, grace=30.0) == []
    assert decide([asked], now=105.0 + STACK_GRACE, grace=30.0) == [
        Decision(1, "kill", MAX_EXECUTION_TIMEOUT, job.id)
    ]


def test_a_child_still_busy_after_its_lease_was_lost_is_killed_after_the_grace() -> None:
    job = _running(100.0, 300.0)
    lost = BusyChild(pid=2, jobs=(job,), stack_requested_at=None, lease_lost={job.id: 110.0})
    assert decide([lost], now=111.9, grace=2.0) == []
    assert decide([lost], now=112.0, grace=2.0) == [Decision(2, "dump_stack", LEASE_LOST)]
    # The hard limit is looked at first.
    hard = _running(100.0, 5.0)
    both = BusyChild(3, (hard,), stack_requested_at=None, lease_lost={hard.id: 100.0})
    assert decide([both], now=200.0, grace=2.0) == [
        Decision(3, "dump_stack", MAX_EXECUTION_TIMEOUT, hard.id)
    ]
    # A lost job no longer on the board (it ended) is not a reason.
    gone = BusyChild(4, (job,), stack_requested_at=None, lease_lost={uuid.UUID(int=99): 100.0})
    assert decide([gone], now=200.0, grace=2.0) == []


def running(n: int, started: float = 100.0, hard: float = 300.0, soft: float = 60.0) -> Running:
    return Running(uuid.UUID(int=n), f"t{n}", 1, started, hard, soft)


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
