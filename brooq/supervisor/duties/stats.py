"""The job-count gauges, as a duty (every stats_period, the first at once) and a source of
the master's select (the count's answer, read when it arrives).

Owns: counting the jobs by queue, topic and state off the loop
(brooq.supervisor.offloop), and, on a master with limited topics, the ready jobs their
limits hold back (job_held_by_topic, in the same round trip); pacing the count by its
duration, writing the gauges (the oldest ready age leaves out the jobs held back: a topic
waiting its turn is not stuck), and handing each count to the unhandled-topic watch
(brooq.supervisor.unhandled).
Must never wait on the count in the loop.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any

from brooq.metrics import Metrics
from brooq.operator.records import SPLIT
from brooq.settings import Settings
from brooq.supervisor.connections import MASTER_LOCK_TIMEOUT_MS, Connections
from brooq.supervisor.duties.scheduler import Counts
from brooq.supervisor.offloop import OffLoop
from brooq.supervisor.source import Source
from brooq.supervisor.unhandled import Unhandled

log = logging.getLogger("brooq.master")

STATS = "stats"
# The stats duty's count takes at most 1/STATS_LOOP_SHARE of its connection's time; a
# count has STATS_STATEMENT_TIMEOUT_MS on the server, and is given up (its connection
# closed) when even that did not answer.
STATS_LOOP_SHARE = 20.0
STATS_STATEMENT_TIMEOUT_MS = 120_000
STATS_GIVE_UP_AFTER = 180.0


class Stats(Source):
    """Jobs by queue, topic and state, oldest ready age, and the table's dead tuples and
    transaction ID age: read from the database on a timer, so the scrape rate never
    multiplies the database load.

    ``topics``: {topic: the queue its handler declares}; their label sets are
    written, as zeros, even while the table holds none of their jobs. A label set read
    last time and gone now (its jobs finished or moved to another queue) is written once
    as zeros: a multiprocess gauge cannot drop a label set, and a stale count must not
    stay on the dashboards.

    The counts are exact, so a run costs what the backlog holds (seconds on a backlog
    of millions): the count is sent on a connection of
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
        limited: bool = False,
    ) -> None:
        self.conns = conns
        # A topic of this master's has limits of the fleet: count what they hold back.
        self.limited = limited
        self.handled = {(queue, topic) for topic, queue in topics.items()}
        self.configured = self.period = settings.stats_period
        self.metrics = metrics
        self.shown: set[tuple[str, str]] = set()  # (queue, topic) read at the last run
        self.sent_at: float | None = None  # the last count's send (the run's ``now``)
        # Each count's rows judged against the live fleet (set by the master).
        self.unhandled: Unhandled | None = None
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
        statement = self.conns.q.job_stats_by_topic
        if self.limited:  # two statements, two results, one round trip
            statement = f"{statement};\n{self.conns.q.job_held_by_topic}"
        if not self.line.send(statement):
            return {}
        self.sent_at = now
        return {"sent": 1}

    # -- the loop: read what arrived -------------------------------------------------------

    def read_fds(self) -> list[int]:
        return self.line.read_fds() if self.line is not None else []

    def fds(self) -> list[int]:
        return self.line.fds() if self.line is not None else []

    def service(self, readable: Collection[int], writable: Collection[int] = ()) -> None:
        answer = self.line.service(readable) if self.line is not None else None
        if answer is None:
            return
        self._pace(answer.seconds)
        if answer.error:
            log.warning("event=stats_failed seconds=%.2f error=%r", answer.seconds, answer.error)
            return
        results = answer.results
        self.apply(
            stats_rows(results[0]) if results else [],
            stats_rows(results[1]) if len(results) > 1 else [],
        )

    def close(self) -> None:
        if self.line is not None:
            self.line.close()

    def apply(self, rows: list[dict[str, Any]], held: Sequence[dict[str, Any]] = ()) -> Counts:
        """The gauges from one count's rows (job_stats_by_topic) and what the limits hold
        back (job_held_by_topic: the held jobs, and the oldest ready age without them)."""
        assert self.metrics is not None
        by_key = {(r["queue"], r["topic"]): r for r in rows}
        holds = {(h["queue"], h["topic"]): h for h in held}
        for queue, topic in self.handled | self.shown | set(by_key):
            r = by_key.get((queue, topic), {})
            for state in SPLIT:
                self.metrics.jobs.labels(topic=topic, state=state, queue=queue).set(r.get(state, 0))
            h = holds.get((queue, topic))
            oldest = r.get("oldest_ready_age", 0.0) if h is None else h["oldest_unheld_age"]
            self.metrics.oldest_ready.labels(topic=topic, queue=queue).set(float(oldest))
            self.metrics.held.labels(topic=topic, queue=queue).set(
                float(h["held"]) if h is not None else 0.0
            )
        self.shown = set(by_key)
        if self.unhandled is not None:
            self.unhandled.check(rows)
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
