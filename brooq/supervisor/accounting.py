"""What the master still owes the table for children that ended holding jobs.

Owns the queue of settlements not yet written (brooq.supervisor.settlement decides them,
the fleet hands them over here as it reaps) and writing them: a failed attempt for the job
a child died running, the other jobs it held back to pending with the attempt refunded,
and at the drain timeout everything back, counted, so the master can say how many jobs it
returned. What the database cannot take now stays queued, in order, for the next pass.
A settlement the database refuses (a statement that fails on its job: a trigger of the
application's raising, a statement timeout) never holds up the others: it goes to the
back of the queue, and after SETTLE_TRIES refusals it is given up, logged
(event=settlement_skipped) and left to the reaper, which takes the job when its lease
(no longer renewed) expires; the other jobs that child held are given back at once.

It must never decide anything about a child (that is settlement's) and never wait for
the database (brooq.supervisor.connections answers at once when it is away).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg

from brooq.declare.handlers import Policy
from brooq.metrics import Metrics
from brooq.supervisor import maintenance
from brooq.supervisor.connections import Connections
from brooq.supervisor.settlement import ReturnAll, SettleHeld

log = logging.getLogger("brooq.master")

SETTLE_TRIES = 3  # refusals of a settlement before it is left to the reaper

Settled = tuple[list[tuple[uuid.UUID, str, str]], list[tuple[uuid.UUID, str]]]


@dataclass(frozen=True)
class _Refused:
    error: str


@dataclass(frozen=True)
class _Failure:
    identity: str  # the worker that died
    running: uuid.UUID | None  # the job it was running, if any
    cause: str
    suspects: tuple[uuid.UUID, ...] = ()
    because: str = ""  # why the others go back (log and metric)
    refusals: int = 0  # times the database refused to write it
    kind: str = "worker_died"  # the error history entry's (SettleHeld says)
    summary: str = ""
    traceback: str | None = None


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
                _Failure(
                    identity,
                    jobs.job,
                    jobs.cause,
                    jobs.suspects,
                    jobs.because,
                    kind=jobs.kind,
                    summary=jobs.summary,
                    traceback=jobs.traceback,
                )
            )

    def flush(self) -> None:
        for _ in range(len(self.pending_failures)):
            owed = self.pending_failures[0]

            def settle(conn: psycopg.Connection[Any], owed: _Failure = owed) -> Settled | _Refused:
                return self._settle(conn, owed)

            result = self.conns.with_db("crash_accounting", settle)
            if result is None:
                return  # database unreachable: try again on the next pass
            self.pending_failures.pop(0)
            if isinstance(result, _Refused):
                self._refused(owed, result.error)
                continue
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

    def _settle(self, conn: psycopg.Connection[Any], owed: _Failure) -> Settled | _Refused:
        """The settlement written, or refused by the database with the connection still
        good (a broken connection raises: with_db then reconnects, the queue kept)."""
        try:
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
                kind=owed.kind,
                summary=owed.summary,
                traceback=owed.traceback,
            )
        except psycopg.Error as exc:
            if conn.broken:
                raise
            text = str(exc).strip()
            return _Refused(text.splitlines()[0] if text else type(exc).__name__)

    def _refused(self, owed: _Failure, error: str) -> None:
        refusals = owed.refusals + 1
        if refusals < SETTLE_TRIES:
            log.warning(
                "event=settlement_refused job=%s worker=%s refusals=%d error=%r",
                owed.running,
                owed.identity,
                refusals,
                error,
            )
            self.pending_failures.append(dataclasses.replace(owed, refusals=refusals))
            return
        log.error(
            "event=settlement_skipped job=%s worker=%s refusals=%d error=%r: left to the "
            "reaper when its lease expires; the other jobs the worker held go back",
            owed.running,
            owed.identity,
            refusals,
            error,
        )
        workers = [owed.identity]
        self.conns.with_db(
            "crash_accounting", lambda conn: maintenance.release_held(conn, workers, self.conns.q)
        )
