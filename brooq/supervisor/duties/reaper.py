"""The reaper, as a duty: every effective_reaper_period, the first after 1 s.

Owns: sending expired leases back to pending (or dead after max_lease_expiries:
job_reap_expired), with their log lines and metrics, and moving
up debounced jobs left waiting with no job of their key before them (promote_orphans).
One job whose write fails (a trigger of the application's raising for it, a statement
timeout) must not stop the others: when the statement for every expired lease fails, the
pass takes them one at a time, logs the job that fails (event=reap_failed) and holds it
back from the statement for all, trying it alone again after a backoff. A lock not granted
in time, a deadlock or a serialization failure is no one job's: it ends the pass as any
database error does.
Must never wait: a database out of reach skips a run; the job-by-job pass stops after
ONE_BY_ONE_SECONDS and takes the rest on the next run.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from typing import Any

import psycopg
from psycopg.rows import dict_row

from brooq.metrics import Metrics
from brooq.settings import Settings
from brooq.supervisor import maintenance
from brooq.supervisor.connections import Connections
from brooq.supervisor.duties.scheduler import Counts

log = logging.getLogger("brooq.master")

REAP = "reap"
# The job-by-job pass: at most this many expired leases read, for at most this long.
ONE_BY_ONE_LIMIT = 200
ONE_BY_ONE_SECONDS = 2.0
# A job whose write failed is tried alone again after this long, doubling up to the most.
HOLD_FIRST = 30.0
HOLD_MOST = 600.0

Rows = list[dict[str, Any]]

# Failures that say nothing of one row: a lock on the table not granted in time, a
# deadlock or a serialization failure. Taking the jobs one by one would meet them again;
# the pass ends as any database error ends it (db_error, a reconnect, the next run).
WHOLE_STATEMENT = (
    psycopg.errors.LockNotAvailable,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.SerializationFailure,
)


class Reaper:
    """Expired leases back to pending (or dead after max_lease_expiries)."""

    name = REAP
    first_after = 1.0

    def __init__(self, conns: Connections, settings: Settings, metrics: Metrics | None) -> None:
        self.conns = conns
        self.max_expiries = settings.max_lease_expiries
        self.period = settings.effective_reaper_period
        self.metrics = metrics
        # Jobs whose write failed: (when to try it alone again, the hold's length).
        self.held: dict[uuid.UUID, tuple[float, float]] = {}

    def run_once(self, now: float) -> Counts:
        rows = self.conns.with_db("reaper", lambda conn: self.reap(conn, now))
        if rows is None:
            return {}
        reaped = Counter(r["topic"] for r in rows if r["state"] == "pending")
        dead = [(r["id"], r["topic"], r["lease_expiries"]) for r in rows if r["state"] == "dead"]
        promoted = self.conns.with_db(
            "reaper", lambda conn: maintenance.promote_orphans(conn, self.conns.q)
        )
        if promoted:
            log.warning(
                "event=jobs_promoted count=%d: debounced jobs waited with no job of their "
                "unique_key before them (a producer rolled back as that job ended?)",
                promoted,
            )
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
        return {"reaped": sum(reaped.values()), "dead": len(dead), "promoted": promoted or 0}

    def reap(self, conn: psycopg.Connection[Any], now: float) -> Rows:
        """The rows job_reap_expired returns, whatever one job's write does."""
        q = self.conns.q
        params: dict[str, Any] = {"max_expiries": self.max_expiries, "skip": list(self.held)}
        try:
            rows = self._rows(conn, q.job_reap_expired_except, params)
        except psycopg.Error as exc:
            if conn.broken or isinstance(exc, WHOLE_STATEMENT):
                raise
            log.warning(
                "event=reap_one_by_one error=%r: the statement for every expired lease "
                "failed; each is taken alone",
                _first_line(exc),
            )
            params["limit"] = ONE_BY_ONE_LIMIT
            ids = [r["id"] for r in self._rows(conn, q.job_expired_ids, params)]
            rows = self._one_by_one(conn, ids, now)
        due = [job_id for job_id, (at, _) in self.held.items() if at <= now]
        return rows + self._one_by_one(conn, due, now)

    def _one_by_one(self, conn: psycopg.Connection[Any], ids: list[uuid.UUID], now: float) -> Rows:
        rows: Rows = []
        stop = time.monotonic() + ONE_BY_ONE_SECONDS
        for job_id in ids:
            if time.monotonic() >= stop:
                break
            params = {"max_expiries": self.max_expiries, "id": job_id}
            try:
                rows += self._rows(conn, self.conns.q.job_reap_expired_one, params)
            except psycopg.Error as exc:
                if conn.broken:
                    raise
                hold = (
                    min(self.held[job_id][1] * 2, HOLD_MOST) if job_id in self.held else HOLD_FIRST
                )
                self.held[job_id] = (now + hold, hold)
                log.error(
                    "event=reap_failed job=%s retry_in=%.0fs error=%r: its lease expired and "
                    "its write fails; the other expired leases are reaped without it",
                    job_id,
                    hold,
                    _first_line(exc),
                )
            else:
                self.held.pop(job_id, None)
        return rows

    @staticmethod
    def _rows(conn: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> Rows:
        return conn.cursor(row_factory=dict_row).execute(query, params).fetchall()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
