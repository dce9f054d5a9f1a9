"""The connection Queue.enqueue keeps for itself: one job, one round trip, through libpq.

A web request's single enqueue is a round trip and a commit; what Python adds on top is
the difference between brooq and a C client sending the same INSERT. psycopg's cursor
machinery (the query's conversion, the adaptation of seven parameters, the
prepared-statement bookkeeping, the non-blocking wait) and the pool's checkout and return
cost as much again as the server's own work without the commit (benchmarks/README.md,
"Single enqueue and durability"). So ``Queue.enqueue`` sends its statement here instead:
on one connection of its own, in autocommit, prepared once by name (``job_insert_one``,
``$n`` placeholders), with the id, the priority and ``available_at`` in binary and the
rest as text in the connection's encoding, straight through
``psycopg.pq.PGconn.exec_prepared`` (a documented libpq call that releases the GIL while
it waits). Behind a transaction pooler nothing is prepared: ``exec_params`` sends the
statement unnamed, still one round trip (docs/poolers.md).

One thread at a time: a thread that finds the line busy is told so (``None``) and takes
the pool instead, as does a job whose key is taken (the pool's path looks the existing
job up in brooq_job_key), even by a job that was enqueued and ended while the statement
ran (job_key_taken's unique violation: nothing was written). The line opens on first use
in a process, is forgotten unused after a fork (its socket is the parent's) and gets the
pools' check before each use, on a record of its own (brooq.producer.poolcheck's rule: a
look at the socket, a round trip after ``IDLE_CHECK_S`` idle); a connection found broken
is replaced, one lost during the statement is closed and the error raised (the caller
cannot know whether the job was written: the same as any statement whose answer is lost).

The libpq call cannot be interrupted by a signal while it waits for the answer: a
Ctrl-C during an enqueue takes effect when the statement returns. An unkeyed INSERT
waits on no row lock; a keyed one can wait for a concurrent transaction that inserted
the same key, as it would through psycopg.

Owns: that connection (refused when it reaches a standby: brooq.db), its prepared
statement, the parameters in libpq's form and the reading of the answer.
Must never: run a statement other than job_insert_one, the check and (on PostgreSQL 13)
the look for a standby, be used by two threads at once, or keep its connection across
fork().
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import uuid
import weakref
from collections.abc import Callable
from datetime import datetime, timezone
from time import monotonic
from typing import Any

import psycopg
from psycopg import errors, pq

from brooq.db import open_connection, read_only, refuse_standby
from brooq.job import Job
from brooq.producer import poolcheck
from brooq.producer.ids import uuid7_int, uuid_from_int
from brooq.sql import Queries

# The prepared statement's name on the line's connection (brooq_ so it cannot clash with
# psycopg's own _pg3_N names).
STATEMENT = b"brooq_job_insert_one"
# Parameter types and formats, in job_insert_one's order: id uuid (binary), topic,
# payload, key (text), available_at timestamptz (binary), queue (text), priority int2
# (binary), group (text). available_at goes in binary because its text form would be Python's
# isoformat, which PostgreSQL refuses for UTC offsets Python allows and it does not
# (-23:59, a fraction of a second: found by tests/db/test_enqueue_properties.py).
_TYPES = [2950, 25, 25, 25, 1184, 25, 21, 25]
_FORMATS = [1, 0, 0, 0, 1, 0, 1, 0]
_INT2 = struct.Struct("!h")
_INT8 = struct.Struct("!q")
_EPOCH_2000 = datetime(2000, 1, 1, tzinfo=timezone.utc)  # PostgreSQL's timestamp zero
_TUPLES_OK = int(pq.ExecStatus.TUPLES_OK)  # ints: no enum lookup per call
_OK = int(pq.ConnStatus.OK)
_IDLE = int(pq.TransactionStatus.IDLE)
# job_key_taken's refusal of a key another job holds (migration 0020), by its constraint.
_CONSTRAINT = pq.DiagnosticField.CONSTRAINT_NAME
_KEY_CONSTRAINT = b"brooq_job_key_pkey"


def _micros_since_2000(at: datetime) -> int:
    """An aware datetime as PostgreSQL's binary timestamptz: microseconds since
    2000-01-01 UTC, exactly (integer arithmetic, any UTC offset)."""
    delta = at - _EPOCH_2000
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _never_readable(timeout: int) -> list[tuple[int, int]]:
    return []


class EnqueueLine:
    """One connection for single enqueues (see the module docstring)."""

    _lock: threading.Lock
    _used: float

    def __init__(self, dsn: str, kwargs: dict[str, Any], q: Queries) -> None:
        self._dsn = dsn
        self._kwargs = kwargs
        # Behind a transaction pooler (pooler.connect_kwargs sets prepare_threshold=None)
        # nothing may be prepared: the statement goes unnamed each time.
        self._prepare = kwargs.get("prepare_threshold", 0) is not None
        self._statement = q.job_insert_one.encode()
        self._conn: psycopg.Connection[Any] | None = None
        self._encoding = "utf-8"
        self._forget()
        _LINES.add(self)

    def insert(self, job: Job, queue: str) -> tuple[uuid.UUID, bool] | None:
        """(id, True) once the job is committed; None when another thread holds the line
        or the job's key is taken (the caller then takes the pool's path). psycopg's
        errors as a psycopg statement would raise them."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            # poolcheck.suspect's look, written out on the line's own record (its last use
            # and the poll object on its socket): a single enqueue's Python runs cold after
            # the wait for the previous commit, and every call it makes costs there.
            pgconn, now = self._pgconn, monotonic()
            if (
                pgconn is None
                or now - self._used > poolcheck.IDLE_CHECK_S
                or pgconn.status != _OK
                or pgconn.transaction_status != _IDLE
                or self._poll(0)
            ):
                pgconn = self._ready()
            self._used = now
            enc = self._encoding
            job_id = uuid7_int()
            key, at, group = job.idempotency_key, job.available_at, job.group
            params = [
                job_id.to_bytes(16, "big"),
                job.topic.encode(enc),
                job.payload_json.encode(enc),
                None if key is None else key.encode(enc),
                None if at is None else _INT8.pack(_micros_since_2000(at)),
                queue.encode(enc),
                _INT2.pack(job.priority),
                None if group is None else group.encode(enc),
            ]
            try:
                if self._prepare:
                    # None is SQL NULL here as in exec_params (psycopg's stub omits it).
                    result = pgconn.exec_prepared(STATEMENT, params, _FORMATS, 1)  # type: ignore[arg-type]
                else:
                    result = pgconn.exec_params(self._statement, params, _TYPES, _FORMATS, 1)
            except BaseException:
                self._drop()  # an answer lost, or a signal's exception: start afresh
                raise
            if result.status != _TUPLES_OK:
                if result.error_field(_CONSTRAINT) == _KEY_CONSTRAINT:
                    # The key's job was enqueued and ended while the statement ran (its
                    # snapshot did not see the key): nothing written, the pool's path
                    # looks the job up.
                    return None
                self._raise(result)
            return (uuid_from_int(job_id), True) if result.ntuples == 1 else None
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _forget(self) -> None:
        """A fresh lock and no connection (a fork's child: the lock may have been held
        by a thread that does not exist here, the socket is the parent's; never closed)."""
        self._lock = threading.Lock()
        self._conn = None
        self._pgconn: pq.abc.PGconn | None = None
        self._used = 0.0  # monotonic; not read while there is no connection
        self._poll: Callable[[int], list[tuple[int, int]]] = _never_readable

    # -- the connection ----------------------------------------------------------------

    def _ready(self) -> pq.abc.PGconn:
        """The line's connection once ``insert`` found it suspect (or has none): checked
        by a round trip, else opened or replaced, its statement prepared."""
        conn = self._conn
        if conn is not None:
            try:
                conn.execute("")
            except psycopg.Error:
                self._drop()
                conn = None
        if conn is None:
            conn = open_connection(self._dsn, autocommit=True, **self._kwargs)
            try:
                # A standby (a DSN without target_session_attrs=read-write that landed on
                # one) is said at once, with what to change: brooq.db.
                refuse_standby(conn)
                if self._prepare:
                    result = conn.pgconn.prepare(STATEMENT, self._statement, _TYPES)
                    if result.status != pq.ExecStatus.COMMAND_OK:
                        # Not prepared (no table yet: not migrated): not kept either.
                        raise errors.error_from_result(result, encoding=conn.info.encoding)
                look = poolcheck.poller(conn.pgconn.socket)
            except BaseException:
                # Kept only once prepared: a line without its statement would answer
                # "prepared statement does not exist" (read as a pooler's doing).
                with contextlib.suppress(Exception):
                    conn.close()
                raise
            self._conn, self._pgconn, self._poll = conn, conn.pgconn, look
            self._encoding = conn.info.encoding
        return conn.pgconn

    def _drop(self) -> None:
        conn, self._conn, self._pgconn = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _raise(self, result: pq.abc.PGresult) -> None:
        """The error PostgreSQL answered, as psycopg's class for its SQLSTATE. The
        connection is dropped when the error ended its session; an error without a
        SQLSTATE on a connection gone bad is libpq's own ("server closed the connection
        unexpectedly"), an OperationalError as psycopg raises it."""
        conn = self._conn
        error = errors.error_from_result(result, encoding=self._encoding)
        if isinstance(error, errors.ReadOnlySqlTransaction):  # a read-only primary
            raise read_only(conn, self._dsn)
        if conn is not None and conn.pgconn.status != pq.ConnStatus.OK:
            self._drop()
            if not isinstance(error, psycopg.OperationalError):
                error = psycopg.OperationalError(str(error))
        raise error


# Every line of this process, so that a fork's child starts each afresh.
_LINES: weakref.WeakSet[EnqueueLine] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for line in list(_LINES):
        line._forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
