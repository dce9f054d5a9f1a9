"""A Queue's pooled connections: one sync pool for producers and operators, one async pool
for the ``_async`` producers and waiters, each opened on first use in the process (and,
for the async one, the event loop) that uses it.

A pool inherited across fork() is dropped unused (never closed, since its sockets belong
to the parent), so no connection ever crosses a fork; the lock that guards opening is
replaced in a fork's child (one held by a parent's thread at the fork would never be
released there).

Owns: the pools' options (size, connect timeout, how long a series of reconnection
attempts lasts, the pooler mode's connect arguments: brooq.pooler), opening them
(DatabaseUnavailable when the database cannot be reached), their fork and event-loop
rules, the pooled connection and transaction a Queue hands out, and brooq's errors for
their failures (brooq.db.database_error, the pool's timeout, a read-only server:
brooq.standby).
Must never: run a statement of its own, or keep a connection across fork().
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from brooq.db import CONNECT_TIMEOUT, database_error, unavailable
from brooq.errors import BrooqError
from brooq.poolcheck import check_connection, check_connection_async
from brooq.pooler import connect_kwargs
from brooq.settings import Settings
from brooq.standby import read_only

# How long one series of the pools' reconnection attempts lasts. psycopg_pool retries a
# failed connect after 1 s, then doubles the pause, without a ceiling, for
# reconnect_timeout (5 min by default): after a failover that left no primary for 16 s
# the next attempt came 13 s after the promotion (tests/ha/test_failover.py). A short
# series (attempts 0, 1, 3 and 5 s after the first failure) then gives up; the next
# caller that finds no connection starts a new one, at once. Callers meanwhile get
# DatabaseUnavailable after the pool's timeout, as before.
RECONNECT_SERIES = 5.0


class Owner(Protocol):
    """What the pools read from their Queue, late: at the first connection."""

    pool_size: int

    @property
    def dsn(self) -> str: ...

    @property
    def settings(self) -> Settings: ...


class Pools:
    """The sync and async pools of one Queue."""

    def __init__(self, owner: Owner) -> None:
        self._owner = owner
        self._pool: ConnectionPool[Any] | None = None
        self._pool_pid = 0
        # Bound to the loop and process that opened it (dropped unused otherwise).
        self._apool: AsyncConnectionPool[Any] | None = None
        self._apool_owner: tuple[int, object] = (0, None)  # (pid, event loop)
        # Opening the async pool, per (pid, loop): tasks that first use it at once open
        # one pool, not one each.
        self._apool_lock: tuple[tuple[int, object], Any] = ((0, None), None)
        # Opening the sync pool, and the Queue's other connections (its enqueue line).
        self.lock = threading.Lock()
        _POOLS.add(self)

    # -- options and errors ---------------------------------------------------------------

    def connect_kwargs(self) -> dict[str, Any]:
        """psycopg.connect's arguments for the Queue's connections on its dsn: behind a
        transaction pooler, no prepared statements (brooq.pooler)."""
        owner = self._owner
        return {
            "connect_timeout": CONNECT_TIMEOUT,
            **connect_kwargs(owner.settings.pooler, owner.dsn, {}),
        }

    def _options(self) -> dict[str, Any]:
        """What the sync and the async pool share: opened by the caller, its size."""
        return {
            "min_size": 1,
            "max_size": max(1, self._owner.pool_size),
            "open": False,
            "timeout": CONNECT_TIMEOUT,
            "reconnect_timeout": RECONNECT_SERIES,
            "kwargs": self.connect_kwargs(),
        }

    def unavailable(self) -> BrooqError:
        """DatabaseUnavailable for a pool that could not hand out a connection, with
        libpq's reason when a direct connect fails too."""
        dsn = self._owner.dsn
        try:
            psycopg.connect(dsn, connect_timeout=CONNECT_TIMEOUT).close()
        except psycopg.Error as exc:
            return unavailable(dsn, exc)
        return unavailable(dsn, TimeoutError("timed out waiting for a pooled connection"))

    def error(self, exc: psycopg.Error) -> Exception:
        """brooq.db.database_error on this Queue's dsn."""
        return database_error(exc, self._owner.dsn)

    @contextmanager
    def errors(self) -> Iterator[None]:
        """brooq's errors for a pooled connection's failures (both pools)."""
        try:
            yield
        except PoolTimeout:
            raise self.unavailable() from None
        except psycopg.Error as exc:
            if (mapped := self.error(exc)) is exc:
                raise
            raise mapped from None

    # -- the sync pool ----------------------------------------------------------------------

    def sync(self) -> ConnectionPool[Any]:
        """This process's pool, opened on first use."""
        pool = self._pool
        if pool is not None and self._pool_pid == os.getpid():
            return pool
        with self.lock:  # threads' first uses at once open one pool, not several
            return self._open()

    def _open(self) -> ConnectionPool[Any]:
        if self._pool is not None and self._pool_pid != os.getpid():
            # Inherited across fork: the sockets are the parent's. Forget it, do not close it.
            self._pool = None
        if self._pool is None:
            pool: ConnectionPool[Any] = ConnectionPool(
                self._owner.dsn, check=check_connection, name="brooq", **self._options()
            )
            try:
                pool.open(wait=True, timeout=CONNECT_TIMEOUT)
            except PoolTimeout:
                pool.close(timeout=0)
                raise self.unavailable() from None
            self._pool, self._pool_pid = pool, os.getpid()
        return self._pool

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection (autocommit off); committed on success, rolled back on error."""
        pool = self.sync()
        with self.errors(), pool.connection() as conn:
            try:
                yield conn
            except psycopg.errors.ReadOnlySqlTransaction:
                raise read_only(conn) from None  # names the server this connection is on

    @contextmanager
    def autocommit(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection in autocommit (each statement its own transaction, no
        BEGIN and COMMIT round trips), given back transactional."""
        with self.connection() as conn:
            conn.autocommit = True
            try:
                yield conn
            finally:
                # The pool hands out transactional connections; a broken one it drops.
                with contextlib.suppress(psycopg.Error):
                    conn.autocommit = False

    def close(self) -> None:
        if self._pool is not None and self._pool_pid == os.getpid():
            self._pool.close()
        self._pool = None

    # -- the async pool ---------------------------------------------------------------------

    async def _async_pool(self) -> AsyncConnectionPool[Any]:
        owner = (os.getpid(), asyncio.get_running_loop())
        pool = self._apool
        if pool is not None and self._apool_owner == owner:
            return pool
        if self._apool_lock[0] != owner:
            self._apool_lock = (owner, asyncio.Lock())
        async with self._apool_lock[1]:
            return await self._open_async(owner)

    async def _open_async(self, owner: tuple[int, object]) -> AsyncConnectionPool[Any]:
        if self._apool is not None and self._apool_owner != owner:
            # Another process's (inherited across fork) or another loop's: its sockets
            # and futures are not ours to use or close here. Forget it.
            self._apool = None
        if self._apool is None:
            pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                self._owner.dsn,
                check=check_connection_async,
                name="brooq-async",
                **self._options(),
            )
            try:
                await pool.open(wait=True, timeout=CONNECT_TIMEOUT)
            except PoolTimeout:
                await pool.close(timeout=0)
                raise self.unavailable() from None
            self._apool, self._apool_owner = pool, owner
        return self._apool

    @contextlib.asynccontextmanager
    async def async_connection(
        self, *, autocommit: bool = False
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection of the async pool, in a transaction (or in autocommit: each
        statement its own), with the errors of ``connection``."""
        pool = await self._async_pool()
        with self.errors():
            async with pool.connection() as conn:
                try:
                    if autocommit:
                        await conn.set_autocommit(True)
                        try:
                            yield conn
                        finally:
                            with contextlib.suppress(psycopg.Error):
                                await conn.set_autocommit(False)  # the pool's: transactional
                    else:
                        async with conn.transaction():
                            yield conn
                except psycopg.errors.ReadOnlySqlTransaction:
                    raise read_only(conn) from None

    async def close_async(self) -> None:
        """Close the async pool (from the event loop that used it)."""
        owner = (os.getpid(), asyncio.get_running_loop())
        if self._apool is not None and self._apool_owner == owner:
            await self._apool.close()
        self._apool = None


# Every Pools of this process: a fork's child gives each a fresh lock.
_POOLS: weakref.WeakSet[Pools] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for pools in list(_POOLS):
        pools.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
