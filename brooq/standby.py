"""A server that refuses writes: telling a standby from a primary, and saying so.

brooq writes on every connection it makes to DATABASE_URL: producers insert, children
claim, the master renews and reaps, the CLI changes jobs. A connection string that
names a standby (or several servers without ``target_session_attrs=read-write``, one of
them a standby) would otherwise fail every write with PostgreSQL's "cannot execute
UPDATE in a read-only transaction", or be retried by the master and its children for
ever. So brooq looks when it connects, at no cost on PostgreSQL 14 and later (the server
reports ``in_hot_standby`` when the session starts; one ``pg_is_in_recovery()`` on
PostgreSQL 13), and turns a write refused for being read-only into ReadOnlyDatabase,
whose message names the server (never a password) and what to change
(docs/how-to/high-availability.md).

Owns: that look (``in_recovery``, ``refuse_standby``), the words of the refusal
(``refusal``, ``read_only``), and mapping a read-only refusal met on a connection
(``refused_on``).
Must never: retry, keep a connection, or refuse a server for anything but being
read-only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import conninfo

from brooq.dsn import describe
from brooq.errors import ReadOnlyDatabase
from brooq.sql import Q

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
