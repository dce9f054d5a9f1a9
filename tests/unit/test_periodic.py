"""Periodic jobs without a database (brooq.declare.periodic): ticks, the catch-up rule, DST,
validation."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest

import brooq
from brooq.declare.periodic import (
    build_job,
    build_schedule,
    due_tick,
    next_tick,
    previous_tick,
    tick_key,
)

UTC = timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")
JOB = brooq.Job("t.x")


def at(*args: int, tz: Any = UTC) -> datetime:
    return datetime(*args, tzinfo=tz)  # type: ignore[misc]


def sched(**kw: Any) -> Any:
    kw.setdefault("job", JOB)
    return build_schedule(kw.pop("name", "s"), **kw)


# -- ticks -------------------------------------------------------------------------------


def test_every_ticks_are_multiples_of_the_period_from_the_epoch() -> None:
    s = sched(every="30s")
    now = at(2026, 12, 1, 12, 0, 47)
    assert previous_tick(s, now) == at(2026, 12, 1, 12, 0, 30)
    assert next_tick(s, now) == at(2026, 12, 1, 12, 1, 0)
    assert previous_tick(s, at(2026, 12, 1, 12, 1, 0)) == at(2026, 12, 1, 12, 1, 0)
    # 7s does not divide a minute: the epoch decides, whatever the master's start time.
    s7 = sched(every="7s")
    t = previous_tick(s7, now)
    assert int(t.timestamp()) % 7 == 0 and now - t < timedelta(seconds=7)
    # The same instant given in another zone gives the same tick.
    assert previous_tick(s, now.astimezone(BERLIN)) == previous_tick(s, now)


def test_cron_ticks_are_whole_minutes_in_the_time_zone() -> None:
    s = sched(cron="0 3 * * *", tz="Europe/Berlin")
    now = at(2026, 12, 1, 12, 0)  # 13:00 in Berlin (CET, +1)
    assert previous_tick(s, now) == at(2026, 12, 1, 2, 0)  # 03:00 Berlin
    assert next_tick(s, now) == at(2026, 12, 2, 2, 0)
    summer = at(2026, 7, 1, 12, 0)  # CEST, +2
    assert previous_tick(s, summer) == at(2026, 7, 1, 1, 0)
    every_minute = sched(cron="* * * * *")
    assert previous_tick(every_minute, at(2026, 12, 1, 12, 0, 59)) == at(2026, 12, 1, 12, 0)


@pytest.mark.parametrize(
    ("alias", "prev", "nxt"),
    [
        ("@hourly", at(2026, 12, 1, 12), at(2026, 12, 1, 13)),
        ("@daily", at(2026, 12, 1), at(2026, 12, 2)),
        ("@weekly", at(2026, 11, 29), at(2026, 12, 6)),  # Sundays
        ("@monthly", at(2026, 12, 1), at(2027, 1, 1)),
        ("@yearly", at(2026, 1, 1), at(2027, 1, 1)),
    ],
)
def test_aliases(alias: str, prev: datetime, nxt: datetime) -> None:
    s = sched(cron=alias)
    now = at(2026, 12, 1, 12, 30)
    assert (previous_tick(s, now), next_tick(s, now)) == (prev, nxt)


def test_key_is_the_tick_in_utc_whole_seconds() -> None:
    s = sched(name="nightly-report", cron="0 3 * * *", tz="Europe/Berlin")
    tick = previous_tick(s, at(2026, 12, 1, 12))
    assert tick_key(s, tick) == "periodic:nightly-report:2026-12-01T02:00:00Z"
    assert tick_key(s, tick.astimezone(BERLIN)) == tick_key(s, tick)


# -- the catch-up rule ----------------------------------------------------------------------


def test_due_only_while_younger_than_one_period() -> None:
    s = sched(every="10s")
    assert due_tick(s, at(2026, 12, 1, 12, 0, 0)) == at(2026, 12, 1, 12, 0, 0)
    assert due_tick(s, at(2026, 12, 1, 12, 0, 9, 999999)) == at(2026, 12, 1, 12, 0, 0)
    # every= ticks are back to back: a tick is always due, the most recent one.
    assert due_tick(s, at(2026, 12, 1, 12, 0, 10)) == at(2026, 12, 1, 12, 0, 10)


def test_after_downtime_only_the_most_recent_tick() -> None:
    """A master down from 00:00 to 05:30 with an hourly schedule: only 05:00 is due, and
    the ticks between are never offered (each later pass sees 05:00, then 06:00)."""
    s = sched(cron="@hourly")
    seen = set()
    now = at(2026, 12, 1, 5, 30)
    while now < at(2026, 12, 1, 6, 30):
        tick = due_tick(s, now)
        assert tick is not None
        seen.add(tick)
        now += timedelta(seconds=1)
    assert seen == {at(2026, 12, 1, 5), at(2026, 12, 1, 6)}


def test_a_tick_older_than_its_period_is_not_due() -> None:
    """'0 3 * * 1-5' on a Saturday: the most recent tick is Friday's, and its period (the
    interval to Monday's) is 3 days: due until Monday. Friday 03:00 + 3 days < Monday:
    the interval from that tick to the next is what counts, not a fixed 24 h."""
    s = sched(cron="0 3 * * 1-5")
    saturday = at(2026, 12, 5, 12)
    assert due_tick(s, saturday) == at(2026, 12, 4, 3)
    # A schedule with gaps between its ticks: the window is the gap after the tick.
    s2 = sched(cron="0 3 1 * *")  # monthly: due for the whole month
    assert due_tick(s2, at(2026, 12, 31, 23, 59)) == at(2026, 12, 1, 3)


def test_the_most_recent_tick_is_always_younger_than_its_period() -> None:
    """With one period being the interval from the tick to the next, the most recent tick
    is always younger than that (the next would be the most recent otherwise), so
    due_tick is None only for a now before the first tick ever (every=): defensive."""
    s = sched(every="1s")
    assert due_tick(s, at(2026, 12, 1)) == at(2026, 12, 1)


# -- DST: Europe/Berlin, 30 2 * * * -------------------------------------------------------


def ticks_on(s: Any, day: datetime) -> list[datetime]:
    """The ticks offered by due_tick for one local day, scanned each 30 s."""
    out: list[datetime] = []
    now = day
    end = day + timedelta(days=1)
    while now < end:
        tick = due_tick(s, now)
        if tick is not None and tick.astimezone(BERLIN).date() == day.date() and tick not in out:
            out.append(tick)
        now += timedelta(seconds=30)
    return out


def test_spring_forward_runs_once_at_three() -> None:
    """2026-03-29: 02:00 CET jumps to 03:00 CEST, 02:30 does not exist. cronsim (like
    Debian cron) runs the job once, at the first minute after the gap: 03:00 CEST."""
    s = sched(cron="30 2 * * *", tz="Europe/Berlin")
    day = at(2026, 3, 29, 0, 0, tz=BERLIN).astimezone(UTC)
    ticks = ticks_on(s, day.astimezone(BERLIN))
    assert ticks == [at(2026, 3, 29, 1, 0)]  # 03:00 CEST
    assert ticks[0].astimezone(BERLIN).strftime("%H:%M %Z") == "03:00 CEST"
    assert tick_key(s, ticks[0]) == "periodic:s:2026-03-29T01:00:00Z"
    # The next day is back to 02:30.
    assert next_tick(s, ticks[0]) == at(2026, 3, 30, 0, 30)


def test_fall_back_runs_once_at_the_first_half_past_two() -> None:
    """2026-10-25: 03:00 CEST falls back to 02:00 CET, 02:30 happens twice. The job runs
    once, at the first 02:30 (CEST, 00:30 UTC); the second (CET, 01:30 UTC) is skipped."""
    s = sched(cron="30 2 * * *", tz="Europe/Berlin")
    day = at(2026, 10, 25, 0, 0, tz=BERLIN)
    ticks = ticks_on(s, day)
    assert ticks == [at(2026, 10, 25, 0, 30)]
    assert ticks[0].astimezone(BERLIN).strftime("%H:%M %Z") == "02:30 CEST"
    # During the second 02:30 (CET) the due tick is still the first one: no second job.
    assert due_tick(s, at(2026, 10, 25, 1, 30)) == at(2026, 10, 25, 0, 30)
    assert next_tick(s, ticks[0]) == at(2026, 10, 26, 1, 30)  # 02:30 CET


def test_hourly_on_fall_back_runs_every_real_hour() -> None:
    """@hourly in Europe/Berlin on the fall-back day: both 02:00 (CEST and CET) are
    distinct instants, so both run; the key is UTC, so they never collide."""
    s = sched(cron="@hourly", tz="Europe/Berlin")
    t = at(2026, 10, 24, 23, 0)
    ticks = []
    for _ in range(4):
        ticks.append(t)
        t = next_tick(s, t)
    assert [x.hour for x in ticks] == [23, 0, 1, 2]
    assert len({tick_key(s, x) for x in ticks}) == 4


# -- validation -----------------------------------------------------------------------------


def problems_of(**kw: Any) -> list[str]:
    q = brooq.Queue("postgresql://x@localhost/x")
    with pytest.raises(brooq.InvalidSettings) as info:
        q.periodic(kw.pop("name", "s"), **kw)
    return info.value.problems


def test_every_problem_of_one_call_is_listed() -> None:
    problems = problems_of(
        name="Bad Name", cron="61 * * * *", every="500ms", tz="Mars/Olympus", job=JOB
    )
    text = "\n".join(problems)
    assert len(problems) == 5, problems
    assert "name 'Bad Name' does not match" in text
    assert "exactly one of cron= and every=" in text
    assert "'61 * * * *' is invalid" in text
    assert "every must be at least 1s, got 500ms" in text.replace("0.5s", "500ms")
    assert "unknown time zone 'Mars/Olympus'" in text


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"job": JOB}, "exactly one of cron= and every="),
        ({"cron": "* * * *", "job": JOB}, "it needs 5 fields"),
        ({"cron": "0 0 * * * *", "job": JOB}, "it needs 5 fields"),
        ({"cron": "@reboot", "job": JOB}, "'@reboot' is invalid: the aliases are"),
        ({"cron": "0 25 * * *", "job": JOB}, "'0 25 * * *' is invalid"),
        ({"every": "0s", "job": JOB}, "every must be at least 1s"),
        ({"every": "1.5s", "job": JOB}, "every must be whole seconds"),
        ({"every": "soon", "job": JOB}, "every: 'soon' is not a duration"),
        ({"every": "1s", "tz": "../etc/passwd", "job": JOB}, "is not an IANA time zone name"),
        ({"every": "1s", "tz": "Nowhere/City", "job": JOB}, "unknown time zone"),
        ({"every": "1s", "job": "t.x"}, "job must be a brooq.Job or a callable"),
        ({"every": "1s"}, "job must be a brooq.Job or a callable"),
    ],
)
def test_one_problem(kw: dict[str, Any], expected: str) -> None:
    problems = problems_of(**kw)
    assert len(problems) == 1 and expected in problems[0], problems


def test_duplicate_name_and_name_rule() -> None:
    q = brooq.Queue("postgresql://x@localhost/x")
    q.periodic("nightly-report", cron="0 3 * * *", tz="Europe/Berlin", job=JOB)
    with pytest.raises(brooq.InvalidSettings, match="'nightly-report' is already registered"):
        q.periodic("nightly-report", every="1s", job=JOB)
    with pytest.raises(brooq.InvalidSettings, match="name must be a string"):
        q.periodic(3, every="1s", job=JOB)  # type: ignore[arg-type]
    assert list(q.schedules) == ["nightly-report"]


def test_the_issue_examples_register() -> None:
    q = brooq.Queue("postgresql://x@localhost/x")
    q.periodic(
        "nightly-report",
        cron="0 3 * * *",
        tz="Europe/Berlin",
        job=brooq.Job("report.render", {"kind": "nightly"}),
    )
    q.periodic("heartbeat", every="30s", job=brooq.Job("ping"))
    q.periodic(
        "digest", cron="@hourly", job=lambda tick: brooq.Job("digest", {"hour": tick.isoformat()})
    )
    assert [s.describe() for s in q.schedules.values()] == ["0 3 * * *", "every 30s", "@hourly"]


# -- building a tick's job -------------------------------------------------------------------


def test_the_key_replaces_the_jobs_own_and_the_callable_gets_the_tick_in_tz() -> None:
    got: list[datetime] = []

    def make(tick: datetime) -> brooq.Job:
        got.append(tick)
        return brooq.Job("t.x", {"n": 1}, idempotency_key="mine", queue="q", priority=3)

    s = sched(name="d", cron="@hourly", tz="Europe/Berlin", job=make)
    job = build_job(s, at(2026, 12, 1, 12))
    assert job.idempotency_key == "periodic:d:2026-12-01T12:00:00Z"
    assert (job.topic, job.payload, job.queue, job.priority) == ("t.x", {"n": 1}, "q", 3)
    assert got[0] == at(2026, 12, 1, 12) and got[0].tzinfo == BERLIN and got[0].hour == 13
