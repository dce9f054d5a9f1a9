"""Connections: opened late, named without passwords, errors made readable.

Owns: the connect timeout, opening a plain connection for a command or a check, and
turning libpq's and the server's failures into brooq's errors (DatabaseUnavailable naming
the database without its password, SchemaMissing saying to run `brooq migrate up`,
PoolerMismatch for prepared statements lost to a pooler, ReadOnlyDatabase for a write
refused by a read-only server: ``database_error``).
Must never: run SQL, keep a connection (callers own what they open), or let a password
into a message.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from brooq.dsn import CLIENT_ENCODING, describe
from brooq.errors import DatabaseUnavailable, SchemaMissing
from brooq.pooler import prepared_mismatch, refused_hint
from brooq.standby import read_only

CONNECT_TIMEOUT = 5


def unavailable(dsn: str, exc: BaseException) -> DatabaseUnavailable:
    """A DatabaseUnavailable naming the database and libpq's reason, never the password."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return DatabaseUnavailable(
        f"cannot reach the database {describe(dsn)}: {reason}{refused_hint(reason)}"
    )


# Operator intervention that ends the session: shutdown, crash, not accepting connections.
_SESSION_ENDED = ("57P01", "57P02", "57P03")


def lost_connection(exc: psycopg.OperationalError) -> bool:
    """Whether the error means the database could not be reached or the session was lost.

    Other OperationalErrors are answers from a live server (statement or lock timeout,
    a program limit such as an index row too large, out of memory) and keep their own
    type and message."""
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in _SESSION_ENDED


def connect(dsn: str, **kwargs: Any) -> psycopg.Connection[tuple[Any, ...]]:
    kwargs.setdefault("connect_timeout", CONNECT_TIMEOUT)
    kwargs.setdefault("client_encoding", CLIENT_ENCODING)
    try:
        return psycopg.connect(dsn, **kwargs)
    except psycopg.OperationalError as exc:
        raise unavailable(dsn, exc) from None


def schema_missing(exc: psycopg.errors.UndefinedTable) -> SchemaMissing:
    return SchemaMissing(
        f"{exc.diag.message_primary or exc}: the brooq schema is not installed in this "
        "database; run `brooq migrate up` (a deployment step) first"
    )


def database_error(exc: psycopg.Error, dsn: str) -> Exception:
    """The error to raise for a statement's failure on ``dsn``: brooq's own where it has
    one (no table, a lost or unreachable database, a pooler brooq was not told about),
    else ``exc`` itself."""
    if isinstance(exc, psycopg.errors.UndefinedTable):
        return schema_missing(exc)
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
        return read_only(None, dsn)  # which server, and why read-only: not known here
    if isinstance(exc, psycopg.OperationalError):
        if (mismatch := prepared_mismatch(exc)) is not None:
            return mismatch
        return unavailable(dsn, exc) if lost_connection(exc) else exc
    if isinstance(
        exc,
        psycopg.errors.InvalidSqlStatementName | psycopg.errors.DuplicatePreparedStatement,
    ):
        return prepared_mismatch(exc) or exc
    return exc


@contextmanager
def database_errors(dsn: str) -> Iterator[None]:
    """``database_error`` for whatever fails inside the block."""
    try:
        yield
    except psycopg.Error as exc:
        if (mapped := database_error(exc, dsn)) is exc:
            raise
        raise mapped from None
