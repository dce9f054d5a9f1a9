"""A Queue's pooled connections: one sync pool for producers and operators, one async pool
for the ``_async`` producers and waiters, each opened on first use in the process (and,
for the async one, the event loop) that uses it.

A pool inherited across fork() is dropped unused (never closed, since its sockets belong
to the parent), so no connection ever crosses a fork; the lock that guards opening is
replaced in a fork's child (one held by a parent's thread at the fork would never be
released there).

A pool is opened without waiting, and kept: a caller waits for its first connection up
to ``wait_timeout`` (the DSN's connect timeout for each host it lists), and one that
gives up (DatabaseUnavailable) leaves the pool trying, so the next caller waits on the
same attempt rather than starting one over. Its connections go first to the host that
answered last in the process (brooq.dsn.preferred): a first host that never answers
costs one connect timeout, once.

Owns: the pools' options (size, connect timeout, how long a caller waits, how long a
series of reconnection attempts lasts, the pooler mode's connect arguments:
brooq.db), the host each connection tries first, opening them
(DatabaseUnavailable when the database cannot be reached), their fork and event-loop
rules, the pooled connection and transaction a Queue hands out, and brooq's errors for
their failures (brooq.db.database_error, the pool's timeout, a read-only server:
brooq.db).
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

from brooq.db import connect_kwargs, database_error, read_only, unavailable
from brooq.dsn import answered, attempt_timeout, preferred, timeout_kwargs
from brooq.errors import BrooqError
from brooq.producer.poolcheck import check_connection, check_connection_async
from brooq.settings import Settings

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
        # What the pools' connection attempts found (the last failure's reason).
        self.attempts = Attempts(owner)
        _POOLS.add(self)

    # -- options and errors ---------------------------------------------------------------

    def connect_kwargs(self) -> dict[str, Any]:
        """psycopg.connect's arguments for the Queue's connections on its dsn: the DSN's
        connect timeout, else brooq's (brooq.dsn.timeout_kwargs); behind a transaction
        pooler, no prepared statements (brooq.db)."""
        owner = self._owner
        return {
            **timeout_kwargs(owner.dsn),
            **connect_kwargs(owner.settings.pooler, owner.dsn, {}),
        }

    def wait_timeout(self) -> float:
        """How long a caller waits for a pooled connection: long enough for one attempt
        over every host the DSN lists, each given its connect timeout."""
        return float(attempt_timeout(self._owner.dsn))

    def _conninfo(self) -> str:
        """The connection string of the pool's next connection (read at each one)."""
        return preferred(self._owner.dsn)

    def _options(self) -> dict[str, Any]:
        """What the sync and the async pool share: opened by the caller, its size."""
        return {
            "min_size": 1,
            "max_size": max(1, self._owner.pool_size),
            "open": False,
            "timeout": self.wait_timeout(),
            "reconnect_timeout": RECONNECT_SERIES,
            "kwargs": self.connect_kwargs(),
        }

    def unavailable(self) -> BrooqError:
        """DatabaseUnavailable for a pool that could not hand out a connection, with
        the reason its last connection attempt failed (no new attempt: a host that does
        not answer would cost its timeout again)."""
        dsn = self._owner.dsn
        failure = self.attempts.failure
        if failure is not None:
            return unavailable(dsn, failure)
        seconds = f"{self.wait_timeout():g}"
        return unavailable(dsn, TimeoutError(f"no connection within {seconds} s"))

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
                self._conninfo,
                connection_class=self.attempts.sync_class,
                check=check_connection,
                name="brooq",
                **self._options(),
            )
            tried = self.attempts.expect()
            pool.open(wait=False)
            self._pool, self._pool_pid = pool, os.getpid()
            # The pool's first attempt is waited for here (not by the pool's own wait,
            # which closes the pool when it times out): a caller asking meanwhile would
            # make the pool start another one, on the same dead host. A caller that gives
            # up leaves the pool trying.
            if not tried.wait(self.wait_timeout()):
                raise self.unavailable()
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
                self._conninfo,
                connection_class=self.attempts.async_class,
                check=check_connection_async,
                name="brooq-async",
                **self._options(),
            )
            tried = self.attempts.expect_async()
            await pool.open(wait=False)
            self._apool, self._apool_owner = pool, owner
            try:  # as the sync pool's first attempt
                await asyncio.wait_for(tried.wait(), self.wait_timeout())
            except asyncio.TimeoutError:
                raise self.unavailable() from None
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


class Attempts:
    """The connection classes of a Queue's pools: each connection they open is
    remembered as on the host that answered (brooq.dsn.answered), each failure's reason
    kept for the error a caller who gave up gets."""

    def __init__(self, owner: Owner) -> None:
        self.failure: BaseException | None = None
        # Set when the pending attempt of the sync (the async) pool ends.
        self._tried: threading.Event | None = None
        self._tried_async: asyncio.Event | None = None
        attempts = self

        class SyncConnection(psycopg.Connection[Any]):
            @classmethod
            def connect(cls, conninfo: str = "", **kwargs: Any) -> Any:
                try:
                    conn = super().connect(conninfo, **kwargs)
                except BaseException as exc:
                    attempts.failed(exc)
                    attempts.ended()
                    raise
                attempts.connected(owner.dsn, conn)  # before a waiting caller goes on
                attempts.ended()
                return conn

        class AsyncConnection(psycopg.AsyncConnection[Any]):
            @classmethod
            async def connect(cls, conninfo: str = "", **kwargs: Any) -> Any:
                try:
                    conn = await super().connect(conninfo, **kwargs)
                except BaseException as exc:
                    attempts.failed(exc)
                    attempts.ended_async()
                    raise
                attempts.connected(owner.dsn, conn)  # before a waiting caller goes on
                attempts.ended_async()
                return conn

        self.sync_class: type[psycopg.Connection[Any]] = SyncConnection
        self.async_class: type[psycopg.AsyncConnection[Any]] = AsyncConnection

    def expect(self) -> threading.Event:
        """An event set when the next attempt of a sync pool ends, either way."""
        tried = self._tried = threading.Event()
        return tried

    def expect_async(self) -> asyncio.Event:
        """``expect`` for the async pool (set by its tasks, in the running loop)."""
        tried = self._tried_async = asyncio.Event()
        return tried

    def connected(self, dsn: str, conn: Any) -> None:
        self.failure = None
        answered(dsn, conn)

    def failed(self, exc: BaseException) -> None:
        if isinstance(exc, psycopg.Error):
            self.failure = exc

    def ended(self) -> None:
        tried, self._tried = self._tried, None
        if tried is not None:
            tried.set()

    def ended_async(self) -> None:
        tried, self._tried_async = self._tried_async, None
        if tried is not None:
            tried.set()


# Every Pools of this process: a fork's child gives each a fresh lock.
_POOLS: weakref.WeakSet[Pools] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for pools in list(_POOLS):
        pools.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
