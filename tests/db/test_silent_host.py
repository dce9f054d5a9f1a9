"""A multi-host DSN whose first host accepts TCP and never answers (a server hung, or a
firewall that accepts and drops), the high-availability page's own form with
``connect_timeout=1``: the producers (sync and async, a transaction, get, wait) and the
commands that read work, the dead host costs one connect timeout per process, the DSN's,
and later calls go to the live host without trying the dead one again.

The silent host is a real TCP listener that accepts and holds every connection; it
counts them: each is one connection attempt on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import conninfo

import brooq
from brooq import dsn as dsn_mod
from tests.db.test_cli import run
from tests.harness import wait_for


class SilentHost:
    """A TCP listener on 127.0.0.1 that accepts and never says a word."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def attempts(self) -> int:
        """How many connections reached it (each one a connection attempt on it)."""
        return len(self.held)

    def _accept(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                conn, _ = self.sock.accept()
                self.held.append(conn)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for conn in [*self.held, self.sock]:
            conn.close()


@pytest.fixture
def silent() -> Iterator[SilentHost]:
    host = SilentHost()
    yield host
    host.close()


def behind(silent: SilentHost, dsn: str, **extra: str) -> str:
    """``dsn`` with the silent host listed first, as the high-availability page says."""
    params = conninfo.conninfo_to_dict(dsn)
    params["host"] = f"127.0.0.1,{params.get('host') or '127.0.0.1'}"
    params["port"] = f"{silent.port},{params.get('port') or 5432}"
    params["target_session_attrs"] = "read-write"
    params.update({"connect_timeout": "1", **extra})
    return conninfo.make_conninfo("", **params)


def done(db: psycopg.Connection[Any], job_id: object) -> None:
    db.execute("UPDATE job SET state = 'done' WHERE id = %s", (job_id,))


def test_the_sync_producer_pays_the_dead_host_once(
    silent: SilentHost, dsn: str, db: psycopg.Connection[Any]
) -> None:
    queue = brooq.Queue(behind(silent, dsn))
    try:
        ids = [i for i, _ in queue.enqueue_many([brooq.Job("t"), brooq.Job("t")])]
        assert silent.attempts == 1
        with queue.transaction() as conn:
            created = brooq.enqueue(conn, brooq.Job("t"))[0]
        record = queue.get(ids[0])
        assert record is not None and record.state == "pending"
        single = queue.enqueue(brooq.Job("t"))[0]  # its own connection
        done(db, ids[1])
        assert queue.wait(ids[1], timeout=30).state == "done"  # and the LISTEN's
        for _ in range(3):
            queue.enqueue_many([brooq.Job("t")])
            assert queue.get(created) is not None
            assert queue.get(single) is not None
        assert silent.attempts == 1  # every later connection went to the live host
    finally:
        queue.close()


def test_the_async_producer_pays_the_dead_host_once(
    silent: SilentHost, dsn: str, db: psycopg.Connection[Any]
) -> None:
    queue = brooq.Queue(behind(silent, dsn))

    async def produce() -> None:
        job_id, _ = await queue.enqueue_async(brooq.Job("t"))
        assert silent.attempts == 1
        await queue.enqueue_many_async([brooq.Job("t"), brooq.Job("t")])
        for _ in range(3):
            await queue.enqueue_async(brooq.Job("t"))
        done(db, job_id)
        record = await queue.wait_async(job_id, timeout=30)
        assert record.state == "done"
        await queue.close_async()

    try:
        asyncio.run(produce())
        assert silent.attempts == 1
        # The one marked done is in job_history now: every job, wherever it is.
        row = db.execute("SELECT count(*) FROM job_all").fetchone()
        assert row is not None and row[0] == 6
    finally:
        queue.close()


@pytest.mark.parametrize("command", [["stats"], ["queues"], ["jobs", "list"]])
def test_a_command_pays_the_dead_host_once(
    silent: SilentHost, dsn: str, command: list[str]
) -> None:
    # A command checks the database with a connection of its own, then reads through a
    # pool: the pool goes to the host the check found.
    out = run("--database", behind(silent, dsn), *command)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    wait_for(lambda: silent.attempts >= 1, timeout=10)
    assert silent.attempts == 1, silent.attempts


def test_the_dsns_connect_timeout_is_not_replaced_by_brooqs() -> None:
    given = "postgresql://u@db1,db2/app?connect_timeout=3"
    assert dsn_mod.timeout_kwargs(given, {}) == {}
    assert dsn_mod.attempt_timeout(given, {}) == 6  # per host, as libpq counts it
    plain = "postgresql://u@db1/app"
    assert dsn_mod.timeout_kwargs(plain, {"PGCONNECT_TIMEOUT": "2"}) == {}
    assert dsn_mod.host_timeout(plain, {"PGCONNECT_TIMEOUT": "1"}) == 2  # libpq's floor
    assert dsn_mod.timeout_kwargs(plain, {}) == {"connect_timeout": 5}
    assert dsn_mod.host_timeout("host=db1 connect_timeout=0", {}) == 130  # psycopg's "none"


def test_an_unreachable_database_says_libpqs_reason_at_every_call() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    queue = brooq.Queue(f"postgresql://u@127.0.0.1:{port}/app?connect_timeout=2")
    try:
        for _ in range(2):
            with pytest.raises(brooq.DatabaseUnavailable, match="refused"):
                queue.enqueue_many([brooq.Job("t")])
    finally:
        queue.close()
