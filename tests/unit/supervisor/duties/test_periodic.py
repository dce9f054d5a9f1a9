"""The master's Periodic duty (brooq.supervisor.duties) with an injected clock: each tick claimed
once, none while draining, a failing callable or a refused statement skipped, a clock ahead
told.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import brooq
from brooq.declare.periodic import (
    build_schedule,
)
from brooq.settings import load as load_settings
from brooq.supervisor.duties.periodic import CLOCK_AHEAD_LOG_EVERY, ClockAhead, Periodic

UTC = timezone.utc
JOB = brooq.Job("t.x")


def at(*args: int, tz: Any = UTC) -> datetime:
    return datetime(*args, tzinfo=tz)  # type: ignore[misc]


def sched(**kw: Any) -> Any:
    kw.setdefault("job", JOB)
    return build_schedule(kw.pop("name", "s"), **kw)


# -- the duty, with an injected clock --------------------------------------------------------


class FakeConns:
    """with_db answers from a script: a uuid (this master won), False (lost), None (down)."""

    def __init__(self) -> None:
        self.answer: Any = None
        self.calls: list[str] = []
        self.stored: Any = []  # brooq_schedule's rows (StoredSchedule), or None: down
        self.connected = False

    def with_db(self, what: str, fn: Any) -> Any:
        if what == "stored schedules":
            return self.stored
        self.calls.append(what)
        return self.answer() if callable(self.answer) else self.answer


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def duty(schedules: dict[str, Any], clock: Clock) -> tuple[Periodic, FakeConns]:
    conns = FakeConns()
    d = Periodic(conns, schedules, {}, load_settings(), None, clock=clock)  # type: ignore[arg-type]
    return d, conns


def test_duty_claims_each_tick_once_and_retries_when_the_database_is_away() -> None:
    clock = Clock(at(2026, 12, 1, 12, 0, 0, 100000))
    s = sched(name="hb", every="2s")
    d, conns = duty({"hb": s}, clock)
    conns.answer = None  # database away
    assert d.run_once(0) == {"enqueued": 0, "lost": 0, "failed": 0}
    assert d.pending(clock()) == [(s, at(2026, 12, 1, 12))]  # still due
    conns.answer = uuid.uuid4
    assert d.run_once(1)["enqueued"] == 1
    clock.now += timedelta(seconds=1)  # same tick: not tried again
    assert d.run_once(2) == {"enqueued": 0, "lost": 0, "failed": 0}
    assert conns.calls == ["periodic", "periodic"]
    clock.now += timedelta(seconds=1)  # the next tick
    conns.answer = False  # another master won it
    assert d.run_once(3)["lost"] == 1
    clock.now += timedelta(milliseconds=500)
    assert d.run_once(4)["lost"] == 0 and len(conns.calls) == 3


def test_a_draining_master_enqueues_no_more_ticks() -> None:
    clock = Clock(at(2026, 12, 1, 12, 0, 0, 100000))
    draining = [False]
    conns = FakeConns()
    conns.answer = uuid.uuid4
    d = Periodic(
        conns,  # type: ignore[arg-type]
        {"hb": sched(name="hb", every="1s")},
        {},
        load_settings(),
        None,
        clock=clock,
        draining=lambda: draining[0],
    )
    assert d.run_once(0)["enqueued"] == 1
    draining[0] = True
    clock.now += timedelta(seconds=1)
    assert d.run_once(1) == {"enqueued": 0, "lost": 0, "failed": 0}
    assert conns.calls == ["periodic"]


def test_duty_after_downtime_claims_only_the_most_recent_tick() -> None:
    clock = Clock(at(2026, 12, 1, 12))
    d, conns = duty({"hb": sched(name="hb", every="2s")}, clock)
    conns.answer = uuid.uuid4
    assert d.run_once(0)["enqueued"] == 1
    clock.now += timedelta(seconds=5.5)  # 12:00:00 -> 12:00:05.5: 02 and 04 were missed
    assert [t for _, t in d.pending(clock())] == [at(2026, 12, 1, 12, 0, 4)]
    assert d.run_once(1)["enqueued"] == 1
    assert d.pending(clock()) == []


def test_a_failing_callable_is_logged_skipped_and_does_not_stop_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def boom(tick: datetime) -> brooq.Job:
        raise RuntimeError("boom")

    clock = Clock(at(2026, 12, 1, 12))
    schedules = {
        "a-raises": sched(name="a-raises", every="1s", job=boom),
        "b-wrong": sched(name="b-wrong", every="1s", job=lambda t: "nope"),
        "c-fine": sched(name="c-fine", every="1s"),
    }
    d, conns = duty(schedules, clock)
    conns.answer = uuid.uuid4
    with caplog.at_level(logging.ERROR, logger="brooq.master"):
        assert d.run_once(0) == {"enqueued": 1, "lost": 0, "failed": 2}
    assert conns.calls == ["periodic"]  # the failing ones never claimed their tick
    text = caplog.text
    assert "event=periodic_failed name=a-raises" in text and "RuntimeError: boom" in text
    assert "event=periodic_failed name=b-wrong" in text and "returned a str" in text
    assert d.run_once(1)["failed"] == 0  # once per tick, not every pass
    clock.now += timedelta(seconds=1)
    assert d.run_once(2) == {"enqueued": 1, "lost": 0, "failed": 2}


def test_a_refused_statement_skips_that_tick_and_goes_on_with_the_others() -> None:
    """with_db answers None with the connection still up (a statement refused, logged
    there): that schedule's tick is skipped, the next schedules are still tried."""
    clock = Clock(at(2026, 12, 1, 12))
    d, conns = duty({n: sched(name=n, every="1s") for n in ("a", "b")}, clock)
    conns.connected = True
    assert d.run_once(0) == {"enqueued": 0, "lost": 0, "failed": 2}
    assert conns.calls == ["periodic", "periodic"]
    assert d.pending(clock()) == []


def test_a_master_ahead_of_the_database_is_told_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The database refused this master's ticks as being from the future: each refused
    tick counts as failed and is not tried again; the warning names the skew, once per
    CLOCK_AHEAD_LOG_EVERY seconds of the loop's clock."""
    clock = Clock(at(2026, 12, 1, 12))
    d, conns = duty({"hb": sched(name="hb", every="1s")}, clock)
    conns.answer = lambda: ClockAhead(3600.25)
    with caplog.at_level(logging.INFO, logger="brooq.master"):
        assert d.run_once(0) == {"enqueued": 0, "lost": 0, "failed": 1}
        assert d.run_once(0.5) == {"enqueued": 0, "lost": 0, "failed": 0}  # same tick
        for n in range(1, 5):
            clock.now += timedelta(seconds=1)
            assert d.run_once(n)["failed"] == 1
        assert caplog.text.count("event=periodic_clock_ahead") == 1
        clock.now += timedelta(seconds=1)
        d.run_once(CLOCK_AHEAD_LOG_EVERY + 1)
        assert caplog.text.count("event=periodic_clock_ahead") == 2
    warnings = [r for r in caplog.records if "periodic_clock_ahead" in r.getMessage()]
    assert {r.levelno for r in warnings} == {logging.WARNING}
    message = warnings[0].getMessage()
    assert "skew=3600.2s" in message and "ahead of the database" in message


# -- schedules stored in the database ---------------------------------------------------------


def stored(name: str, **kw: Any) -> Any:
    from brooq.operator.schedules import StoredSchedule

    fields: dict[str, Any] = {
        "cron": None,
        "every": 2,
        "tz": "UTC",
        "topic": "t.x",
        "payload": {"n": 1},
        "queue": None,
        "priority": 0,
        "backfill": 0,
        "paused": False,
        "updated_at": at(2026, 12, 1),
    }
    fields.update(kw)
    return StoredSchedule(name=name, **fields)


def test_a_stored_schedule_runs_beside_the_declared_ones_and_a_paused_one_does_not() -> None:
    clock = Clock(at(2026, 12, 1, 12, 0, 0, 100000))
    d, conns = duty({"code": sched(name="code", every="2s")}, clock)
    conns.stored = [stored("db"), stored("off", paused=True)]
    conns.answer = uuid.uuid4
    assert d.run_once(0)["enqueued"] == 2  # code's tick and db's, not off's
    assert sorted(d.running()) == ["code", "db"]
    conns.stored = [stored("db", paused=True)]  # paused meanwhile
    clock.now += timedelta(seconds=2)
    assert d.run_once(1)["enqueued"] == 1 and sorted(d.running()) == ["code"]
    conns.stored = None  # the database away: the last reading stays
    assert sorted(d.running()) == ["code"]


def test_a_stored_schedule_backfills_what_it_missed_up_to_its_bound() -> None:
    clock = Clock(at(2026, 12, 1, 12, 0, 11))
    d, conns = duty({}, clock)
    # Its last tick claimed at 12:00:00; masters down until 12:00:11: ticks 02 to 10.
    conns.stored = [stored("db", backfill=3, last_tick=at(2026, 12, 1, 12))]
    conns.answer = uuid.uuid4
    d.refresh()
    ticks = [t for _, t in d.pending(clock(), {"db": at(2026, 12, 1, 12)})]
    assert ticks == [at(2026, 12, 1, 12, 0, s) for s in (4, 6, 8, 10)]  # 3 missed + due
    assert d.run_once(0)["enqueued"] == 4


def test_a_declared_schedule_keeps_its_name_over_a_stored_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock(at(2026, 12, 1, 12, 0, 0, 100000))
    code = sched(name="same", every="2s")
    d, conns = duty({"same": code}, clock)
    conns.stored = [stored("same", every=60), stored("broken", cron="61 * * * *", every=None)]
    with caplog.at_level(logging.WARNING, logger="brooq.master"):
        d.refresh()
        d.refresh()  # said once per version of the row
    assert d.running() == {"same": code}
    assert caplog.text.count("event=periodic_shadowed name=same") == 1
    assert caplog.text.count("event=periodic_refused name=broken") == 1
