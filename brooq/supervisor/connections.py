"""The master's two database connections: maintenance, and LISTEN for new jobs.

Both go to the direct connection string (QUEUE_LISTEN_DATABASE_URL, else DATABASE_URL;
docs/poolers.md): LISTEN cannot go through a transaction pooler, and the maintenance
connection's timeouts are session settings, which a transaction pooler would not keep.

Owns connecting them (refusing a standby, and, the first time, checking brooq's schema
when brooq-master could not before it forked), the reconnection backoff (0.5 s doubling
to 5 s), running one maintenance call on the maintenance connection (with_db), reading
notifications, and the libpq options and timeouts that keep every statement of the
master short.

It must never block the loop for longer than a connect timeout or a statement timeout,
never retry inside a call (a failed call waits for the next pass after the backoff), and
never let a database error escape: the master keeps supervising while the database is
away. A child never uses these connections: after fork they are closed at the
descriptor level only (brooq.supervisor.fleet).
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Collection
from typing import Any, TypeVar

import psycopg

from brooq import migrate
from brooq.db import options_ignored, refuse_standby
from brooq.dsn import CLIENT_ENCODING, describe, session_options
from brooq.errors import PoolerMismatch, ReadOnlyDatabase, SchemaMissing
from brooq.ipc.channel import CANCEL_CHANNEL, STACK_CHANNEL
from brooq.sql import Q, Queries, queries
from brooq.supervisor.source import Source

log = logging.getLogger("brooq.master")

T = TypeVar("T")

# Maintenance statements never hold the loop for long: row locks are skipped (SKIP
# LOCKED) and a table lock (DDL without CONCURRENTLY) is waited for at most this long.
MASTER_STATEMENT_TIMEOUT_MS = 10_000
MASTER_LOCK_TIMEOUT_MS = 2_000
MASTER_CONNECT_TIMEOUT = 3
RETRY_FIRST = 0.5
# At most this long between two attempts: a database back (a standby promoted after a
# failover) is found within it. A longer wait has both masters reconnect long after the
# promotion (tests/ha/test_failover.py), their LISTEN, renewals and reaper missing
# meanwhile; a connect every RETRY_MAX costs a server nothing.
RETRY_MAX = 5.0


# libpq's text for a server that answered and has no database of that name (no SQLSTATE
# comes with a failed connect); in a server speaking another language it is not found,
# and the master retries as for any failed connect.
_NO_DATABASE = re.compile(r'FATAL:\s+database "(.*)" does not exist')


class DatabaseMissing(SchemaMissing):
    """The server answered, and the database the connection string names is not there."""


def missing_database(dsn: str, exc: BaseException) -> DatabaseMissing | None:
    """DatabaseMissing, naming the database, when ``exc`` (a failed connect) says the
    server has no such database; None for any other failure (an outage: retried)."""
    found = _NO_DATABASE.search(str(exc))
    if found is None:
        return None
    return DatabaseMissing(
        f'the database "{found.group(1)}" does not exist on the server '
        f"({describe(dsn)}): create it and run `brooq migrate up`, or correct the "
        "connection string"
    )


def master_options(dsn: str) -> str:
    """libpq options of the master's maintenance connection: the DSN's own (search_path,
    ...; else PGOPTIONS), then the two timeouts, which win over a value given there: the
    loop's liveness depends on them."""
    return session_options(
        dsn,
        {
            "statement_timeout": str(MASTER_STATEMENT_TIMEOUT_MS),
            "lock_timeout": str(MASTER_LOCK_TIMEOUT_MS),
        },
    )


def check_options(conn: psycopg.Connection[Any]) -> None:
    """PoolerMismatch when the connection does not have the lock timeout its options
    asked for: a pooler between the master and PostgreSQL dropped them (PgBouncer's
    ignore_startup_parameters), and the master would LISTEN through it too."""
    ms = MASTER_LOCK_TIMEOUT_MS
    wanted = f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"  # as PostgreSQL shows it
    row = conn.execute(Q.session_setting_get, {"name": "lock_timeout"}).fetchone()
    got = str(row[0]) if row else "?"
    if got != wanted:
        raise PoolerMismatch(
            "QUEUE_LISTEN_DATABASE_URL (or DATABASE_URL) must reach PostgreSQL directly: "
            + str(options_ignored("lock_timeout", wanted, got))
        )


class Connections(Source):
    """``wake`` is called when jobs may be waiting (a notification, or LISTEN begun);
    ``reconnected`` after a connection came back following a failure."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        schema_verified: bool,
        wake: Callable[[], None],
        reconnected: Callable[[], None],
    ) -> None:
        self.dsn = dsn
        # QUEUE_SCHEMA: every statement of the master is its schema's (brooq.sql).
        self.schema = schema
        self.q: Queries = queries(schema)
        # The schema the job table is in (QUEUE_SCHEMA, or the one the search_path found
        # once checked): the job channel's payload names it, and a notification for
        # another schema's jobs (another installation in the same database) wakes no
        # child. None until known: every notification wakes.
        self.job_schema: str | None = schema
        self.db: psycopg.Connection[Any] | None = None
        self.listener: psycopg.Connection[Any] | None = None
        self.retry_at = 0.0
        self.delay = RETRY_FIRST
        self.ok = False  # the last attempt to use the database worked
        # brooq-master checks the schema before it forks when the database answers; when
        # it did not, the first connection made here checks it.
        self.schema_verified = schema_verified
        self.fatal: str | None = None  # the schema is missing: the master must stop
        self._wake = wake
        self._reconnected = reconnected
        # Called with a stack request's payload (a job id, unchecked) as it arrives.
        self.stack_requested: Callable[[str], None] | None = None
        # Called once per read with the payloads (job ids, unchecked) of the processing
        # jobs canceled meanwhile (job_cancel).
        self.cancels_heard: Callable[[list[str]], None] | None = None

    @property
    def connected(self) -> bool:
        return self.db is not None and self.listener is not None

    def read_fds(self) -> list[int]:
        """The LISTEN connection's socket: its notifications are read when it is readable."""
        return [self.listener.fileno()] if self.listener is not None else []

    def service(self, readable: Collection[int], writable: Collection[int] = ()) -> None:
        if self.listener is not None and self.listener.fileno() in readable:
            self.read_notifications()

    def fds(self) -> list[int]:
        """The descriptors of the open connections (a forked child closes them)."""
        return [c.fileno() for c in (self.db, self.listener) if c is not None and not c.closed]

    def connect(self) -> bool:
        if self.connected:
            return True
        if time.monotonic() < self.retry_at:
            return False
        try:
            if self.db is None:
                self.db = psycopg.connect(
                    self.dsn,
                    autocommit=True,
                    connect_timeout=MASTER_CONNECT_TIMEOUT,
                    options=master_options(self.dsn),
                    application_name="brooq-master",
                    client_encoding=CLIENT_ENCODING,
                )
                # A standby (the DSN names one, without target_session_attrs=read-write):
                # refused like an unreachable server, said on every attempt.
                refuse_standby(self.db)
                check_options(self.db)
                if not self.schema_verified:
                    # The database was down when brooq-master checked before forking:
                    # without the schema every child would crash on its first claim.
                    self.job_schema = migrate.verify(self.db, self.schema)
                    self.schema_verified = True
                elif self.job_schema is None:
                    self.job_schema = migrate.verify(self.db, self.schema)
            if self.listener is None:
                self.listener = psycopg.connect(
                    self.dsn,
                    autocommit=True,
                    connect_timeout=MASTER_CONNECT_TIMEOUT,
                    application_name="brooq-master-listen",
                    client_encoding=CLIENT_ENCODING,
                )
                # The job channel last: what pg_stat_activity shows an operator (and the
                # fault tests look for) is the connection LISTENing for jobs.
                self.listener.execute(self.q.listen_stack_requests)
                self.listener.execute(self.q.listen_cancels)
                self.listener.execute(self.q.listen_jobs)
                # Anything enqueued while we were not listening: have a look now.
                self._wake()
        except (SchemaMissing, PoolerMismatch) as exc:
            self.fatal = str(exc)
            self.close()
            return False
        except (psycopg.Error, ReadOnlyDatabase) as exc:
            if not self.schema_verified and (missing := missing_database(self.dsn, exc)):
                # Down when brooq-master checked, up now without the database: as fatal
                # as a missing schema. Once verified, a database gone is retried.
                self.fatal = str(missing)
                self.close()
                return False
            self.failed("connect", exc)
            return False
        self.ok = True
        if self.delay > RETRY_FIRST:
            log.info("event=db_reconnected who=master")
            self._reconnected()
        self.delay = RETRY_FIRST
        return True

    def with_db(self, what: str, fn: Callable[[psycopg.Connection[Any]], T]) -> T | None:
        """fn(the maintenance connection), or None when the database is unreachable or
        the statement failed (logged)."""
        if not self.connect():
            return None
        assert self.db is not None
        try:
            return fn(self.db)
        except psycopg.OperationalError as exc:
            self.failed(what, exc)
        except psycopg.Error as exc:
            log.error("event=maintenance_error during=%s error=%r", what, str(exc).strip())
        return None

    def failed(self, what: str, exc: BaseException) -> None:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.warning(
            "event=db_error who=master during=%s retry_in=%.1fs error=%r",
            what,
            self.delay,
            first,
        )
        self.close()
        self.ok = False
        self.retry_at = time.monotonic() + self.delay
        self.delay = min(self.delay * 2, RETRY_MAX)

    def read_notifications(self) -> None:
        assert self.listener is not None
        got = False
        stacks: list[str] = []
        cancels: list[str] = []
        try:
            for notify in self.listener.notifies(timeout=0):
                if notify.channel == STACK_CHANNEL:
                    stacks.append(notify.payload)
                elif notify.channel == CANCEL_CHANNEL:
                    cancels.append(notify.payload)
                elif notify.payload in ("", self.job_schema) or self.job_schema is None:
                    got = True  # "": an older brooq's trigger, for whichever schema
        except psycopg.Error as exc:
            self.failed("listen", exc)
            return
        if got:
            self._wake()
        for payload in stacks:
            if self.stack_requested is not None:
                self.stack_requested(payload)
        if cancels and self.cancels_heard is not None:
            self.cancels_heard(cancels)

    def close(self) -> None:
        for conn in (self.db, self.listener):
            if conn is not None:
                with contextlib.suppress(Exception):  # closing a broken connection
                    conn.close()
        self.db = self.listener = None
