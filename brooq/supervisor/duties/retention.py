"""Retention, as a duty: every effective_retention_period, the first after at most 5 s;
again RETENTION_BEHIND_PAUSE later while a backlog is left.

Owns: the finished jobs' partitions made ahead and dropped whole past retention_ttl
(brooq.supervisor.history), once per period; deleting terminal jobs older than
retention_ttl still in job (written before job_history existed) and in job_history's
default partition in bounded passes (brooq.supervisor.maintenance.delete_expired),
expiring stack requests left behind,
deleting the rates' windows no start needs any more (once per period, not between the
passes of a backlog), and saying when it is behind. Must never hold the loop for more
than one pass.
"""

from __future__ import annotations

import logging

from brooq.metrics import Metrics
from brooq.settings import Settings
from brooq.supervisor import history, maintenance
from brooq.supervisor.connections import Connections
from brooq.supervisor.duties.scheduler import Counts

log = logging.getLogger("brooq.master")

RETENTION = "retention"
# Retention while behind: the pause between two passes, and how often it says so.
RETENTION_BEHIND_PAUSE = 0.01
RETENTION_LOG_EVERY = 10.0
# The rates' idle windows deleted per period, at most (one index probe each, under a
# topic lock that is only tried, never waited for).
RATE_WINDOWS_PER_PASS = 1000


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
        self.span = settings.history_partition
        self.first_after = min(5.0, self.period)
        self.metrics = metrics
        self.behind_since: float | None = None  # when the current backlog was first seen
        self.behind_count = 0  # rows deleted since then
        # Expired partitions whose idempotency keys are being released, between passes.
        self.releasing: dict[str, history.Releasing] = {}
        self.logged_at = 0.0

    def run_once(self, now: float) -> Counts:
        # Stack requests a killed `brooq jobs stack` left behind (brooq.producer.stacks), whatever
        # the jobs' retention.
        self.conns.with_db(
            "stack_requests", lambda conn: conn.execute(self.conns.q.stack_requests_expire)
        )
        if self.again_after is None:  # a period's run, not a backlog's next pass
            self.conns.with_db(
                "rate_windows",
                lambda conn: conn.execute(
                    self.conns.q.rate_windows_sweep, {"windows": RATE_WINDOWS_PER_PASS}
                ),
            )
        if self.again_after is None:
            self.conns.with_db(
                "history_partitions", lambda conn: history.prepare(conn, self.span, self.conns.q)
            )
        if self.ttl <= 0:
            return {}
        if self.again_after is None or any(not s.done for s in self.releasing.values()):
            self.conns.with_db(
                "history_drop",
                lambda conn: history.drop_expired(conn, self.ttl, self.conns.q, self.releasing),
            )
        if self.again_after is None:
            gone = self.conns.with_db(
                "history_default",
                lambda conn: history.expire_default(conn, self.ttl, self.batch, self.conns.q),
            )
            if gone:
                log.info("event=history_default_expired count=%d", sum(gone.values()))
            if gone and self.metrics is not None:
                for topic, n in gone.items():
                    self.metrics.retention_deleted.labels(topic).inc(n)
            # Events durable handlers waited for (migration 0017): those older than the
            # TTL that no job waits on, a batch per period.
            params = {"ttl": self.ttl, "batch": self.batch}
            self.conns.with_db(
                "events", lambda conn: conn.execute(self.conns.q.events_expire, params)
            )
        result = self.conns.with_db(
            "retention",
            lambda conn: maintenance.delete_expired(conn, self.ttl, self.batch, q=self.conns.q),
        )
        # Keys still to release: back soon, with the server left alone in between. (A drop
        # deferred behind a lock, its keys all released, waits for the next period.)
        keys_left = any(not state.done for state in self.releasing.values())
        self.again_after = history.KEYS_PAUSE if keys_left else None
        if not result:
            return {}
        deleted, more = result
        if deleted and self.metrics is not None:
            for topic, n in deleted.items():
                self.metrics.retention_deleted.labels(topic).inc(n)
        count = sum(deleted.values())
        self._log(now, count, more)
        if more:
            self.again_after = RETENTION_BEHIND_PAUSE
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
