"""Lease renewal, as a duty: every lease/3, and at once after a reconnection.

Owns: extending the lease of every job a child holds, in one statement on the
maintenance connection (brooq.supervisor.maintenance.renew_leases), and telling a child
(on its pipe) the jobs whose lease it lost: canceled, reaped or taken over. Must never
touch a child's process or wait on a child.
"""

from __future__ import annotations

import logging
import uuid

from brooq.ipc import protocol
from brooq.metrics import Metrics
from brooq.settings import Settings
from brooq.supervisor import maintenance
from brooq.supervisor.connections import Connections
from brooq.supervisor.duties.scheduler import Counts
from brooq.supervisor.fleet import Fleet

log = logging.getLogger("brooq.master")

RENEW = "renew"


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
            c.watching_drops = True
        try:
            return self._renew(held, now)
        finally:
            for c in fleet.children.values():
                c.watching_drops = False
                c.dropped.clear()

    def _renew(self, held: list[tuple[uuid.UUID, str]], now: float) -> Counts:
        """The statement, and the children told what they lost; the jobs that left a
        child's list meanwhile are in its ``dropped``."""
        fleet = self.fleet
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
