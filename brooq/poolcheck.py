"""The check a pooled connection passes before a Queue hands it out, without a round trip
when the connection was in use a moment ago.

psycopg_pool's own ``check_connection`` sends an empty query on every checkout: one more
round trip for each ``Queue.enqueue``, a fifth of a single enqueue's time (measured in
benchmarks/README.md, "Single enqueue"). A connection the server has ended (a
terminated backend, a shutdown, a crash: the kernel closes the socket when the backend
dies) has something to read, its FATAL message or the end of the stream, while a live
idle one has nothing (brooq's pooled connections never LISTEN). So the full check runs
only when the socket is readable, when libpq already knows the connection is bad, or
when the connection was last handed out more than ``IDLE_CHECK_S`` ago: a peer or a
firewall that dropped an idle connection without a word is still caught by the round
trip, as before, before a job's INSERT could meet it.

Owns: that check, for the sync and the async pool.
Must never: run a statement on a connection it has not found suspect, or read what the
socket holds (the full check does, and the pool drops a connection that fails it).
"""

from __future__ import annotations

import select
import time
import weakref
from typing import Any

import psycopg
from psycopg import pq
from psycopg_pool import AsyncConnectionPool, ConnectionPool

# Above this many seconds since its last checkout a connection gets the full check (one
# round trip); below it, only the local look at its socket.
IDLE_CHECK_S = 2.0

# When each pooled connection was last handed out, per process (pools are per process).
_handed_out: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


def _suspect(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """True when the connection needs the full check before it is used."""
    now = time.monotonic()
    last = _handed_out.get(conn)
    _handed_out[conn] = now
    if last is None or now - last > IDLE_CHECK_S:
        return True
    pgconn = conn.pgconn
    if (
        pgconn.status != pq.ConnStatus.OK
        or conn.info.transaction_status != pq.TransactionStatus.IDLE
    ):
        return True
    try:
        has_data = readable(pgconn.socket)
    except (OSError, ValueError, psycopg.Error):
        return True
    return has_data


def readable(fd: int) -> bool:
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
        return bool(poller.poll(0))
    ready, _, _ = select.select([fd], [], [], 0)  # Windows: no poll()
    return bool(ready)


def check_connection(conn: psycopg.Connection[Any]) -> None:
    """The pool's ``check`` callback: raise if ``conn`` is broken (the pool then drops it
    and hands out another)."""
    if _suspect(conn):
        ConnectionPool.check_connection(conn)


async def check_connection_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """``check_connection`` for the async pool."""
    if _suspect(conn):
        await AsyncConnectionPool.check_connection(conn)
