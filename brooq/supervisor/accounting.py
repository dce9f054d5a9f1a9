"""What the master still owes the table for children that ended holding jobs.

Owns the queue of settlements not yet written (brooq.supervisor.settlement decides them,
the fleet hands them over here as it reaps) and writing them: a failed attempt for the job
a child died running, the other jobs it held back to pending with the attempt refunded,
and at the drain timeout everything back, counted, so the master can say how many jobs it
returned. What the database cannot take now stays queued, in order, for the next pass.

It must never decide anything about a child (that is settlement's) and never wait for
the database (brooq.supervisor.connections answers at once when it is away).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg

from brooq.handlers import Policy
from brooq.metrics import Metrics
from brooq.supervisor import maintenance
from brooq.supervisor.connections import Connections
from brooq.supervisor.settlement import ReturnAll, SettleHeld

log = logging.getLogger("brooq.master")


@dataclass(frozen=True)
class _Failure:
    identity: str  # the worker that died
    running: uuid.UUID | None  # the job it was running, if any
    cause: str
    suspects: tuple[uuid.UUID, ...] = ()
    because: str = ""  # why the others go back (log and metric)


class Accounting:
    def __init__(
        self,
        conns: Connections,
        policies: dict[str, Policy],
        default_policy: Policy,
        metrics: Metrics | None,
        max_lease_expiries: int = 5,
    ) -> None:
        self.max_lease_expiries = max_lease_expiries
        self.conns = conns
        self.policies = policies
        self.default_policy = default_policy
        self.metrics = metrics
        self.pending_failures: list[_Failure] = []
        self.pending_releases: list[str] = []
        self.released = 0  # jobs returned to pending by ReturnAll: the master exits 1

    def owe(self, identity: str, jobs: SettleHeld | ReturnAll) -> None:
        if isinstance(jobs, ReturnAll):
            self.pending_releases.append(identity)
        else:
            self.pending_failures.append(
                _Failure(identity, jobs.job, jobs.cause, jobs.suspects, jobs.because)
            )

    def flush(self) -> None:
        while self.pending_failures:
            owed = self.pending_failures[0]

            def settle(
                conn: psycopg.Connection[Any], owed: _Failure = owed
            ) -> tuple[list[tuple[uuid.UUID, str, str]], list[tuple[uuid.UUID, str]]]:
                return maintenance.settle_dead_worker(
                    conn,
                    owed.identity,
                    owed.running,
                    owed.cause,
                    self.policies,
                    self.default_policy,
                    owed.suspects,
                    self.max_lease_expiries,
                    q=self.conns.q,
                )

            result = self.conns.with_db("crash_accounting", settle)
            if result is None:
                return  # database unreachable: try again on the next pass
            self.pending_failures.pop(0)
            failed, released = result
            for job_id, topic, state in failed:
                if self.metrics is not None:
                    self.metrics.outcomes.labels(topic, state).inc()
                log.error(
                    "event=attempt_failed_by_master job=%s topic=%s state=%s cause=%r",
                    job_id,
                    topic,
                    state,
                    owed.cause.splitlines()[0],
                )
            because = f" because={owed.because}" if owed.because else ""
            for job_id, topic in released:
                log.info(
                    "event=job_returned job=%s topic=%s attempt_refunded=1%s",
                    job_id,
                    topic,
                    because,
                )
            if self.metrics is not None and released and owed.because:
                reason = "suspect" if owed.because == "suspect" else "sibling_killed"
                self.metrics.jobs_returned.labels(reason).inc(len(released))
        if self.pending_releases:
            workers = list(self.pending_releases)
            returned = self.conns.with_db(
                "release", lambda conn: maintenance.release_held(conn, workers, self.conns.q)
            )
            if returned is None:
                return
            self.pending_releases.clear()
            self.released += len(returned)
            if self.metrics is not None and returned:
                self.metrics.jobs_returned.labels("returned").inc(len(returned))
            for job_id, topic in returned:
                log.warning("event=job_returned job=%s topic=%s attempt_refunded=1", job_id, topic)
