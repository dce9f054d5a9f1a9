"""What a dead child may still hold after its death was settled: a claim that committed
after the child died.

A child killed while its claim runs leaves the claim to its database session, which goes
on (it may wait on a lock) and commits before it notices its client is gone. The release
at the child's death (brooq.supervisor.accounting) skipped the rows that claim had
locked, so without a second look those jobs, never started, would wait out the whole
lease and come back counting a lease expiry. Here, once a child has ended, its sessions
(found by the application_name every child connects with: ``brooq-child <identity>``,
on this database) are ended (pg_terminate_backend: a claim still running rolls back),
and once none is left, and the death's settlement is written, whatever the child still
holds besides the jobs it was running goes back to pending with the attempt refunded
(job_release_dead_worker).

A source of the master's loop with no descriptor: its deadline is the next look, a few
a second while a session lingers, given up after the lease (the reaper's business then).
Children behind a pooler are not followed: their server sessions are the pooler's.

Must never wait: one short statement per dead child per look, on the maintenance
connection (whose lock_timeout bounds the release), and nothing while the database is
away or the death is not yet settled.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import partial
from typing import Any

import psycopg

from brooq.metrics import Metrics
from brooq.supervisor.accounting import Accounting
from brooq.supervisor.childproc import ChildProc
from brooq.supervisor.connections import Connections
from brooq.supervisor.source import Source

log = logging.getLogger("brooq.master")

FIRST_LOOK = 0.05  # seconds after the death; then doubling, up to LOOK_MAX
LOOK_MAX = 1.0
APP_NAME_MAX = 63  # PostgreSQL's application_name: longer names are cut (ambiguous)


def session_name(identity: str) -> str:
    """The application_name a child connects with (brooq.worker.connection)."""
    return f"brooq-child {identity}"


@dataclass
class _Dead:
    identity: str
    name: str
    running: list[uuid.UUID]
    give_up_at: float
    look_at: float
    wait: float = FIRST_LOOK
    may_end: bool = True  # False once the role was refused pg_terminate_backend


class Leftovers(Source):
    def __init__(
        self,
        conns: Connections,
        accounting: Accounting,
        lease: float,
        metrics: Metrics | None,
        clock: Callable[[], float],
        *,
        follow: bool = True,
    ) -> None:
        self.follow = follow  # False behind a pooler
        self.conns = conns
        self.accounting = accounting
        self.lease = lease
        self.metrics = metrics
        self.clock = clock
        self.dead: list[_Dead] = []
        self._known: dict[int, ChildProc] = {}  # the children at the last change

    def children_changed(self, children: dict[int, ChildProc]) -> None:
        """A child was forked or reaped: the ones gone since the last change died."""
        for pid, c in self._known.items():
            if pid not in children:  # reaped, its death settled (or queued)
                self.died(c)
        self._known = dict(children)

    def died(self, c: ChildProc) -> None:
        """A child was reaped (its death settled or queued for the accounting)."""
        name = session_name(c.identity)
        if not self.follow or len(name) > APP_NAME_MAX:
            return  # cut by the server: it could name another child's session
        now = self.clock()
        running = [j.id for j in c.jobs]
        if c.kill_job is not None and c.kill_job not in running:
            running.append(c.kill_job)
        self.dead.append(_Dead(c.identity, name, running, now + self.lease, now + FIRST_LOOK))

    # -- the source ----------------------------------------------------------------------

    def read_fds(self) -> list[int]:
        return []

    def fds(self) -> list[int]:
        return []

    def next_deadline(self) -> float | None:
        return min((d.look_at for d in self.dead), default=None)

    def service(self, readable: Collection[int], writable: Collection[int] = ()) -> None:
        if not self.dead:
            return
        now = self.clock()
        owed = {f.identity for f in self.accounting.pending_failures}
        owed.update(self.accounting.pending_releases)
        for d in list(self.dead):
            if now < d.look_at or d.identity in owed:
                continue  # the death's own settlement first: the running job's attempt
            if now >= d.give_up_at:
                self.dead.remove(d)
                log.warning(
                    "event=child_session_lingers worker=%s: what it still holds goes back "
                    "when its lease expires",
                    d.identity,
                )
                continue
            done = self.conns.with_db("child_leftovers", partial(self._look, d=d))
            if done:
                self.dead.remove(d)
            else:
                d.look_at = now + d.wait
                d.wait = min(d.wait * 2, LOOK_MAX)

    def _look(self, conn: psycopg.Connection[Any], d: _Dead) -> bool:
        """End the child's sessions; once none is left, give back what it still holds.
        Whether that is done."""
        q = self.conns.q
        if d.may_end:
            try:
                sessions = conn.execute(q.child_session_end, {"name": d.name}).fetchall()
            except psycopg.errors.InsufficientPrivilege:
                d.may_end = False  # another role's sessions: wait for them to go
                log.warning(
                    "event=child_session_not_ended worker=%s: the master's role may not "
                    "end it (pg_signal_backend); waiting for it to go",
                    d.identity,
                )
                return False
        else:
            sessions = conn.execute(q.child_session_find, {"name": d.name}).fetchall()
        if sessions:
            return False
        rows = conn.execute(
            q.job_release_dead_worker, {"worker": d.identity, "running": d.running}
        ).fetchall()
        for job_id, topic in rows:
            log.warning(
                "event=job_returned job=%s topic=%s attempt_refunded=1 "
                "because=claimed_after_child_ended worker=%s",
                job_id,
                topic,
                d.identity,
            )
        if self.metrics is not None and rows:
            self.metrics.jobs_returned.labels("returned").inc(len(rows))
        return True
