"""Periodic jobs: ``queue.periodic(name, cron=..., every=..., tz=..., job=...)``.

Owns the Schedule (validated at registration, every problem of one call raised together
as InvalidSettings), the tick arithmetic as pure functions of a clock passed in, the
rule of which tick is due (``due_tick``: the most recent one, only while it is younger
than one period; never a burst after downtime), the idempotency key of a tick, and
building a tick's Job (a callable's failure is an error naming the schedule).

Ticks: ``every=`` ticks are the multiples of the period counted from the Unix epoch, in
UTC, so every master agrees where they fall; ``cron=`` ticks are whole minutes in the
schedule's time zone, computed by cronsim (DST like Debian cron: a time skipped by
spring-forward runs at the first minute after the gap, a time repeated by fall-back
runs once, at its first occurrence).

Must never: touch the database (brooq.supervisor.duties claims the ticks), read the
clock itself (``now`` is always given), or parse a cron expression by hand.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from brooq.durations import format_seconds, to_seconds
from brooq.errors import InvalidJob, InvalidSettings, InvalidTopic
from brooq.job import Job, validate_name

JobSpec = Job | Callable[[datetime], Job]

ALIASES = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
MIN_EVERY = 1
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_TZ_NAME = re.compile(r"[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*")


class PeriodicJobError(Exception):
    """A schedule's callable raised or returned something that is not a brooq.Job."""


@dataclass(frozen=True)
class Schedule:
    name: str
    cron: str | None  # as written (an alias stays an alias)
    every: int | None  # seconds
    tz: str
    zone: ZoneInfo
    job: JobSpec
    # After downtime, how many missed ticks before the due one are enqueued too.
    backfill: int = 0

    @property
    def expression(self) -> str:
        """The cron expression cronsim reads (aliases expanded)."""
        assert self.cron is not None
        return ALIASES.get(self.cron.strip().lower(), self.cron.strip())

    def describe(self) -> str:
        """What `brooq periodic` shows: the cron text, or "every 30s"."""
        if self.cron is not None:
            return self.cron
        assert self.every is not None
        return f"every {format_seconds(self.every)}"


def build_schedule(
    name: object,
    *,
    cron: object = None,
    every: object = None,
    tz: object = "UTC",
    job: object = None,
    taken: object = (),
    backfill: object = 0,
) -> Schedule:
    """A Schedule, or InvalidSettings listing every problem of these arguments
    (``taken``: the names already registered)."""
    problems: list[str] = []
    label = repr(name) if isinstance(name, str) else "?"
    try:
        validate_name(name, "name", InvalidTopic)
    except InvalidJob as exc:
        problems.append(f"periodic {label}: {exc}")
    else:
        if name in taken:  # type: ignore[operator]
            problems.append(f"periodic {label}: a schedule named {label} is already registered")
    every_s: int | None = None
    if (cron is None) == (every is None):
        problems.append(f"periodic {label}: give exactly one of cron= and every=")
    if cron is not None:
        problems += [f"periodic {label}: {p}" for p in cron_problems(cron)]
    if every is not None:
        try:
            seconds = to_seconds(every, allow_bare_number=True)  # type: ignore[arg-type]
        except ValueError as exc:
            problems.append(f"periodic {label}: every: {exc}")
        else:
            if seconds < MIN_EVERY:
                problems.append(
                    f"periodic {label}: every must be at least 1s, got {format_seconds(seconds)}"
                )
            elif seconds != int(seconds):
                problems.append(f"periodic {label}: every must be whole seconds, got {seconds:g}s")
            else:
                every_s = int(seconds)
    zone: ZoneInfo | None = None
    if not isinstance(tz, str) or not _TZ_NAME.fullmatch(tz):
        problems.append(f"periodic {label}: tz {tz!r} is not an IANA time zone name")
    else:
        try:
            zone = ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            problems.append(f"periodic {label}: unknown time zone {tz!r}")
    if isinstance(backfill, bool) or not isinstance(backfill, int) or not 0 <= backfill <= 1000:
        problems.append(
            f"periodic {label}: backfill must be a whole number of ticks from 0 to 1000, "
            f"got {backfill!r}"
        )
    if not isinstance(job, Job) and not callable(job):
        problems.append(
            f"periodic {label}: job must be a brooq.Job or a callable taking the tick and "
            f"returning one, not {type(job).__name__}"
        )
    if problems:
        raise InvalidSettings(problems)
    assert isinstance(name, str) and isinstance(tz, str) and zone is not None
    return Schedule(
        name=name,
        cron=cron if isinstance(cron, str) else None,
        every=every_s,
        tz=tz,
        zone=zone,
        job=job,  # type: ignore[arg-type]
        backfill=backfill,  # type: ignore[arg-type]
    )


def cron_problems(cron: object) -> list[str]:
    """Why ``cron`` is not a 5-field expression or an alias ([] when it is one)."""
    if not isinstance(cron, str):
        return [f"cron must be a string, not {type(cron).__name__}"]
    text = ALIASES.get(cron.strip().lower(), cron.strip())
    if text.startswith("@"):
        return [
            f"cron expression {cron!r} is invalid: the aliases are {', '.join(sorted(ALIASES))}"
        ]
    if len(text.split()) != 5:
        return [
            f"cron expression {cron!r} is invalid: it needs 5 fields (minute hour "
            f"day-of-month month day-of-week), got {len(text.split())}"
        ]
    try:
        CronSim(text, datetime(2000, 1, 1, tzinfo=timezone.utc))
    except CronSimError as exc:
        return [f"cron expression {cron!r} is invalid: {exc}"]
    return []


# -- ticks: pure functions of the ``now`` they are given ---------------------------------------


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ValueError("now must be an aware datetime")
    return moment.astimezone(timezone.utc)


def previous_tick(schedule: Schedule, now: datetime) -> datetime:
    """The most recent tick <= now, in UTC."""
    now = _utc(now)
    if schedule.every is not None:
        seconds = int((now - _EPOCH) // timedelta(seconds=1))
        return _EPOCH + timedelta(seconds=seconds - seconds % schedule.every)
    local = now.astimezone(schedule.zone).replace(second=0, microsecond=0)
    # Forward from a little before: cronsim's forward iteration is the reference for where
    # ticks fall (DST included); the reverse one is only used to find a start point.
    back = next(iter(CronSim(schedule.expression, local, reverse=True)))
    start = back - timedelta(minutes=1)
    best = None
    for tick in CronSim(schedule.expression, start):
        tick_utc = tick.astimezone(timezone.utc)
        if tick_utc > now:
            break
        best = tick_utc
    if best is None:  # the reverse start was already the tick before (DST edge)
        return _utc(back)
    return best


def next_tick(schedule: Schedule, after: datetime) -> datetime:
    """The first tick > after, in UTC."""
    after = _utc(after)
    if schedule.every is not None:
        return previous_tick(schedule, after) + timedelta(seconds=schedule.every)
    local = after.astimezone(schedule.zone)
    for tick in CronSim(schedule.expression, local.replace(second=0, microsecond=0)):
        tick_utc = tick.astimezone(timezone.utc)
        if tick_utc > after:
            return tick_utc
    raise AssertionError("unreachable: cronsim iterates for ever")  # pragma: no cover


def due_tick(schedule: Schedule, now: datetime) -> datetime | None:
    """The tick to enqueue at ``now``: the most recent tick <= now if it is younger than
    one period (the interval from it to the next tick), else None. After downtime only
    that one tick is due, never the ones missed before it."""
    tick = previous_tick(schedule, now)
    period = next_tick(schedule, tick) - tick
    return tick if _utc(now) - tick < period else None


def missed_ticks(schedule: Schedule, last: datetime, now: datetime) -> list[datetime]:
    """The ticks after ``last`` (the last one claimed) up to ``now`` that a schedule with
    ``backfill`` N enqueues: the most recent N + 1 of them, oldest first (the due tick
    last, when it is one). Empty when nothing is past ``last``."""
    last, now = _utc(last), _utc(now)
    found: list[datetime] = []
    tick = previous_tick(schedule, now)
    while tick > last and len(found) <= schedule.backfill:
        found.append(tick)
        tick = previous_tick(schedule, tick - timedelta(microseconds=1))
    return found[::-1]


def tick_key(schedule: Schedule, tick: datetime) -> str:
    """periodic:<name>:<tick in UTC, ISO 8601, whole seconds>."""
    return f"periodic:{schedule.name}:{_utc(tick).strftime('%Y-%m-%dT%H:%M:%SZ')}"


def build_job(schedule: Schedule, tick: datetime) -> Job:
    """The Job of ``tick`` with the periodic key (a key the Job gave is replaced). A
    callable gets the tick as an aware datetime in the schedule's time zone; when it
    raises or returns something else than a Job, PeriodicJobError says so."""
    spec = schedule.job
    if isinstance(spec, Job):
        job = spec
    else:
        try:
            made = spec(_utc(tick).astimezone(schedule.zone))
        except Exception as exc:
            raise PeriodicJobError(f"the job callable raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(made, Job):
            raise PeriodicJobError(
                f"the job callable returned a {type(made).__name__}, not a brooq.Job"
            )
        job = made
    return Job(
        job.topic,
        job.payload,
        idempotency_key=tick_key(schedule, tick),
        available_at=job.available_at,
        queue=job.queue,
        priority=job.priority,
    )
