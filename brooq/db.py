"""Connections: opened late, named without passwords, errors made readable.

Owns: opening a plain connection for a command, a check or a listener (the connect
timeout the user gave, else brooq's: brooq.dsn.timeout_kwargs; the host that answered
last tried first: brooq.dsn.preferred), and
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

from brooq.dsn import (
    CLIENT_ENCODING,
    DEFAULT_CONNECT_TIMEOUT,
    answered,
    describe,
    preferred,
    timeout_kwargs,
)
from brooq.errors import DatabaseUnavailable, SchemaMissing
from brooq.pooler import prepared_mismatch, refused_hint
from brooq.standby import read_only

# brooq's connect timeout per host when the DSN and PGCONNECT_TIMEOUT set none.
CONNECT_TIMEOUT = DEFAULT_CONNECT_TIMEOUT


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


def open_connection(dsn: str, **kwargs: Any) -> psycopg.Connection[tuple[Any, ...]]:
    """psycopg.connect on ``dsn``: its hosts in order, but the one that answered last in
    this process first; the DSN's connect_timeout (or PGCONNECT_TIMEOUT) per host, else
    brooq's; UTF-8. psycopg's errors as they are."""
    for key, value in timeout_kwargs(dsn).items():
        kwargs.setdefault(key, value)
    kwargs.setdefault("client_encoding", CLIENT_ENCODING)
    conn = psycopg.connect(preferred(dsn), **kwargs)
    answered(dsn, conn)
    return conn


def connect(dsn: str, **kwargs: Any) -> psycopg.Connection[tuple[Any, ...]]:
    """``open_connection``, DatabaseUnavailable when ``dsn`` cannot be reached."""
    try:
        return open_connection(dsn, **kwargs)
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
