"""The check a pooled connection passes before a Queue hands it out, without a round trip
when the connection was in use a moment ago.

psycopg_pool's own ``check_connection`` sends an empty query on every checkout: one more
round trip for each ``Queue.enqueue``, a large part of a single enqueue's time
(benchmarks/README.md, "Single enqueue and durability"). A connection the server has
ended (a terminated backend, a shutdown, a crash: the kernel closes the socket when the
backend dies) has something to read, its FATAL message or the end of the stream, while a
live idle one has nothing (brooq's pooled connections never LISTEN). So the full check
runs only when the socket is readable, when libpq already knows the connection is bad, or
when the connection was last handed out more than ``IDLE_CHECK_S`` ago: a peer or a
firewall that dropped an idle connection without a word is still caught by the round
trip, as before, before a job's INSERT could meet it.

Owns: that check, for the sync and the async pool, with the look at each connection's
socket made once (``poller``); Queue.enqueue's own connection (brooq.producer.line)
applies the same rule on a record of its own.
Must never: run a statement on a connection it has not found suspect, or read what the
socket holds (the full check does, and the pool drops a connection that fails it).
"""

from __future__ import annotations

import select
import time
import weakref
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import pq
from psycopg_pool import AsyncConnectionPool, ConnectionPool

# Above this many seconds since its last checkout a connection gets the full check (one
# round trip); below it, only the local look at its socket.
IDLE_CHECK_S = 2.0

# Per connection: when it was last handed out and the look at its socket (made once: a
# connection keeps its socket for life), per process (pools are per process). A
# mutable record, updated in place: a checkout runs this once, and every dictionary store
# would make a new weak reference (the cost here is the code and the memory a call
# touches, most of it cold after the wait for the previous commit).
_handed_out: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
_READABLE = select.POLLIN | select.POLLERR | select.POLLHUP if hasattr(select, "poll") else 0
_OK = int(pq.ConnStatus.OK)
_IDLE = int(pq.TransactionStatus.IDLE)


def suspect(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """True when the connection needs the full check before it is used (the pools'
    checkout, and Queue.enqueue's own connection, brooq.producer.line)."""
    now = time.monotonic()
    seen = _handed_out.get(conn)
    pgconn = conn.pgconn
    if seen is None:
        try:
            look = poller(pgconn.socket)
        except (OSError, ValueError, psycopg.Error):
            return True
        _handed_out[conn] = [now, look]
        return True
    last, look = seen
    seen[0] = now
    if now - last > IDLE_CHECK_S:
        return True
    # libpq's own view, as plain ints (psycopg's conn.info builds an object per call).
    if pgconn.status != _OK or pgconn.transaction_status != _IDLE:
        return True
    try:
        return bool(look(0))
    except (OSError, ValueError):
        return True


def poller(fd: int) -> Callable[[int], list[Any]]:
    """A look at socket ``fd``: called with 0, a non-empty list when it has something to
    read or is gone (made once per connection: a poll object registered for those
    events; select on Windows)."""
    if not hasattr(select, "poll"):

        def look(timeout: int) -> list[Any]:
            try:
                return select.select([fd], [], [], timeout)[0]
            except (OSError, ValueError):
                return [fd]  # a socket select cannot look at: suspect

        return look
    poll = select.poll()
    poll.register(fd, _READABLE)
    return poll.poll


def check_connection(conn: psycopg.Connection[Any]) -> None:
    """The pool's ``check`` callback: raise if ``conn`` is broken (the pool then drops it
    and hands out another)."""
    if suspect(conn):
        ConnectionPool.check_connection(conn)


async def check_connection_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """``check_connection`` for the async pool."""
    if suspect(conn):
        await AsyncConnectionPool.check_connection(conn)
