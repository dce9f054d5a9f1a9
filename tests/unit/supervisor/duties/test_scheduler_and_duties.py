"""The master's duties (brooq.supervisor.duties) with an injected clock: the scheduler's timing,
stats, and renewal (no sleeping, no database).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from brooq.settings import Settings
from brooq.supervisor.duties.reaper import REAP, Reaper
from brooq.supervisor.duties.reconnect import RECONNECT, Reconnect
from brooq.supervisor.duties.renewal import RENEW, Renewal
from brooq.supervisor.duties.retention import RETENTION, Retention
from brooq.supervisor.duties.scheduler import Counts, Scheduler
from brooq.supervisor.duties.sdwatchdog import SD_WATCHDOG, SdWatchdog
from brooq.supervisor.duties.stats import STATS, Stats
from brooq.supervisor.sdnotify import Notifier

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
        self.held = FakeGauge()
        self.dead_tuples = PlainGauge()
        self.xid_age = PlainGauge()


class FakeConns:
    """What Stats reads in the loop: the row of job_table_health (the count itself goes
    off the loop; the real statements and the real OffLoop: tests/process/test_operations.py's
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


def stats_row(queue: str, topic: str, ready: int, age: float = 0.0) -> dict[str, Any]:
    return {
        "queue": queue,
        "topic": topic,
        "ready": ready,
        "processing": 0,
        "retrying": 0,
        "dead": 0,
        "oldest_ready_age": age,
    }


def ready(metrics: FakeMetrics, queue: str, topic: str, state: str = "ready") -> float | None:
    """The brooq_jobs gauge of (queue, topic) for ``state`` (a count's name)."""
    return metrics.jobs.values.get((("queue", queue), ("state", state), ("topic", topic)))


def test_stats_label_the_queue_and_zero_a_label_set_once_it_is_gone() -> None:
    conns, metrics = FakeConns(), FakeMetrics()
    none: Any = None
    duty = Stats(conns, {"mail": "bulk", "idle": "default"}, Settings(), metrics)  # type: ignore[arg-type]
    assert duty.apply([stats_row("bulk", "mail", 3, 2.5), stats_row("other", "mail", 1)]) == {
        "topics": 2
    }
    assert ready(metrics, "bulk", "mail") == 3 and ready(metrics, "other", "mail") == 1
    assert ready(metrics, "default", "idle") == 0  # a handler's topic: zeros, not absent
    assert metrics.oldest_ready.values[(("queue", "bulk"), ("topic", "mail"))] == 2.5
    # Every count but held (a gauge of its own) is a state label, each written.
    states = {dict(key)["state"] for key in metrics.jobs.values}
    assert states == {
        "waiting",
        "scheduled",
        "ready",
        "retrying",
        "parked",
        "on_hold",
        "processing",
        "dead",
    }
    assert ready(metrics, "bulk", "mail", "scheduled") == 0

    duty.apply([stats_row("bulk", "mail", 2)])  # the other queue emptied
    assert ready(metrics, "other", "mail") == 0  # not its last count
    assert metrics.oldest_ready.values[(("queue", "other"), ("topic", "mail"))] == 0
    metrics.jobs.written.clear()
    duty.apply([stats_row("bulk", "mail", 2)])  # written as zero once, then forgotten
    assert {dict(key)["queue"] for key in metrics.jobs.written} == {"bulk", "default"}

    # A topic whose limits hold jobs back: the held gauge, and the oldest ready age of
    # the jobs not held back (a topic waiting its turn is not stuck).
    held = [{"queue": "bulk", "topic": "mail", "held": 2, "oldest_unheld_age": 0.5}]
    duty.apply([stats_row("bulk", "mail", 3, 600.0)], held)
    assert metrics.held.values[(("queue", "bulk"), ("topic", "mail"))] == 2
    assert metrics.oldest_ready.values[(("queue", "bulk"), ("topic", "mail"))] == 0.5
    duty.apply([stats_row("bulk", "mail", 3, 600.0)])  # held no more: the whole age again
    assert metrics.held.values[(("queue", "bulk"), ("topic", "mail"))] == 0
    assert metrics.oldest_ready.values[(("queue", "bulk"), ("topic", "mail"))] == 600.0

    # A handled topic without rows shows as zero in its handler's queue.
    listed = Stats(conns, {"mail": "default"}, Settings(), metrics)  # type: ignore[arg-type]
    listed.apply([])
    assert ready(metrics, "default", "mail") == 0
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


def test_retention_sweeps_the_idle_rate_windows_once_per_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The windows no start needs are deleted on a period's run, not on the passes that
    follow each other while a backlog of old jobs is deleted."""
    from types import SimpleNamespace

    from brooq.supervisor import history, maintenance

    ran: list[str] = []
    q = SimpleNamespace(
        stack_requests_expire="expire", rate_windows_sweep="sweep", events_expire="events"
    )
    conn = SimpleNamespace(execute=lambda statement, *args: ran.append(statement))
    conns: Any = SimpleNamespace(q=q, with_db=lambda what, fn: fn(conn))
    more = [True, False]
    monkeypatch.setattr(maintenance, "delete_expired", lambda *a, **k: ({"t": 1}, more.pop(0)))
    monkeypatch.setattr(history, "prepare", lambda *a, **k: ran.append("prepare") or 0)
    monkeypatch.setattr(history, "drop_expired", lambda *a, **k: ran.append("drop") or [])
    monkeypatch.setattr(history, "expire_default", lambda *a, **k: ran.append("default") or {})
    duty = Retention(conns, Settings(retention_ttl=3600), None)
    duty.run_once(0.0)  # a period's run: behind after it
    assert ran == ["expire", "sweep", "prepare", "drop", "default", "events"]
    assert duty.again_after is not None
    ran.clear()
    duty.run_once(0.01)  # the backlog's next pass: the partitions wait for the next period
    assert ran == ["expire"] and duty.again_after is None


def test_retention_comes_back_soon_while_a_partitions_keys_are_being_released(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pass that leaves keys to release is followed by another KEYS_PAUSE later, which
    goes on releasing (the partitions' other upkeep waits for the next period); a drop
    deferred behind a lock once the keys are released waits for the next period, as
    before (retrying it every 50 ms would queue outcomes behind each attempt)."""
    from types import SimpleNamespace

    from brooq.supervisor import history, maintenance

    ran: list[str] = []
    q = SimpleNamespace(
        stack_requests_expire="expire", rate_windows_sweep="sweep", events_expire="events"
    )
    conn = SimpleNamespace(execute=lambda statement, *args: ran.append(statement))
    conns: Any = SimpleNamespace(q=q, with_db=lambda what, fn: fn(conn))
    monkeypatch.setattr(maintenance, "delete_expired", lambda *a, **k: ({}, False))
    monkeypatch.setattr(history, "prepare", lambda *a, **k: ran.append("prepare") or 0)
    monkeypatch.setattr(history, "expire_default", lambda *a, **k: ran.append("default") or {})
    # Keys left twice, then a drop deferred behind a lock (its keys all released).
    passes: list[bool | None] = [False, False, True]

    def drop_expired(conn: Any, ttl: float, q: Any, releasing: dict[str, Any]) -> list[Any]:
        ran.append("drop")
        done = passes.pop(0)
        releasing.clear()
        if done is not None:
            releasing["part_a"] = history.Releasing(done=done)
        return []

    monkeypatch.setattr(history, "drop_expired", drop_expired)
    duty = Retention(conns, Settings(retention_ttl=3600), None)
    duty.run_once(0.0)
    assert ran == ["expire", "sweep", "prepare", "drop", "default", "events"]
    assert duty.again_after == history.KEYS_PAUSE
    ran.clear()
    duty.run_once(0.05)
    assert ran == ["expire", "drop"] and duty.again_after == history.KEYS_PAUSE
    ran.clear()
    duty.run_once(0.1)
    assert ran == ["expire", "drop"] and duty.again_after is None


def test_retention_says_how_many_rows_of_the_default_partition_it_deleted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from collections import Counter
    from types import SimpleNamespace

    from brooq.supervisor import history, maintenance

    q = SimpleNamespace(
        stack_requests_expire="expire", rate_windows_sweep="sweep", events_expire="events"
    )
    conn = SimpleNamespace(execute=lambda statement, *args: None)
    conns: Any = SimpleNamespace(q=q, with_db=lambda what, fn: fn(conn))
    monkeypatch.setattr(maintenance, "delete_expired", lambda *a, **k: ({}, False))
    monkeypatch.setattr(history, "prepare", lambda *a, **k: 0)
    monkeypatch.setattr(history, "drop_expired", lambda *a, **k: [])
    monkeypatch.setattr(history, "expire_default", lambda *a, **k: Counter({"a": 2, "b": 1}))
    with caplog.at_level("INFO", logger="brooq.master"):
        Retention(conns, Settings(retention_ttl=3600), None).run_once(0.0)
    assert "event=history_default_expired count=3" in caplog.messages
