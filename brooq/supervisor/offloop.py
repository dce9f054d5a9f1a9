"""A statement the master sends and reads later: on a connection of its own, without
waiting, its answer read when the loop's select finds the socket readable.

For what may take seconds (a VACUUM of the job table, the stats duty's count of a
backlog of millions): the loop goes on waking children, renewing leases and answering
the ops socket meanwhile. One statement in flight at a time per OffLoop; one that gets
no answer within the caller's limit is given up (its connection closed), so a lost
server or a cut network cannot stop the duty for good.

Owns: that connection and the statement in flight. Must never wait on the server (a
connect when there is no connection, then a send, then reads of what arrived), hold a
lock, or touch a child.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq

from brooq.db import connect
from brooq.dsn import session_options
from brooq.errors import BrooqError
from brooq.supervisor.connections import MASTER_CONNECT_TIMEOUT

log = logging.getLogger("brooq.master")


@dataclass
class Answer:
    """What a statement came to: its results (one per statement of the text), the
    server's error (empty when none) and how long it took from the send."""

    results: list[pq.abc.PGresult]
    error: str
    seconds: float


class OffLoop:
    """One connection, one statement in flight (see the module docstring)."""

    def __init__(
        self,
        dsn: str,
        name: str,
        session: dict[str, str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.dsn = dsn
        self.name = name  # in the application name and the log events (event=NAME_failed)
        self.session = session  # the connection's settings (a statement timeout, say)
        self.clock = clock
        self.conn: psycopg.Connection[Any] | None = None
        self.started_at: float | None = None  # the statement in flight, when it was sent
        self._results: list[pq.abc.PGresult] = []

    @property
    def busy(self) -> bool:
        return self.started_at is not None

    def overdue(self, limit: float) -> bool:
        return self.started_at is not None and self.clock() - self.started_at > limit

    def send(self, statement: str, params: Sequence[bytes | None] | None = None) -> bool:
        """Send ``statement`` (without ``params``, several separated by ";" give one result
        each; with them, one statement whose $n placeholders take them, in text); False
        when it could not be sent (logged, the connection dropped)."""
        try:
            if self.conn is None or self.conn.closed:
                self.conn = connect(
                    self.dsn,
                    autocommit=True,
                    connect_timeout=MASTER_CONNECT_TIMEOUT,
                    options=session_options(self.dsn, self.session),
                    application_name=f"brooq-master-{self.name}",
                )
            pgconn = self.conn.pgconn
            if params is None:
                pgconn.send_query(statement.encode())
            else:
                pgconn.send_query_params(statement.encode(), params)
            while pgconn.flush():  # a short statement: the socket takes it at once
                pass
        except (psycopg.Error, OSError, BrooqError) as exc:
            log.warning("event=%s_failed error=%r", self.name, str(exc).strip())
            self.drop()
            return False
        self.started_at, self._results = self.clock(), []
        return True

    def read_fds(self) -> list[int]:
        """The socket to watch while a statement is in flight."""
        if self.started_at is None or self.conn is None or self.conn.closed:
            return []
        return [self.conn.pgconn.socket]

    def fds(self) -> list[int]:
        """Every descriptor of ours (a forked child closes them)."""
        return [self.conn.fileno()] if self.conn is not None and not self.conn.closed else []

    def service(self, readable: Collection[int]) -> Answer | None:
        """Read what arrived; the Answer once the statement is over, else None."""
        if self.started_at is None or self.conn is None:
            return None
        pgconn = self.conn.pgconn
        if pgconn.socket not in readable:
            return None
        try:
            pgconn.consume_input()
            while not pgconn.is_busy():
                result = pgconn.get_result()
                if result is None:
                    return self._finish("")
                self._results.append(result)
        except (psycopg.Error, OSError) as exc:
            answer = self._finish(str(exc).strip())
            self.drop()
            return answer
        return None

    def _finish(self, error: str) -> Answer:
        assert self.started_at is not None
        results, self._results = self._results, []
        if not error:
            failed = [r for r in results if r.status == pq.ExecStatus.FATAL_ERROR]
            if failed:
                error = (failed[0].error_message or b"").decode(errors="replace").strip()
        answer = Answer(results, error, self.clock() - self.started_at)
        self.started_at = None
        return answer

    def drop(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                self.conn.close()
        self.conn = None
        self.started_at = None
        self._results = []

    def close(self) -> None:
        """At the master's end: a statement in flight is canceled, not left running."""
        if self.conn is not None and self.started_at is not None:
            with contextlib.suppress(Exception):  # best effort on the way out
                self.conn.cancel_safe(timeout=2.0)
        self.drop()
