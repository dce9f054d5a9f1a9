"""The reaper, as a duty: every effective_reaper_period, the first after 1 s.

Owns: sending expired leases back to pending (or dead after max_lease_expiries:
brooq.supervisor.maintenance.reap_expired), with their log lines and metrics, and moving
up debounced jobs left waiting with no job of their key before them (promote_orphans).
Must never wait: a database out of reach skips a run.
"""

from __future__ import annotations

import logging

from brooq.metrics import Metrics
from brooq.settings import Settings
from brooq.supervisor import maintenance
from brooq.supervisor.connections import Connections
from brooq.supervisor.duties.scheduler import Counts

log = logging.getLogger("brooq.master")

REAP = "reap"


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
