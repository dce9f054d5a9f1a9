"""The master's pure parts, without a database or a process: how a child's end settles its
jobs, the scheduler's timing with an injected clock, the watchdog's decisions."""

from __future__ import annotations

import logging
import signal
import uuid
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
    MAX_EXECUTION_TIMEOUT,
    MAX_JOBS,
    MAX_MEMORY,
    RELOAD,
    SCALE_DOWN,
    STALLED,
)
from brooq.settings import Settings
from brooq.supervisor.duties import (
    REAP,
    RECONNECT,
    RENEW,
    RETENTION,
    SD_WATCHDOG,
    STATS,
    Counts,
    Reaper,
    Reconnect,
    Renewal,
    Retention,
    Scheduler,
    SdWatchdog,
    Stats,
)
from brooq.supervisor.respawn import CrashStreak
from brooq.supervisor.sdnotify import Notifier
from brooq.supervisor.settlement import (
    ChildEnd,
    ReturnAll,
    SettleHeld,
    outside_job,
    retire_reason,
    settle,
    storm_verdict,
)
from brooq.supervisor.watchdog import STACK_GRACE, BusyChild, Decision, decide

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


def test_a_hard_timeout_kill_fails_the_running_job_with_the_limit_and_the_stack() -> None:
    s = settle(
        end(code=-signal.SIGKILL, kill_reason=MAX_EXECUTION_TIMEOUT, job=JOB, kill_detail="; st")
    )
    assert s.jobs == SettleHeld(JOB.id, "killed: max_execution_timeout 5s exceeded (ran 10.0s); st")
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


# -- the scheduler: timing with an injected clock ---------------------------------------------


def schedule(settings: Settings, watchdog_usec: str | None, monkeypatch: Any) -> Scheduler:
    """The master's duties in the master's order; their dependencies are never touched
    because nothing is run."""
    if watchdog_usec is None:
        monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    else:
        monkeypatch.setenv("WATCHDOG_USEC", watchdog_usec)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    notifier = Notifier()
    none: Any = None
    duties: list[Any] = [SdWatchdog(notifier)] if notifier.watchdog_period else []
    duties += [
        Reconnect(none, none),
        Renewal(none, none, settings, None),
        Reaper(none, settings, None),
        Stats(none, {}, settings, None),
        Retention(none, settings, None),
    ]
    return Scheduler(duties, now=1000.0)


def due_at(scheduler: Scheduler, now: float) -> list[str]:
    return [d.name for d in scheduler.due(now)]


def test_every_duty_keeps_its_period_and_first_run(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Settings(lease=6.0, stats_period=5.0, retention_period=3.0)  # reaper max(5, 6/4)
    sched = schedule(s, "4000000", monkeypatch)  # WatchdogSec=4s: a ping every 2 s
    assert due_at(sched, 1000.0) == [SD_WATCHDOG, RECONNECT, STATS]  # at once
    assert due_at(sched, 1000.5) == [RECONNECT]  # every pass, on no timer
    assert due_at(sched, 1001.0) == [RECONNECT, REAP]  # the first reap after 1 s
    assert due_at(sched, 1002.0) == [SD_WATCHDOG, RECONNECT, RENEW]  # lease/3
    assert due_at(sched, 1002.9) == [RECONNECT]
    assert due_at(sched, 1003.0) == [RECONNECT, RETENTION]  # min(5 s, its 3 s period)
    assert due_at(sched, 1004.0) == [SD_WATCHDOG, RECONNECT, RENEW]
    assert due_at(sched, 1005.0) == [RECONNECT, STATS]
    assert due_at(sched, 1006.0) == [SD_WATCHDOG, RECONNECT, RENEW, REAP, RETENTION]
    assert sched.next_at() == 1008.0  # the next ping and renewal


def test_a_late_pass_reschedules_from_when_it_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Settings(lease=30.0, stats_period=100.0, reaper_period=100.0)
    sched = schedule(s, None, monkeypatch)
    assert due_at(sched, 1000.0) == [RECONNECT, STATS]  # no WATCHDOG_USEC: no ping
    assert due_at(sched, 1025.0) == [RECONNECT, RENEW, REAP, RETENTION]
    assert due_at(sched, 1034.9) == [RECONNECT]
    assert due_at(sched, 1035.0) == [RECONNECT, RENEW]  # 10 s after 1025, not 1010


def test_retention_starts_after_at_most_five_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    sched = schedule(Settings(), None, monkeypatch)  # retention every 60 s
    assert RETENTION not in due_at(sched, 1004.9)
    assert RETENTION in due_at(sched, 1005.0)
    assert RETENTION not in due_at(sched, 1064.9)
    assert RETENTION in due_at(sched, 1065.0)


def test_a_reconnection_makes_renewal_due_in_the_same_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scheduler is lazy: a duty made due at once by an earlier duty of the pass (the
    reconnection, as Connections calls back) runs in that pass, before the reaper."""
    sched = schedule(Settings(lease=30.0), None, monkeypatch)
    due_at(sched, 1000.0)
    ran = []
    for duty in sched.due(1001.0):
        ran.append(duty.name)
        if duty.name == RECONNECT:
            sched.due_now(RENEW)
    assert ran == [RECONNECT, RENEW, REAP]
    assert sched.next_at() == 1005.0  # stats and the first retention; renewal at 1011
    assert due_at(sched, 1011.0) == [RECONNECT, RENEW, REAP, STATS, RETENTION]


def test_a_scheduler_of_plain_duties() -> None:
    class Tick:
        name = "tick"
        period = 2.0
        first_after = 0.5
        runs = 0

        def run_once(self, now: float) -> Counts:
            self.runs += 1
            return {"ticks": 1}

    tick = Tick()
    sched = Scheduler([tick], now=0.0)
    assert sched.next_at() == 0.5
    for now in (0.0, 0.4, 0.5, 1.0, 2.4, 2.5, 4.5):
        for duty in sched.due(now):
            assert duty.run_once(now) == {"ticks": 1}
    assert tick.runs == 3  # at 0.5, 2.5, 4.5
    assert sched.next_at() == 6.5
    assert Scheduler([], now=0.0).next_at() == float("inf")


def test_a_duty_that_left_work_runs_again_soon_not_a_period_later() -> None:
    """Retention behind a backlog: each pass is short (the loop's other work goes on
    between them) and the next one comes again_after seconds later; once it caught up it
    is back on its period."""

    class Backlog:
        name = "backlog"
        period = 60.0
        first_after = 0.0
        again_after: float | None = None

        def __init__(self) -> None:
            self.left, self.runs = 3, 0

        def run_once(self, now: float) -> Counts:
            self.runs += 1
            self.left -= 1
            self.again_after = 0.01 if self.left else None
            return {}

    def run_due(now: float) -> list[str]:
        return [d.name for d in sched.due(now) if d.run_once(now) is not None]

    duty = Backlog()
    sched = Scheduler([duty], now=0.0)
    assert run_due(0.0) == ["backlog"]
    assert sched.next_at() == 0.01
    assert run_due(0.005) == []
    assert run_due(0.02) == ["backlog"]
    assert run_due(0.03) == ["backlog"]  # the last of the backlog
    assert duty.left == 0
    assert sched.next_at() == 60.03  # caught up: a period later
    assert run_due(1.0) == []


# -- the job-count gauges --------------------------------------------------------------------


class FakeGauge:
    def __init__(self) -> None:
        self.values: dict[tuple[tuple[str, str], ...], float] = {}
        self.written: list[tuple[tuple[str, str], ...]] = []

    def labels(self, **labels: str) -> Any:
        key = tuple(sorted(labels.items()))
        gauge = self

        class Child:
            def set(self, value: float) -> None:
                gauge.values[key] = value
                gauge.written.append(key)

        return Child()


class PlainGauge:
    value: float | None = None

    def set(self, value: float) -> None:
        self.value = value


class FakeMetrics:
    def __init__(self) -> None:
        self.jobs = FakeGauge()
        self.oldest_ready = FakeGauge()
        self.dead_tuples = PlainGauge()
        self.xid_age = PlainGauge()


class FakeConns:
    """What Stats reads in the loop: the row of job_table_health (the count itself goes
    off the loop; the real statements and the real OffLoop: tests/test_operations.py's
    master and test_stats_count_never_holds_the_loop there)."""

    q = type("Q", (), {"job_table_health": "health", "job_stats_by_topic": "count"})()

    def __init__(self) -> None:
        self.health = (0.0, 0.0)

    def with_db(self, what: str, fn: Any) -> tuple[float, float]:
        return self.health


class FakeLine:
    """An OffLoop that sends nothing: records what the duty asked."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.busy = False

    def overdue(self, limit: float) -> bool:
        return False

    def send(self, statement: str) -> bool:
        self.sent.append(statement)
        return True


def stats_row(queue: str, topic: str, pending: int, age: float = 0.0) -> dict[str, Any]:
    return {
        "queue": queue,
        "topic": topic,
        "pending": pending,
        "processing": 0,
        "failed": 0,
        "dead": 0,
        "oldest_ready_age": age,
    }


def pending(metrics: FakeMetrics, queue: str, topic: str) -> float | None:
    return metrics.jobs.values.get((("queue", queue), ("state", "pending"), ("topic", topic)))


def test_stats_label_the_queue_and_zero_a_label_set_once_it_is_gone() -> None:
    conns, metrics = FakeConns(), FakeMetrics()
    none: Any = None
    duty = Stats(conns, {"mail": "bulk", "idle": "default"}, Settings(), metrics)  # type: ignore[arg-type]
    assert duty.apply([stats_row("bulk", "mail", 3, 2.5), stats_row("other", "mail", 1)]) == {
        "topics": 2
    }
    assert pending(metrics, "bulk", "mail") == 3 and pending(metrics, "other", "mail") == 1
    assert pending(metrics, "default", "idle") == 0  # a handler's topic: zeros, not absent
    assert metrics.oldest_ready.values[(("queue", "bulk"), ("topic", "mail"))] == 2.5

    duty.apply([stats_row("bulk", "mail", 2)])  # the other queue emptied
    assert pending(metrics, "other", "mail") == 0  # not its last count
    assert metrics.oldest_ready.values[(("queue", "other"), ("topic", "mail"))] == 0
    metrics.jobs.written.clear()
    duty.apply([stats_row("bulk", "mail", 2)])  # written as zero once, then forgotten
    assert {dict(key)["queue"] for key in metrics.jobs.written} == {"bulk", "default"}

    # A handled topic without rows shows as zero in its handler's queue.
    listed = Stats(conns, {"mail": "default"}, Settings(), metrics)  # type: ignore[arg-type]
    listed.apply([])
    assert pending(metrics, "default", "mail") == 0
    assert Stats(none, {}, Settings(), None, dsn="x").run_once(0.0) == {}  # no metrics


def test_slow_stats_refresh_less_often_and_say_so(caplog: pytest.LogCaptureFixture) -> None:
    """A count that took 1 s (a big backlog) comes back 20 s later, not 5 s: counting
    takes at most a twentieth of its connection's time; a quick one is back on its
    period. The pace is known when the answer arrives, after the Scheduler set the next
    run: a run due on the old period waits for the paced one, and a quick answer after
    a slow period takes effect one period later."""
    conns, metrics = FakeConns(), FakeMetrics()
    duty = Stats(conns, {}, Settings(stats_period=5.0), metrics)  # type: ignore[arg-type]
    duty.line = FakeLine()  # type: ignore[assignment]
    sched = Scheduler([duty], now=0.0)
    assert [d.run_once(0.0) for d in sched.due(0.0)] == [{"sent": 1}]
    with caplog.at_level("WARNING", logger="brooq.master"):
        duty._pace(1.0)  # the answer: 1 s after the send
    assert duty.period == 20.0
    assert "event=stats_slow seconds=1.00" in caplog.text
    line = duty.line
    assert [d.run_once(5.0) for d in sched.due(5.0)] == [{}]  # due on the old period: waits
    assert sched.next_at() == 25.0 and len(line.sent) == 1  # type: ignore[union-attr]
    assert [d.run_once(25.0) for d in sched.due(25.0)] == [{"sent": 1}]
    duty._pace(0.02)  # a quick one: back on its period after the run already set
    assert duty.period == 5.0 and sched.next_at() == 45.0
    assert [d.run_once(45.0) for d in sched.due(45.0)] == [{"sent": 1}]
    assert sched.next_at() == 50.0


def test_stats_send_one_count_at_a_time_and_set_the_health_gauges() -> None:
    conns, metrics = FakeConns(), FakeMetrics()
    duty = Stats(conns, {}, Settings(), metrics)  # type: ignore[arg-type]
    line = duty.line = FakeLine()  # type: ignore[assignment]
    conns.health = (1234.0, 5678.0)
    assert duty.run_once(0.0) == {"sent": 1} and line.sent == ["count"]
    assert (metrics.dead_tuples.value, metrics.xid_age.value) == (1234.0, 5678.0)
    line.busy = True  # the count still in flight: the health is read, nothing sent
    conns.health = (1.0, 2.0)
    assert duty.run_once(5.0) == {} and line.sent == ["count"]
    assert (metrics.dead_tuples.value, metrics.xid_age.value) == (1.0, 2.0)


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


class TableHealth:
    """The maintenance connection's answer to job_table_health: (dead tuples, xid age)."""

    q = type("Q", (), {"job_table_health": "health"})()

    def __init__(self, dead: float = 0.0) -> None:
        self.dead, self.asked = dead, 0

    def with_db(self, what: str, fn: Any) -> tuple[float, float]:
        self.asked += 1
        return (self.dead, 0.0)


def test_vacuum_starts_past_the_threshold_and_never_twice_at_once() -> None:
    """Below the threshold nothing is sent; while one VACUUM is in flight the table is
    not even looked at (the real sending and reading: tests/test_operations.py)."""
    from brooq.supervisor import vacuum as vacuum_mod

    health = TableHealth(dead=99_999)
    duty = vacuum_mod.Vacuum(health, "dsn", 100_000, 2.0, clock=lambda: 1.0)  # type: ignore[arg-type]
    assert duty.run_once(0.0) == {} and health.asked == 1 and duty.line.conn is None
    health.dead = 10**9
    duty.line.started_at = 0.0  # one in flight
    assert duty.run_once(1.0) == {} and health.asked == 1
    off = vacuum_mod.Vacuum(health, "dsn", 0, 2.0)  # type: ignore[arg-type]
    assert off.run_once(2.0) == {} and health.asked == 1  # 0: left to autovacuum


def test_a_vacuum_without_an_answer_is_given_up_after_an_hour() -> None:
    """A lost server or a cut network must not stop every later vacuum: the statement in
    flight is dropped after GIVE_UP_AFTER, and the duty decides again."""
    from brooq.supervisor import vacuum as vacuum_mod

    now = [0.0]
    duty = vacuum_mod.Vacuum(TableHealth(), "dsn", 100, 2.0, clock=lambda: now[0])  # type: ignore[arg-type]
    duty.line.started_at = 0.0  # a VACUUM sent at 0 and never answered
    now[0] = vacuum_mod.GIVE_UP_AFTER - 1
    duty.run_once(now[0])
    assert duty.line.started_at == 0.0
    now[0] = vacuum_mod.GIVE_UP_AFTER + 1
    duty.run_once(now[0])
    assert duty.line.started_at is None and duty.line.conn is None


def test_lease_lost_notes_belong_to_one_run_of_a_job() -> None:
    """A job canceled, retried and claimed again by the same child is a new run: the
    master's note that the first run's lease was lost must not follow it (the watchdog
    would kill the child for running the new claim), even when the master never read
    the board empty in between."""
    from types import SimpleNamespace

    from brooq.ipc.board import Board
    from brooq.ipc.protocol import LineReader
    from brooq.supervisor.childproc import ChildProc
    from brooq.supervisor.fleet import Fleet

    job = uuid.uuid4()
    board = Board()
    child = ChildProc(1, "c", 0, -1, LineReader(-1), "", 0.0, board=board)
    fleet: Any = SimpleNamespace(children={1: child}, crashes=CrashStreak())
    board.post(job, "t", 1, 10.0, 60.0, 30.0)
    Fleet.read_boards(fleet)
    child.lease_lost[job] = 11.0
    board.post(job, "t", 1, 10.0, 60.0, 30.0)  # the same run: the note stays
    Fleet.read_boards(fleet)
    assert job in child.lease_lost
    board.post(job, "t", 1, 12.0, 60.0, 30.0)  # claimed again: a new run
    Fleet.read_boards(fleet)
    assert child.lease_lost == {}
    board.close()


def test_renewal_does_not_take_an_old_answer_for_a_new_claim_of_the_job() -> None:
    """The renewal statement's answer predates the child's new claim of a job it held
    before (canceled, then retried: the child said it dropped the job, then that it holds
    it again, while the statement ran): no `lost` notice from that answer; the next pass
    decides. A job that stayed held all along (a canceled job still running beside
    siblings that come and go) is told lost at once."""
    import json
    import os
    from types import SimpleNamespace

    from brooq.ipc.protocol import LineReader
    from brooq.supervisor.childproc import ChildProc
    from brooq.supervisor.fleet import Fleet

    job, canceled, sibling = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    for fd in (to_child_r, from_child_r):
        os.set_blocking(fd, False)
    child = ChildProc(1, "c", 0, to_child_w, LineReader(from_child_r), "", 0.0)
    child.held = [job, canceled]
    says: list[list[list[uuid.UUID]]] = []  # what the child says during each statement

    def statement(name: str, fn: Any) -> set[uuid.UUID]:
        for held in says.pop(0):
            os.write(from_child_w, (json.dumps({"held": [str(i) for i in held]}) + "\n").encode())
        return set()  # both missing from the answer

    fleet: Any = SimpleNamespace(children={1: child}, read_boards=lambda: None)
    fleet.read_all = lambda now: Fleet.read_child(fleet, child, now)
    conns: Any = SimpleNamespace(q=None, with_db=statement)
    renewal = Renewal(fleet, conns, Settings(), None)
    try:
        says.append([[canceled, sibling], [job, canceled]])
        assert renewal.run_once(1.0) == {"renewed": 0, "lost": 1}
        assert os.read(to_child_r, 100) == f"lost {canceled}\n".encode()
        says.append([])  # the next pass: the job's new claim is judged by its answer
        assert renewal.run_once(2.0) == {"renewed": 0, "lost": 2}
        told = os.read(to_child_r, 200).decode().split()
        assert told == ["lost", str(job), "lost", str(canceled)]
    finally:
        for fd in (to_child_r, to_child_w, from_child_r, from_child_w):
            os.close(fd)


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
