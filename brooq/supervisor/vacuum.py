"""The master's own VACUUM of the job table, started when its dead tuples pile up and
waited for in the loop's select, never in a blocking call.

Why (issue 21, measured): a queue drains from the front of its ready index, and every
claimed job leaves its entry there until a VACUUM removes it; a claim walks those pages
before it finds a live row. Autovacuum looks at a database once per
``autovacuum_naptime`` (a minute by default), and a server may run without it (this
project's CI service does): draining 1,000,000 ready jobs with no vacuum, the claims
walked ~9,000 index pages each, the drain ran at 4,700 jobs/s and an idle pickup took
18 ms instead of 2. So every QUEUE_VACUUM_PERIOD the master reads the table's dead
tuples (a catalog read), and past QUEUE_VACUUM_DEAD_TUPLES it sends
``VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON)`` on a connection of its own and goes on: the
answer is read when its socket is readable. SKIP_LOCKED: when autovacuum or another
master is already at it, the statement returns at once. INDEX_CLEANUP ON: the default
(AUTO) skips the indexes when few heap pages hold dead tuples, and the ready index is
what needs the cleaning.

Owns: the vacuum connection, the decision, and the statement in flight. Must never wait
on the server (a send, then reads of what arrived), hold a lock, or touch a child.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import pq

from brooq.db import connect
from brooq.dsn import session_options
from brooq.errors import BrooqError
from brooq.sql import Queries
from brooq.supervisor.connections import MASTER_CONNECT_TIMEOUT, Connections

log = logging.getLogger("brooq.master")

VACUUM = "vacuum"
# A VACUUM with no answer after this long is given up (its connection closed, so a lost
# server or a cut network cannot stop every later vacuum); a real one on a big table
# takes minutes, not hours.
GIVE_UP_AFTER = 3600.0


class Vacuum:
    """A duty (brooq.supervisor.duties.Scheduler) and a descriptor of the master's select."""

    name = VACUUM
    first_after = 1.0

    def __init__(
        self,
        conns: Connections,
        dsn: str,
        threshold: int,
        period: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.conns = conns
        self.dsn = dsn
        self.threshold = threshold
        self.period = period
        self.clock = clock
        self.conn: psycopg.Connection[Any] | None = None
        self.started_at: float | None = None  # the statement in flight, when it was sent
        self.dead_at_start = 0.0
        self.runs = 0  # VACUUMs finished (their answer read), for tests and logs

    @property
    def q(self) -> Queries:
        return self.conns.q

    # -- the duty: decide and send ---------------------------------------------------------

    def run_once(self, now: float) -> dict[str, int]:
        if self.started_at is not None and self.clock() - self.started_at > GIVE_UP_AFTER:
            log.warning("event=vacuum_failed error='no answer after %.0f s'", GIVE_UP_AFTER)
            self._drop()
        if self.threshold <= 0 or self.started_at is not None:  # 0: autovacuum's; one at a time
            return {}
        row = self.conns.with_db(
            "vacuum_check", lambda c: c.execute(self.q.job_table_health).fetchone()
        )
        if row is None:
            return {}
        dead = float(row[0])
        if dead < self.threshold:
            return {}
        if not self._send():
            return {}
        self.started_at, self.dead_at_start = self.clock(), dead
        log.info("event=vacuum_started dead_tuples=%d", dead)
        return {"started": 1}

    def _send(self) -> bool:
        try:
            if self.conn is None or self.conn.closed:
                self.conn = connect(
                    self.dsn,
                    autocommit=True,
                    connect_timeout=MASTER_CONNECT_TIMEOUT,
                    # A VACUUM may take minutes on a big table: no statement timeout, and
                    # SKIP_LOCKED instead of a lock wait.
                    options=session_options(self.dsn, {"statement_timeout": "0"}),
                    application_name="brooq-master-vacuum",
                )
            pgconn = self.conn.pgconn
            pgconn.send_query(self.q.job_vacuum.encode())
            while pgconn.flush():  # the statement is short: the socket takes it at once
                pass
            return True
        except (psycopg.Error, OSError, BrooqError) as exc:
            log.warning("event=vacuum_failed error=%r", str(exc).strip())
            self._drop()
            return False

    # -- the loop: read what arrived -------------------------------------------------------

    def read_fds(self) -> list[int]:
        if self.started_at is None or self.conn is None or self.conn.closed:
            return []
        return [self.conn.pgconn.socket]

    def fds(self) -> list[int]:
        """Every descriptor of ours (a forked child closes them)."""
        return [self.conn.fileno()] if self.conn is not None and not self.conn.closed else []

    def service(self, readable: set[int]) -> None:
        if self.started_at is None or self.conn is None:
            return
        pgconn = self.conn.pgconn
        if pgconn.socket not in readable:
            return
        try:
            pgconn.consume_input()
            error = ""
            while not pgconn.is_busy():
                result = pgconn.get_result()
                if result is None:
                    self._done(error)
                    return
                if result.status == pq.ExecStatus.FATAL_ERROR:
                    error = (result.error_message or b"").decode(errors="replace").strip()
        except (psycopg.Error, OSError) as exc:
            self._done(str(exc).strip())
            self._drop()

    def _done(self, error: str) -> None:
        assert self.started_at is not None
        took = self.clock() - self.started_at
        self.started_at = None
        self.runs += 1
        if error:
            log.warning("event=vacuum_failed seconds=%.2f error=%r", took, error)
        else:
            log.info(
                "event=vacuum_done seconds=%.2f dead_tuples_before=%d", took, self.dead_at_start
            )

    def _drop(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                self.conn.close()
        self.conn = None
        self.started_at = None

    def close(self) -> None:
        """At the master's end: a VACUUM in flight is canceled, not left running."""
        if self.conn is not None and self.started_at is not None:
            with contextlib.suppress(Exception):  # best effort on the way out
                self.conn.cancel_safe(timeout=2.0)
        self._drop()
