"""The periodic schedules, as a duty: every second, the first at once.

Owns: reading the schedules stored in the database (brooq_schedule) at each pass beside
the application's, and enqueueing each schedule's due tick (and the missed ticks its
backfill names) once across every master: the tick claimed in
brooq_periodic and its job inserted (brooq.producer.insert) in one transaction
(periodic_claim, periodic_set_job), and the warning of a master whose clock is ahead
of the database's (ClockAhead). Must never wait: a database out of reach leaves the tick
for the next pass. It is the one place the master calls application code: a schedule's
``job`` callable, once per tick (docs/design.md, "Decisions, and why").
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg

from brooq.declare import periodic as periodic_mod
from brooq.errors import BrooqError
from brooq.metrics import Metrics
from brooq.operator import schedules
from brooq.producer import insert
from brooq.producer.insert import Handlers
from brooq.settings import Settings
from brooq.supervisor.connections import Connections
from brooq.supervisor.duties.scheduler import Counts

log = logging.getLogger("brooq.master")

PERIODIC = "periodic"
PERIODIC_PERIOD = 1.0
# A schedule seen for the first time enqueues its most recent tick only if that tick is
# this recent (it fell due while the masters were running, a pass ago at most); an older
# one is recorded as its starting point and the first job comes with the next tick.
FIRST_TICK_GRACE = timedelta(seconds=2 * PERIODIC_PERIOD)
# The database's clock judges the future: a tick later than its now() by more than this
# is refused (periodic_claim). Hosts kept by NTP agree to milliseconds; two seconds lets a
# tick through that was computed just before a slow round trip, and bounds how early a
# master slightly ahead can enqueue one.
PERIODIC_CLOCK_TOLERANCE = 2.0
# A master whose ticks are refused as being from the future says so this often (seconds
# of the loop's clock), not once per tick.
CLOCK_AHEAD_LOG_EVERY = 60.0


def _wall_clock() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class ClockAhead:
    """A claim the database refused: the tick was ahead of its clock (periodic_claim).
    ``seconds``: how far this master's clock was ahead of the database's."""

    seconds: float


class Periodic:
    """Enqueue each schedule's due tick (brooq.declare.periodic.due_tick), once across every
    master: the tick is claimed in brooq_periodic and its job inserted, with the key
    periodic:<name>:<tick>, in one transaction on the maintenance connection.

    ``clock``: the wall clock (ticks are instants, not monotonic times); tests inject
    one. A tick this master already claimed, lost to another master or could not build
    is not tried again; a tick it could not reach the database for is (the next pass
    still finds it due while it is younger than one period). A tick the database refuses
    as being from the future (this master's clock ahead of the database's by more than
    PERIODIC_CLOCK_TOLERANCE) counts as failed, and the master warns with its skew at
    most once per CLOCK_AHEAD_LOG_EVERY (the warnings stop when its clock is set right)."""

    name = PERIODIC
    first_after = 0.0

    def __init__(
        self,
        conns: Connections,
        schedules: Mapping[str, periodic_mod.Schedule],
        handlers: Handlers,
        settings: Settings,
        metrics: Metrics | None,
        clock: Callable[[], datetime] = _wall_clock,
        period: float = PERIODIC_PERIOD,
        draining: Callable[[], bool] = lambda: False,
    ) -> None:
        self.conns = conns
        self.schedules = dict(schedules)
        self.handlers = dict(handlers)
        self.max_payload = settings.max_payload_bytes
        self.metrics = metrics
        self.clock = clock
        self.period = period
        # A draining master enqueues no more ticks: the other masters, or this one's
        # successor, take the next ones (the catch-up rule covers a gap).
        self.draining = draining
        self.settled: dict[str, datetime] = {}  # name -> the last tick decided here
        # The stored schedules (brooq_schedule) not paused, as the last pass read them.
        self.stored: dict[str, periodic_mod.Schedule] = {}
        self.said: set[tuple[str, object]] = set()  # stored rows already warned about
        # When the loop last warned that this master's clock is ahead (None: never).
        self.ahead_logged_at: float | None = None

    def pending(
        self, now: datetime, last: Mapping[str, datetime] | None = None
    ) -> list[tuple[periodic_mod.Schedule, datetime]]:
        """The (schedule, tick) pairs to try at ``now``: due and not decided here yet, and
        for a schedule with a backfill, the ticks it missed since ``last[name]`` (the last
        claimed), oldest first, as many as it names."""
        out = []
        for name, schedule in sorted(self.running().items()):
            claimed = (last or {}).get(name)
            if schedule.backfill and claimed is not None:
                ticks = periodic_mod.missed_ticks(schedule, claimed, now)
            else:
                tick = periodic_mod.due_tick(schedule, now)
                ticks = [] if tick is None else [tick]
            done = self.settled.get(name)
            out += [(schedule, t) for t in ticks if done is None or t > done]
        return out

    def running(self) -> dict[str, periodic_mod.Schedule]:
        """The schedules this master runs: the stored ones not paused (as last read),
        and the application's, which keep a name both have."""
        return {**self.stored, **self.schedules}

    def refresh(self) -> dict[str, datetime] | None:
        """Read the stored schedules (brooq_schedule); the last claimed tick of each by
        name. None when the database could not be read (the last reading stays)."""
        rows = self.conns.with_db(
            "stored schedules", lambda conn: schedules.listed(conn, q=self.conns.q)
        )
        if rows is None:
            return None
        stored: dict[str, periodic_mod.Schedule] = {}
        last: dict[str, datetime] = {}
        for row in rows:
            if row.last_tick is not None:
                last[row.name] = row.last_tick
            if row.paused:
                continue
            if row.name in self.schedules:
                self._once(
                    row,
                    "event=periodic_shadowed name=%s: the application declares a "
                    "schedule of this name, which runs instead of the stored one",
                )
                continue
            try:
                stored[row.name] = row.schedule()
            except (BrooqError, ValueError) as exc:
                self._once(
                    row,
                    "event=periodic_refused name=%s error=%r: the stored schedule is left out",
                    str(exc),
                )
        self.stored = stored
        return last

    def _once(self, row: schedules.StoredSchedule, message: str, *args: object) -> None:
        """Log ``message`` for a stored schedule once per version of its row."""
        seen = (row.name, row.updated_at)
        if seen not in self.said:
            self.said.add(seen)
            log.warning(message, row.name, *args)

    def run_once(self, now: float) -> Counts:
        enqueued = lost = failed = 0
        if self.draining():
            return {"enqueued": 0, "lost": 0, "failed": 0}
        last = self.refresh()
        for schedule, tick in self.pending(self.clock(), last):
            try:
                job = periodic_mod.build_job(schedule, tick)
                # A typed topic's payload is checked too: a tick's job that cannot fit
                # would only go dead in the worker.
                insert.check_job(job, self.max_payload, self.handlers)
            except (periodic_mod.PeriodicJobError, BrooqError, TypeError, ValueError) as exc:
                # Not claimed: another master whose callable works may still enqueue it.
                self.settled[schedule.name] = tick
                failed += 1
                log.error(
                    "event=periodic_failed name=%s tick=%s error=%r: tick skipped",
                    schedule.name,
                    tick.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    str(exc),
                )
                continue
            result = self.conns.with_db("periodic", self._claimer(schedule, tick, job))
            if result is None:
                if not self.conns.connected:  # the database is away: try again next pass
                    return {"enqueued": enqueued, "lost": lost, "failed": failed}
                # A statement refused (logged by with_db): skip this tick, not the others.
                self.settled[schedule.name] = tick
                failed += 1
                continue
            self.settled[schedule.name] = tick
            if isinstance(result, ClockAhead):
                failed += 1
                self._clock_ahead(result, now)
                continue
            if result is False:
                lost += 1
                continue
            if result is True:
                log.info(
                    "event=periodic_started name=%s tick=%s: a new schedule; its first job "
                    "comes with its next tick",
                    schedule.name,
                    tick.strftime("%Y-%m-%dT%H:%M:%SZ"),
                )
                continue
            enqueued += 1
            if self.metrics is not None:
                self.metrics.periodic_enqueued.labels(schedule.name).inc()
            log.info(
                "event=periodic_enqueued name=%s tick=%s job=%s",
                schedule.name,
                tick.strftime("%Y-%m-%dT%H:%M:%SZ"),
                result,
            )
        return {"enqueued": enqueued, "lost": lost, "failed": failed}

    def _clock_ahead(self, refused: ClockAhead, now: float) -> None:
        """Say that the database refuses this master's ticks, at most once per
        CLOCK_AHEAD_LOG_EVERY: the other masters enqueue them, this one cannot until its
        clock is set right."""
        if self.ahead_logged_at is not None and now - self.ahead_logged_at < CLOCK_AHEAD_LOG_EVERY:
            return
        self.ahead_logged_at = now
        log.warning(
            "event=periodic_clock_ahead skew=%.1fs tolerance=%gs: this master's clock is "
            "%.1f s ahead of the database's; the database refuses its periodic ticks as "
            "being from the future (the masters whose clocks agree with it enqueue them): "
            "fix this host's clock (NTP)",
            refused.seconds,
            PERIODIC_CLOCK_TOLERANCE,
            refused.seconds,
        )

    def _claimer(
        self, schedule: periodic_mod.Schedule, tick: datetime, job: Any
    ) -> Callable[[psycopg.Connection[Any]], uuid.UUID | bool | ClockAhead]:
        return lambda conn: self._claim(conn, schedule, tick, job)

    def _claim(
        self,
        conn: psycopg.Connection[Any],
        schedule: periodic_mod.Schedule,
        tick: datetime,
        job: Any,
    ) -> uuid.UUID | bool | ClockAhead:
        """The id of the job enqueued for ``tick``; False when another master (or an
        earlier run) claimed this tick or a later one; True when the schedule is new and
        ``tick`` passed before it existed (claimed as its start, no job); ClockAhead
        when the database refused the tick as being from the future."""
        try:
            with conn.transaction():
                row = conn.execute(
                    self.conns.q.periodic_claim,
                    {"name": schedule.name, "tick": tick, "tolerance": PERIODIC_CLOCK_TOLERANCE},
                ).fetchone()
                assert row is not None  # the statement answers one row always
                claimed, first, db_now = row[0], row[1], row[2]
                if claimed is None:
                    if tick - db_now > timedelta(seconds=PERIODIC_CLOCK_TOLERANCE):
                        return ClockAhead((self.clock() - db_now).total_seconds())
                    return False
                if first and self.clock() - tick > FIRST_TICK_GRACE:
                    # A schedule never claimed before starts with its next tick: its
                    # last one passed before it existed, so nothing was missed.
                    return True
                job_id, _ = insert.insert_checked(conn, job, self.handlers, q=self.conns.q)
                conn.execute(self.conns.q.periodic_set_job, {"name": schedule.name, "job": job_id})
                return job_id
        except BrooqError as exc:
            log.error(
                "event=periodic_failed name=%s error=%r: tick skipped", schedule.name, str(exc)
            )
            return False
