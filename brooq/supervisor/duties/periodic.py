"""The master's periodic duties, and the one scheduler that runs them.

Owns the timing of everything the master does on a clock: the systemd watchdog ping
(twice per WatchdogSec), reconnecting the database (every pass while it is away), lease
renewal (every lease/3; at once after a reconnection), the reaper (every
effective_reaper_period, the first after 1 s), the job-count gauges (every stats_period,
the first at once), retention (every effective_retention_period, the first after at
most 5 s) and the periodic schedules (every second, the first at once: Periodic, which
claims a tick in brooq_periodic and enqueues its job in one transaction). Each duty is a
small object with its period and a ``run_once(now)`` returning counts; the statements
they run are brooq.supervisor.maintenance's (Periodic's own: periodic_claim and
periodic_set_job, with brooq.produce's insert).

The Scheduler is pure (its clock is the ``now`` it is given) and the duties must never
wait: a duty that cannot reach the database returns nothing and runs again next period.
No duty ever touches a child's process: renewal only tells a child its lease is lost.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

import psycopg

from brooq import periodic as periodic_mod
from brooq import produce
from brooq.errors import BrooqError
from brooq.ipc import protocol
from brooq.metrics import Metrics
from brooq.settings import Settings
from brooq.supervisor import maintenance
from brooq.supervisor.accounting import Accounting
from brooq.supervisor.connections import MASTER_LOCK_TIMEOUT_MS, Connections
from brooq.supervisor.fleet import Fleet
from brooq.supervisor.offloop import OffLoop
from brooq.supervisor.sdnotify import Notifier

log = logging.getLogger("brooq.master")

Counts = dict[str, int]

SD_WATCHDOG, RECONNECT, RENEW, REAP, STATS, RETENTION, PERIODIC = (
    "sd_watchdog",
    "reconnect",
    "renew",
    "reap",
    "stats",
    "retention",
    "periodic",
)
PERIODIC_PERIOD = 1.0
# The stats duty's count takes at most 1/STATS_LOOP_SHARE of its connection's time; a
# count has STATS_STATEMENT_TIMEOUT_MS on the server, and is given up (its connection
# closed) when even that did not answer.
STATS_LOOP_SHARE = 20.0
STATS_STATEMENT_TIMEOUT_MS = 120_000
STATS_GIVE_UP_AFTER = 180.0
# Retention while behind: the pause between two passes, and how often it says so.
RETENTION_BEHIND_PAUSE = 0.01
RETENTION_LOG_EVERY = 10.0
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


class Duty(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def period(self) -> float | None:
        """Seconds between two runs; None: every pass of the loop, on no timer."""

    @property
    def first_after(self) -> float:
        """Seconds from the scheduler's start to the first run."""

    def run_once(self, now: float) -> Counts: ...


class Scheduler:
    """Duties in a fixed order, each due ``period`` seconds after its last run."""

    def __init__(self, duties: Sequence[Duty], now: float) -> None:
        self.duties = list(duties)
        self._next = {d.name: now + d.first_after for d in duties if d.period is not None}

    def due(self, now: float) -> Iterator[Duty]:
        """The duties due at ``now``, in order, each rescheduled one period after ``now``
        as it is handed out. Lazy: a duty is looked at once the one before it has run, so
        a duty made due at once by an earlier one (renewal, by a reconnection) runs in
        the same pass. A duty that ran and left work (its ``again_after`` is not None, as
        Retention's while it is behind) runs again that many seconds after ``now``
        instead of a period later; one that changed its period when it ran (Stats, after a
        slow run) is next due that new period after ``now``."""
        for d in self.duties:
            if d.period is None:
                yield d
            elif now >= self._next[d.name]:
                self._next[d.name] = now + d.period
                yield d
                self._next[d.name] = now + d.period  # a duty may pace itself (Stats)
                again = getattr(d, "again_after", None)
                if again is not None:
                    self._next[d.name] = min(self._next[d.name], now + again)

    def next_at(self) -> float:
        """When the next timed duty is due."""
        return min(self._next.values(), default=float("inf"))

    def due_now(self, name: str) -> None:
        self._next[name] = float("-inf")


# -- the duties -------------------------------------------------------------------------------


class SdWatchdog:
    """WATCHDOG=1 to systemd; only scheduled when systemd asks for it (WATCHDOG_USEC)."""

    name = SD_WATCHDOG
    first_after = 0.0

    def __init__(self, notifier: Notifier) -> None:
        self.notifier = notifier
        self.period = notifier.watchdog_period

    def run_once(self, now: float) -> Counts:
        self.notifier.send("WATCHDOG=1")
        return {"pings": 1}


class Reconnect:
    """While a connection is down: try again (after its backoff), then write what the
    master owes the table for children that ended meanwhile."""

    name = RECONNECT
    period = None
    first_after = 0.0

    def __init__(self, conns: Connections, accounting: Accounting) -> None:
        self.conns = conns
        self.accounting = accounting

    def run_once(self, now: float) -> Counts:
        if self.conns.connected or not self.conns.connect():
            return {}
        self.accounting.flush()
        return {"reconnected": 1}


class Renewal:
    """Extend the lease of every job a child holds, and tell a child the jobs it lost."""

    name = RENEW

    def __init__(
        self, fleet: Fleet, conns: Connections, settings: Settings, metrics: Metrics | None
    ) -> None:
        self.fleet = fleet
        self.conns = conns
        self.lease = settings.lease
        self.period = self.first_after = settings.renew_period
        self.metrics = metrics

    def run_once(self, now: float) -> Counts:
        fleet = self.fleet
        # Read what children said first, so a job just finished is not taken for lost.
        fleet.read_all(now)
        held = [
            (job_id, c.identity)
            for c in fleet.children.values()
            if c.kill_reason is None
            for job_id in c.held
        ]
        if not held:
            return {"renewed": 0, "lost": 0}
        for c in fleet.children.values():
            c.dropped.clear()
        still = self.conns.with_db(
            "renew", lambda conn: maintenance.renew_leases(conn, held, self.lease, self.conns.q)
        )
        if still is None:
            return {}
        # A job missing from the answer was canceled, reaped or taken over -- unless the
        # child settled it meanwhile: look at what the children said and run since.
        fleet.read_all(now)
        fleet.read_boards()
        missing = {job_id for job_id, _ in held} - still
        lost = 0
        for c in fleet.children.values():
            on_board = {j.id: j for j in c.jobs}
            for job_id in c.held:
                running = on_board.get(job_id)
                if job_id not in missing or (running is not None and job_id in c.lease_lost):
                    continue
                if job_id in c.dropped:
                    # It left the child's list while the statement ran and came back: a
                    # new claim (canceled, then retried), which an answer taken before it
                    # does not concern. Judged on the next pass.
                    continue
                protocol.send(c.to_child, f"lost {job_id}\n".encode())
                lost += 1
                if running is None:
                    continue  # not started yet (the child will skip it) or already settled
                c.lease_lost[job_id] = now
                if self.metrics is not None:
                    self.metrics.lease_lost.labels(running.topic).inc()
                log.info(
                    "event=lease_lost job=%s topic=%s pid=%d: canceled, reaped or taken over",
                    running.id,
                    running.topic,
                    c.pid,
                )
        return {"renewed": len(held) - len(missing), "lost": lost}


class Reaper:
    """Expired leases back to pending (or dead after max_lease_expiries)."""

    name = REAP
    first_after = 1.0

    def __init__(self, conns: Connections, settings: Settings, metrics: Metrics | None) -> None:
        self.conns = conns
        self.max_expiries = settings.max_lease_expiries
        self.period = settings.effective_reaper_period
        self.metrics = metrics

    def run_once(self, now: float) -> Counts:
        result = self.conns.with_db(
            "reaper", lambda conn: maintenance.reap_expired(conn, self.max_expiries, self.conns.q)
        )
        if result is None:
            return {}
        reaped, dead = result
        for job_id, topic, expiries in dead:
            if self.metrics is not None:
                self.metrics.outcomes.labels(topic, "dead").inc()
            log.error(
                "event=job_dead job=%s topic=%s reason=lease_expired expiries=%d: the "
                "workers running it vanished that many times",
                job_id,
                topic,
                expiries,
            )
        if reaped:
            if self.metrics is not None:
                for topic, n in reaped.items():
                    self.metrics.reaped.labels(topic).inc(n)
            log.info(
                "event=jobs_reaped count=%d topics=%s",
                sum(reaped.values()),
                ",".join(sorted(reaped)),
            )
        return {"reaped": sum(reaped.values()), "dead": len(dead)}


class Stats:
    """Jobs by queue, topic and state, oldest ready age, and the table's dead tuples and
    transaction ID age: read from the database on a timer, so the scrape rate never
    multiplies the database load.

    ``topics``: {topic: the queue its handler declares}; their label sets are
    written, as zeros, even while the table holds none of their jobs. A label set read
    last time and gone now (its jobs finished or moved to another queue) is written once
    as zeros: a multiprocess gauge cannot drop a label set, and a stale count must not
    stay on the dashboards.

    The counts are exact, so a run costs what the backlog holds (about 0.3 s with
    1,000,000 ready jobs, 3-4 s with 8,000,000): the count is sent on a connection of
    its own and its rows applied when the answer arrives (brooq.supervisor.offloop),
    so the loop goes on waking children and renewing leases meanwhile; the table's
    health, a catalog read, is read in the loop. One count at a time; the next comes at
    least STATS_LOOP_SHARE times its own duration later, so that counting never takes
    more than 1/STATS_LOOP_SHARE of a database connection's time (the gauges then
    refresh less often, and event=stats_slow says so)."""

    name = STATS
    first_after = 0.0

    def __init__(
        self,
        conns: Connections,
        topics: dict[str, str],
        settings: Settings,
        metrics: Metrics | None,
        dsn: str | None = None,
    ) -> None:
        self.conns = conns
        self.handled = {(queue, topic) for topic, queue in topics.items()}
        self.configured = self.period = settings.stats_period
        self.metrics = metrics
        self.shown: set[tuple[str, str]] = set()  # (queue, topic) read at the last run
        self.sent_at: float | None = None  # the last count's send (the run's ``now``)
        # None without a database (unit tests of the scheduling): nothing is counted.
        self.line = (
            OffLoop(
                dsn,
                STATS,
                {
                    "statement_timeout": str(STATS_STATEMENT_TIMEOUT_MS),
                    "lock_timeout": str(MASTER_LOCK_TIMEOUT_MS),
                },
            )
            if dsn is not None and metrics is not None
            else None
        )

    def run_once(self, now: float) -> Counts:
        if self.metrics is None or self.line is None:
            return {}
        health = self.conns.with_db(
            "stats", lambda c: c.execute(self.conns.q.job_table_health).fetchone()
        )
        if health is None:
            # The database is out of reach (the Reconnect duty is at it): no connect of
            # the count's own, which would hold the loop for its connect timeout.
            return {}
        self.metrics.dead_tuples.set(float(health[0]))
        self.metrics.xid_age.set(float(health[1]))
        if self.line.overdue(STATS_GIVE_UP_AFTER):  # the server's timeout did not answer
            log.warning("event=stats_failed error='no answer after %.0f s'", STATS_GIVE_UP_AFTER)
            self.line.drop()
        if self.line.busy:
            return {}
        # The pace is known once an answer arrived, after the Scheduler had already set
        # the next run a configured period on: that run waits for the paced one.
        if self.sent_at is not None and now - self.sent_at < self.period:
            return {}
        if not self.line.send(self.conns.q.job_stats_by_topic):
            return {}
        self.sent_at = now
        return {"sent": 1}

    # -- the loop: read what arrived -------------------------------------------------------

    def read_fds(self) -> list[int]:
        return self.line.read_fds() if self.line is not None else []

    def fds(self) -> list[int]:
        return self.line.fds() if self.line is not None else []

    def service(self, readable: set[int]) -> None:
        answer = self.line.service(readable) if self.line is not None else None
        if answer is None:
            return
        self._pace(answer.seconds)
        if answer.error:
            log.warning("event=stats_failed seconds=%.2f error=%r", answer.seconds, answer.error)
            return
        self.apply(stats_rows(answer.results[0]) if answer.results else [])

    def close(self) -> None:
        if self.line is not None:
            self.line.close()

    def apply(self, rows: list[dict[str, Any]]) -> Counts:
        """The gauges from one count's rows (job_stats_by_topic)."""
        assert self.metrics is not None
        by_key = {(r["queue"], r["topic"]): r for r in rows}
        for queue, topic in self.handled | self.shown | set(by_key):
            r = by_key.get((queue, topic), {})
            for state in ("pending", "processing", "failed", "dead"):
                self.metrics.jobs.labels(topic=topic, state=state, queue=queue).set(r.get(state, 0))
            self.metrics.oldest_ready.labels(topic=topic, queue=queue).set(
                float(r.get("oldest_ready_age", 0.0))
            )
        self.shown = set(by_key)
        return {"topics": len(rows)}

    def _pace(self, took: float) -> None:
        period = max(self.configured, STATS_LOOP_SHARE * took)
        if period > self.configured and self.period == self.configured:
            log.warning(
                "event=stats_slow seconds=%.2f: counting the jobs took that long; the gauges "
                "now refresh every %.0f s instead of every %.0f s",
                took,
                period,
                self.configured,
            )
        self.period = period


# The columns of job_stats_by_topic by type: libpq's text answer, read without a cursor.
_INT_TYPES = frozenset({20, 21, 23})  # int8, int2, int4
_FLOAT_TYPES = frozenset({700, 701})  # float4, float8


def stats_rows(result: Any) -> list[dict[str, Any]]:
    """A PGresult of job_stats_by_topic as dicts (names as the statement gives them)."""
    names = [result.fname(c).decode() for c in range(result.nfields)]
    kinds = [result.ftype(c) for c in range(result.nfields)]
    rows = []
    for r in range(result.ntuples):
        row: dict[str, Any] = {}
        for c, name in enumerate(names):
            raw = result.get_value(r, c)
            if raw is None:
                row[name] = None
            elif kinds[c] in _INT_TYPES:
                row[name] = int(raw)
            elif kinds[c] in _FLOAT_TYPES:
                row[name] = float(raw)
            else:
                row[name] = raw.decode()  # the connection speaks UTF-8 (dsn.CLIENT_ENCODING)
        rows.append(row)
    return rows


class Retention:
    """Delete terminal jobs older than retention_ttl (0: never).

    A pass deletes for at most maintenance.RETENTION_PASS_SECONDS; while rows are left
    (a backlog: a new deployment on a year of history, or production faster than the
    period can keep up with) it runs again RETENTION_BEHIND_PAUSE later instead of a
    period later, so the backlog drains without the master's loop being held: children
    are woken and watched between the batches. Logged once per RETENTION_LOG_EVERY while
    behind, and once when caught up."""

    name = RETENTION
    again_after: float | None = None

    def __init__(self, conns: Connections, settings: Settings, metrics: Metrics | None) -> None:
        self.conns = conns
        self.ttl = settings.retention_ttl
        self.batch = settings.retention_batch
        self.period = settings.effective_retention_period
        self.first_after = min(5.0, self.period)
        self.metrics = metrics
        self.behind_since: float | None = None  # when the current backlog was first seen
        self.behind_count = 0  # rows deleted since then
        self.logged_at = 0.0

    def run_once(self, now: float) -> Counts:
        # Stack requests a killed `brooq jobs stack` left behind (brooq.stacks), whatever
        # the jobs' retention.
        self.conns.with_db(
            "stack_requests", lambda conn: conn.execute(self.conns.q.stack_requests_expire)
        )
        if self.ttl <= 0:
            return {}
        result = self.conns.with_db(
            "retention",
            lambda conn: maintenance.delete_expired(conn, self.ttl, self.batch, q=self.conns.q),
        )
        if not result:
            return {}
        deleted, more = result
        if deleted and self.metrics is not None:
            for topic, n in deleted.items():
                self.metrics.retention_deleted.labels(topic).inc(n)
        count = sum(deleted.values())
        self._log(now, count, more)
        self.again_after = RETENTION_BEHIND_PAUSE if more else None
        return {"deleted": count, "behind": int(more)}

    def _log(self, now: float, count: int, more: bool) -> None:
        if self.behind_since is None and not more:
            if count:
                log.info("event=retention_deleted count=%d", count)
            return
        first = self.behind_since is None
        if self.behind_since is None:
            self.behind_since = now
            self.behind_count = 0
        self.behind_count += count
        if not more:
            log.info(
                "event=retention_caught_up count=%d seconds=%.1f",
                self.behind_count,
                now - self.behind_since,
            )
            self.behind_since = None
        elif first or now - self.logged_at >= RETENTION_LOG_EVERY:
            log.warning(
                "event=retention_behind count=%d seconds=%.1f: more rows are older than "
                "the TTL than one pass deletes; deleting on, between the loop's other work",
                self.behind_count,
                now - self.behind_since,
            )
            self.logged_at = now


def _wall_clock() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class ClockAhead:
    """A claim the database refused: the tick was ahead of its clock (periodic_claim).
    ``seconds``: how far this master's clock was ahead of the database's."""

    seconds: float


class Periodic:
    """Enqueue each schedule's due tick (brooq.periodic.due_tick), once across every
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
        handlers: produce.Handlers,
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
        # When the loop last warned that this master's clock is ahead (None: never).
        self.ahead_logged_at: float | None = None

    def pending(self, now: datetime) -> list[tuple[periodic_mod.Schedule, datetime]]:
        """The (schedule, tick) pairs to try at ``now``: due and not decided here yet."""
        out = []
        for name, schedule in sorted(self.schedules.items()):
            tick = periodic_mod.due_tick(schedule, now)
            if tick is None or self.settled.get(name) == tick:
                continue
            out.append((schedule, tick))
        return out

    def run_once(self, now: float) -> Counts:
        enqueued = lost = failed = 0
        if self.draining():
            return {"enqueued": 0, "lost": 0, "failed": 0}
        for schedule, tick in self.pending(self.clock()):
            try:
                job = periodic_mod.build_job(schedule, tick)
                # A typed topic's payload is checked too: a tick's job that cannot fit
                # would only go dead in the worker.
                produce.check_job(job, self.max_payload, self.handlers)
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
                job_id, _ = produce.insert_checked(conn, job, self.handlers, q=self.conns.q)
                conn.execute(self.conns.q.periodic_set_job, {"name": schedule.name, "job": job_id})
                return job_id
        except BrooqError as exc:
            log.error(
                "event=periodic_failed name=%s error=%r: tick skipped", schedule.name, str(exc)
            )
            return False
