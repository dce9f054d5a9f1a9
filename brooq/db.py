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

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import conninfo

from brooq.dsn import (
    CLIENT_ENCODING,
    DEFAULT_CONNECT_TIMEOUT,
    answered,
    describe,
    preferred,
    session_options,
    timeout_kwargs,
    without_driver,
)
from brooq.errors import DatabaseUnavailable, PoolerMismatch, ReadOnlyDatabase, SchemaMissing
from brooq.sql import Q

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
    brooq's; UTF-8. SQLAlchemy's postgresql+psycopg:// form taken as postgresql://.
    psycopg's errors as they are."""
    dsn = without_driver(dsn)
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


# -- behind a transaction pooler -------------------------------------------------------------------
# Running behind a transaction pooler (PgBouncer's pool_mode=transaction; docs/poolers.md).
#
# A transaction pooler hands each transaction to whichever server connection is free, so
# nothing may outlive a transaction on a connection through it: no session setting, no
# prepared statement, no LISTEN, no session advisory lock. ``QUEUE_POOLER=transaction``
# (Settings.pooler) says DATABASE_URL goes through one.
#
# Owns: how brooq's connections on DATABASE_URL are opened in each mode (brooq's session
# settings in the libpq ``options`` startup parameter, or no ``options`` and prepared
# statements off), the parameters of the statement that sets those settings for one
# transaction instead, the rule that the pooled mode needs a direct connection for LISTEN,
# and the readable errors for a pooler brooq was not told about.
# Must never: open a connection, run SQL itself (callers do), or show a connection string.

NONE = "none"
TRANSACTION = "transaction"

HOW = (
    "set QUEUE_POOLER=transaction, and QUEUE_LISTEN_DATABASE_URL to a connection that "
    "reaches PostgreSQL directly (docs/poolers.md)"
)
# PgBouncer's answer to a startup parameter it does not know (`options` among them).
REFUSED = "unsupported startup parameter"


def connect_kwargs(mode: str, dsn: str, session: Mapping[str, str]) -> dict[str, Any]:
    """psycopg.connect's keyword arguments for one of brooq's connections on ``dsn``.

    Direct: ``session`` rides in the ``options`` startup parameter (added to the DSN's
    own). Pooled: no ``options`` (PgBouncer refuses the parameter, or with
    ignore_startup_parameters drops it silently), and no prepared statements: one
    prepared on a server connection is unknown to the next transaction's (PgBouncer
    before 1.21 does not track them). ``prepare_threshold=None`` also overrides the
    ``prepare=True`` of brooq's hot statements. Both: UTF-8 (dsn.CLIENT_ENCODING)."""
    if mode == TRANSACTION:
        return {"prepare_threshold": None, "client_encoding": CLIENT_ENCODING}
    if session:
        return {"options": session_options(dsn, session), "client_encoding": CLIENT_ENCODING}
    return {"client_encoding": CLIENT_ENCODING}


def local_params(session: Mapping[str, str]) -> dict[str, list[str]]:
    """The parameters of Q.session_settings_local for ``session``."""
    return {"names": list(session), "values": [str(v) for v in session.values()]}


def need_direct(mode: str, dsn: str, listen_dsn: str, who: str) -> str | None:
    """The problem with running ``who`` pooled without a direct connection, if any."""
    if mode == TRANSACTION and listen_dsn == dsn:
        return (
            f"{who}: QUEUE_POOLER=transaction needs QUEUE_LISTEN_DATABASE_URL (or "
            "QUEUE_LISTEN_DATABASE_URL_FILE), a connection that reaches PostgreSQL "
            "directly: LISTEN cannot go through a transaction pooler"
        )
    return None


def refused_hint(reason: str) -> str:
    """What to add to a connect failure's reason when a pooler refused ``options``."""
    if REFUSED in reason:
        return f" (a pooler such as PgBouncer refuses brooq's session options: {HOW})"
    return ""


def options_ignored(name: str, wanted: str, got: str) -> PoolerMismatch:
    return PoolerMismatch(
        f"the server has {name}={got}, not the {wanted} brooq asked for in the connection's "
        f"options: something between brooq and PostgreSQL (a pooler with "
        f"ignore_startup_parameters) drops them; {HOW}"
    )


# SQLSTATEs of a prepared statement the server connection does not have (26000), has
# already (42P05); a Bind naming another statement's prepared name is a protocol error.
_PREPARED_STATES = ("26000", "42P05")


def prepared_mismatch(exc: psycopg.Error) -> PoolerMismatch | None:
    """A readable error for a prepared statement lost to a transaction pooler, or None."""
    message = (exc.diag.message_primary or str(exc)) if exc.diag else str(exc)
    if exc.sqlstate in _PREPARED_STATES or (
        exc.sqlstate == "08P01" and "prepared statement" in message
    ):
        return PoolerMismatch(
            f"{message.strip()}: the connection's transactions run on different server "
            "connections, as behind a transaction pooler (PgBouncer before 1.21, or "
            f"without max_prepared_statements), so brooq's prepared statements break; {HOW}"
        )
    return None


# -- a standby -------------------------------------------------------------------------------------
# A server that refuses writes: telling a standby from a primary, and saying so.
#
# brooq writes on every connection it makes to DATABASE_URL: producers insert, children
# claim, the master renews and reaps, the CLI changes jobs. A connection string that
# names a standby (or several servers without ``target_session_attrs=read-write``, one of
# them a standby) would otherwise fail every write with PostgreSQL's "cannot execute
# UPDATE in a read-only transaction", or be retried by the master and its children for
# ever. So brooq looks when it connects, at no cost on PostgreSQL 14 and later (the server
# reports ``in_hot_standby`` when the session starts; one ``pg_is_in_recovery()`` on
# PostgreSQL 13), and turns a write refused for being read-only into ReadOnlyDatabase,
# whose message names the server (never a password) and what to change
# (docs/how-to/high-availability.md).
#
# Owns: that look (``in_recovery``, ``refuse_standby``), the words of the refusal
# (``refusal``, ``read_only``), and mapping a read-only refusal met on a connection
# (``refused_on``).
# Must never: retry, keep a connection, or refuse a server for anything but being
# read-only.

HINT = (
    "brooq writes to a primary only: name the primary, or list every server with "
    "target_session_attrs=read-write (postgresql://USER@HOST1,HOST2/DB?"
    "target_session_attrs=read-write)"
)


def _server(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> str:
    """user@host:port/dbname of the server this connection reached (of the hosts a
    multi-host DSN lists, the one it is on)."""
    info = conn.info
    return describe(
        conninfo.make_conninfo(user=info.user, host=info.host, port=info.port, dbname=info.dbname)
    )


def reported(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool | None:
    """Whether the server reported itself a hot standby when the session began
    (PostgreSQL 14 and later); None when it did not say."""
    value = conn.info.parameter_status("in_hot_standby")
    return None if value is None else value == "on"


def in_recovery(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server of ``conn`` is a standby: what it reported, else one statement."""
    found = reported(conn)
    if found is not None:
        return found
    row = conn.execute(Q.server_in_recovery).fetchone()
    return bool(row and row[0])


def refusal(server: str, standby: bool | None = True) -> ReadOnlyDatabase:
    """The error for a read-only ``server`` (user@host:port/dbname): a standby in
    recovery (``standby``), a primary whose sessions are read-only (False), or either
    (None: not known)."""
    if standby:
        what = "is a read-only standby (in recovery)"
    elif standby is None:
        what = "is read-only (a standby in recovery, or default_transaction_read_only is on)"
    else:
        what = "refuses writes: default_transaction_read_only is on"
    return ReadOnlyDatabase(f"the database server {server} {what}: {HINT}")


def read_only(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any] | None, dsn: str = ""
) -> ReadOnlyDatabase:
    """ReadOnlyDatabase for a write refused as read-only on ``conn`` (or, without it, on
    ``dsn``'s server, whichever kind of read-only it is)."""
    if conn is None:
        return refusal(describe(dsn), None)
    try:
        server, standby = _server(conn), reported(conn)
    except psycopg.Error:  # the connection is gone meanwhile
        return refusal(describe(dsn), None)
    return refusal(server, standby)


def refuse_standby(conn: psycopg.Connection[Any]) -> None:
    """Raise ReadOnlyDatabase (and close ``conn``) when it reached a standby."""
    try:
        standby = in_recovery(conn)
    except psycopg.Error:
        return  # lost meanwhile: the caller's next statement says so
    if standby:
        error = refusal(_server(conn))
        conn.close()
        raise error


@contextmanager
def refused_on(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> Iterator[None]:
    """A write refused as read-only inside the block, as ReadOnlyDatabase."""
    try:
        yield
    except psycopg.errors.ReadOnlySqlTransaction:
        raise read_only(conn) from None
