"""How a child's end settles its jobs (brooq.supervisor.settlement): which job is charged, which are
given back, what counts in the crash streak; for sync and async children.
"""

from __future__ import annotations

import logging
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from brooq.ipc.board import Running
from brooq.ipc.reasons import (
    ASYNC,
    DRAIN,
    DRAIN_TIMEOUT,
    EXIT_APP_LOAD_ERROR,
    EXIT_BOOT_ERROR,
    FATAL,
    LEASE_LOST,
    LOOP_BLOCKED,
    MAX_EXECUTION_TIMEOUT,
    MAX_JOBS,
    MAX_MEMORY,
    RELOAD,
    SCALE_DOWN,
    STALLED,
)
from brooq.supervisor.respawn import CrashStreak
from brooq.supervisor.settlement import (
    ChildEnd,
    ReturnAll,
    SettleHeld,
    outside_job,
    retire_reason,
    settle,
    storm_verdict,
)
from brooq.worker import attempt

ATTEMPT = str(Path(attempt.__file__).resolve())
JOB = Running(id=uuid.UUID(int=7), topic="t", attempt=1, started=100.0, max_execution_timeout=5.0)


def end(**kw: Any) -> ChildEnd:
    base: dict[str, Any] = dict(
        code=0, kill_reason=None, retiring=None, ready=True, jobs=(), stopping=False, now=110.0
    )
    job = kw.pop("job", None)
    if job is not None:
        base["jobs"] = (job,)
    base.update(kw)
    return ChildEnd(**base)


# -- settlement: how a child ended -> what happens to its jobs --------------------------------


DUMP = (
    "Current thread 0x02 (most recent call first):\n"
    '  File "/app/tasks.py", line 9 in spin\n'
    '  File "/app/tasks.py", line 4 in handler\n'
    f'  File "{ATTEMPT}", line 300 in call\n'
    '  File "/venv/bin/brooq-master", line 8 in <module>\n'
)


def test_a_hard_timeout_kill_fails_the_running_job_with_the_limit_and_the_stack() -> None:
    s = settle(
        end(
            code=-signal.SIGKILL,
            kill_reason=MAX_EXECUTION_TIMEOUT,
            job=JOB,
            kill_detail="; st",
            kill_stack=DUMP,
        )
    )
    summary = "killed: max_execution_timeout 5s exceeded (ran 10.0s)"
    # last_error keeps the stack as read; the error history entry has it apart, the
    # handler's frames first (most recent call last), brooq's and the interpreter's left out.
    assert s.jobs == SettleHeld(
        JOB.id,
        summary + "; st",
        kind="killed",
        summary=summary,
        traceback="Stack when killed (most recent call last):\n"
        '  File "/app/tasks.py", line 4, in handler\n'
        '  File "/app/tasks.py", line 9, in spin',
    )
    assert (s.label, s.exit, s.level) == (MAX_EXECUTION_TIMEOUT, "signal=SIGKILL", logging.ERROR)
    assert s.count_restart and not s.outside_job


def test_a_hard_timeout_kill_with_an_empty_board_fails_nothing_but_gives_back() -> None:
    s = settle(end(code=-signal.SIGKILL, kill_reason=MAX_EXECUTION_TIMEOUT))
    assert s.jobs == SettleHeld(None, "worker died: SIGKILL")
    assert not s.outside_job  # the master killed it: not the fleet's fault


@pytest.mark.parametrize("reason", [DRAIN_TIMEOUT, FATAL, STALLED])
def test_drain_timeout_fatal_and_stalled_kills_return_everything(reason: Any) -> None:
    s = settle(end(code=-signal.SIGKILL, kill_reason=reason, job=JOB))
    assert s.jobs == ReturnAll()
    assert s.label == reason and s.level == logging.ERROR and not s.outside_job


def test_an_idle_child_that_drained_before_a_zero_budget_kill_ended_cleanly() -> None:
    # SIGQUIT: no budget, so the kill goes out in the pass that asked the children to stop;
    # an idle one has often exited already, holding nothing.
    s = settle(end(code=0, kill_reason=DRAIN_TIMEOUT, retiring=DRAIN, stopping=True))
    assert s.label == DRAIN and s.level == logging.INFO and s.jobs is None
    assert not s.outside_job and not s.count_restart
    # Holding jobs, or killed for real, it is still the drain's timeout.
    held = settle(end(code=0, kill_reason=DRAIN_TIMEOUT, retiring=DRAIN, stopping=True, job=JOB))
    assert held.label == DRAIN_TIMEOUT and held.level == logging.ERROR and held.jobs == ReturnAll()
    killed = settle(end(code=-signal.SIGKILL, kill_reason=DRAIN_TIMEOUT, retiring=DRAIN))
    assert killed.label == DRAIN_TIMEOUT and killed.level == logging.ERROR


def test_a_lease_lost_kill_fails_nothing_and_gives_back_the_rest_of_the_batch() -> None:
    s = settle(end(code=-signal.SIGKILL, kill_reason=LEASE_LOST, job=JOB))
    assert s.jobs == SettleHeld(None, "")
    assert s.label == LEASE_LOST


def test_a_crash_in_a_job_fails_that_job() -> None:
    s = settle(end(code=-signal.SIGSEGV, job=JOB))
    assert s.jobs == SettleHeld(JOB.id, "worker died: SIGSEGV")
    assert (s.label, s.exit, s.level) == ("crash", "signal=SIGSEGV", logging.ERROR)
    assert not s.outside_job  # inside a job: the job's business, no backoff


def test_a_death_while_writing_an_outcome_charges_that_job_only() -> None:
    written = uuid.uuid4()
    s = settle(end(code=7, settling=written))
    assert s.jobs == SettleHeld(
        written, "worker exited with status 7 while writing this job's outcome"
    )
    assert not s.outside_job  # a job's business: not the crash streak's
    # An async child with siblings in flight: they go back, not as suspects.
    s = settle(end(code=-signal.SIGSEGV, kind=ASYNC, jobs=(JOB, JOB), settling=written))
    assert s.jobs == SettleHeld(
        written,
        "worker died: SIGSEGV while writing this job's outcome",
        (),
        f"sibling_of={written}",
    )
    # A job on the board is the one that ran when it died: the mark does not override it.
    s = settle(end(code=-signal.SIGSEGV, job=JOB, settling=written))
    assert s.jobs == SettleHeld(JOB.id, "worker died: SIGSEGV")


def test_a_non_zero_exit_outside_a_job_counts_in_the_streak() -> None:
    s = settle(end(code=1))
    assert s.jobs == SettleHeld(None, "worker exited with status 1")
    assert (s.label, s.exit) == ("crash", "exit_status=1")
    assert s.outside_job


def test_a_clean_exit_settles_nothing() -> None:
    s = settle(end(code=0))
    assert s.jobs is None and s.label == "exit" and s.level == logging.INFO
    assert not s.outside_job  # it had said ready
    assert settle(end(code=0, ready=False)).outside_job  # gone before it was ready


@pytest.mark.parametrize("why", [DRAIN, SCALE_DOWN, RELOAD, MAX_JOBS, MAX_MEMORY])
def test_a_child_asked_to_stop_is_no_crash(why: Any) -> None:
    for code in (0, -signal.SIGTERM):
        s = settle(end(code=code, retiring=why, ready=False))
        assert s.label == why and not s.outside_job
    # SIGTERM is still a death by signal for its jobs (it had none running here).
    assert settle(end(code=-signal.SIGTERM, retiring=why)).jobs == SettleHeld(
        None, "worker died: SIGTERM"
    )
    assert settle(end(code=1, retiring=why)).outside_job  # it crashed instead


def test_deaths_while_draining_neither_count_restarts_nor_a_streak() -> None:
    s = settle(end(code=1, stopping=True))
    assert not s.count_restart and not s.outside_job
    assert s.jobs == SettleHeld(None, "worker exited with status 1")


def test_the_kill_reason_wins_the_label_over_the_stop_reason() -> None:
    s = settle(end(code=-signal.SIGKILL, kill_reason=DRAIN_TIMEOUT, retiring=DRAIN))
    assert s.label == DRAIN_TIMEOUT


def test_retire_reasons_in_both_spellings_come_out_in_todays() -> None:
    assert retire_reason("max_jobs") == retire_reason("max-jobs") == MAX_JOBS
    assert retire_reason("max_memory") == retire_reason("max-memory") == MAX_MEMORY
    assert retire_reason("bored") is None


def test_a_death_outside_a_job_is_about_its_generation() -> None:
    assert outside_job(EXIT_BOOT_ERROR, 1, 2, None) == "stale"  # a generation given up
    assert outside_job(EXIT_APP_LOAD_ERROR, 2, 2, 1) == "reload_failed"
    assert outside_job(EXIT_APP_LOAD_ERROR, 0, 0, None) == "streak"  # at start: fatal
    assert outside_job(EXIT_BOOT_ERROR, 2, 2, 1) == "streak"
    streak = CrashStreak()
    streak.died(0.0)
    assert storm_verdict(EXIT_BOOT_ERROR, streak) is None
    assert storm_verdict(EXIT_APP_LOAD_ERROR, streak) == "children cannot load the application"


def running(n: int, started: float = 100.0, hard: float = 300.0, soft: float = 60.0) -> Running:
    return Running(uuid.UUID(int=n), f"t{n}", 1, started, hard, soft)


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
    summary = "killed: the event loop was blocked by this job (ran 10.0s without yielding)"
    assert s.jobs == SettleHeld(
        culprit,
        summary + "; x",
        because=f"sibling_of={culprit}",
        kind="killed",
        summary=summary,
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
