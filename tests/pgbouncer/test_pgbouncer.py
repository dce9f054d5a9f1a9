"""brooq behind PgBouncer in transaction pooling mode (docs/poolers.md), in `make test`.

Each test starts Debian's pgbouncer (1.18 here: no max_prepared_statements) in front of
the test database's server, with a pool of two server connections so that brooq's
clients really share them. Producers, children, queue.wait and the CLI go through it;
LISTEN and the master's own connections go to the direct QUEUE_LISTEN_DATABASE_URL.
Without pgbouncer installed the tests skip, or fail under BROOQ_REQUIRE_PGBOUNCER=1
(.ci/run sets it).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import conninfo

import brooq
from brooq.errors import PoolerMismatch
from brooq.settings import Settings
from brooq.worker.connection import ChildConnection
from brooq.worker.state import ChildState
from tests.harness import APPS, MasterProcess, free_port, prepare, wait_for

POOL_SIZE = 2
APP = "brooq_pgbouncerapp:queue"


def _binary() -> str:
    found = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
    )
    if found is None:
        message = "pgbouncer is not installed (Debian: apt-get install pgbouncer)"
        if os.environ.get("BROOQ_REQUIRE_PGBOUNCER") == "1":
            pytest.fail(message + " (BROOQ_REQUIRE_PGBOUNCER=1)", pytrace=False)
        pytest.skip(message)
    return found


def _run_as(host: str) -> str:
    """Under root, the user pgbouncer runs as: the owner of the server's socket
    directory (the embedded PostgreSQL's data directory is its own, mode 0700), else
    nobody."""
    if host.startswith("/"):
        owner = pwd.getpwuid(os.stat(host).st_uid).pw_name
        if owner != "root":
            return owner
    return "nobody"


class Bouncer:
    """A pgbouncer process in front of the server of ``dsn``; ``pooled(dsn)`` is the
    same database through it."""

    def __init__(self, dsn: str, *, ignore: str = "") -> None:
        params = conninfo.conninfo_to_dict(dsn)
        self.user = str(params.get("user") or os.environ.get("PGUSER") or "postgres")
        host = str(params.get("host") or "127.0.0.1")
        port = str(params.get("port") or "5432")
        self.port = free_port()
        # Not pytest's tmp_path: pgbouncer refuses to run as root, so under root it runs
        # as nobody, which must reach its socket directory.
        self.dir = Path(tempfile.mkdtemp(prefix="brooq-pgbouncer-"))
        os.chmod(self.dir, 0o777)  # a scratch directory nobody must write its socket in
        (self.dir / "users.txt").write_text(f'"{self.user}" ""\n')
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            f"unix_socket_dir = {self.dir}\n"
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'users.txt'}\n"
            f"admin_users = {self.user}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {POOL_SIZE}\n"
            "max_client_conn = 200\n"
            "server_round_robin = 0\n"
            + (f"ignore_startup_parameters = {ignore}\n" if ignore else "")
        )
        for f in self.dir.iterdir():
            os.chmod(f, 0o644)
        user = ["-u", _run_as(host)] if os.geteuid() == 0 else []
        self.log = self.dir / "pgbouncer.out"
        self._out = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [_binary(), *user, str(ini)], stdout=self._out, stderr=subprocess.STDOUT
        )
        wait_for(self._answers, 10, what=f"pgbouncer on port {self.port}")

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"pgbouncer exited: {self.log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def pooled(self, dsn: str) -> str:
        return conninfo.make_conninfo(dsn, host="127.0.0.1", port=str(self.port))

    def show(self, what: str) -> list[dict[str, Any]]:
        """SHOW <what> on pgbouncer's admin console (simple query protocol only)."""
        admin = conninfo.make_conninfo(
            "", host="127.0.0.1", port=str(self.port), dbname="pgbouncer", user=self.user
        )
        with psycopg.connect(admin, autocommit=True, cursor_factory=psycopg.ClientCursor) as c:
            cur = c.execute(f"SHOW {what}")
            names = [d.name for d in cur.description or []]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._out.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def bouncer(dsn: str) -> Iterator[Bouncer]:
    b = Bouncer(dsn)
    yield b
    b.stop()


def _pooled_env(bouncer: Bouncer, dsn: str) -> dict[str, str]:
    return {
        "QUEUE_POOLER": "transaction",
        "QUEUE_LISTEN_DATABASE_URL": dsn,
        "QUEUE_WORKER_SYNCHRONOUS_COMMIT": "off",
    }


def _server_connections(bouncer: Bouncer, dsn: str) -> int:
    name = conninfo.conninfo_to_dict(dsn)["dbname"]
    return sum(1 for s in bouncer.show("SERVERS") if s["database"] == name)


def _clean(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
    """What a pooled transaction finds on its server connection: session settings,
    prepared statements and LISTENs left there by whoever used it before."""
    row = conn.execute(
        "SELECT current_setting('enable_bitmapscan'), current_setting('plan_cache_mode'),"
        " current_setting('synchronous_commit'), current_setting('lock_timeout'),"
        " (SELECT count(*) FROM pg_prepared_statements),"
        " (SELECT count(*) FROM pg_listening_channels())"
    ).fetchone()
    assert row is not None
    return tuple(row)


CLEAN = ("on", "auto", "on", "0", 0, 0)


def _assert_servers_clean(bouncer: Bouncer, dsn: str) -> None:
    """Hold both server connections at once and look at each: nothing of brooq's is
    left on a connection the pool hands to the next client."""
    pooled = bouncer.pooled(dsn)
    conns = [psycopg.connect(pooled, prepare_threshold=None) for _ in range(POOL_SIZE)]
    try:
        seen = [_clean(c) for c in conns]  # each in its own open transaction
        assert seen == [CLEAN] * POOL_SIZE
    finally:
        for c in conns:
            c.close()


# -- producers -------------------------------------------------------------------------


def test_producers_enqueue_through_pgbouncer(
    bouncer: Bouncer, dsn: str, db: psycopg.Connection[Any]
) -> None:
    """One job at a time (past psycopg's prepare threshold), many by COPY, many with keys
    (INSERT), from six producers at once on a pool of two server connections."""
    pooled = bouncer.pooled(dsn)
    errors: list[BaseException] = []

    def produce(n: int) -> None:
        q = brooq.Queue(pooled, pool_size=2, pooler="transaction", listen_dsn=dsn)
        try:
            for i in range(20):
                q.enqueue(brooq.Job("pgb.ok", {"p": n, "i": i}))
            q.enqueue_many([brooq.Job("pgb.ok", {"p": n, "copy": i}) for i in range(50)])
            keyed = [brooq.Job("pgb.ok", idempotency_key=f"k{n}-{i}") for i in range(10)]
            assert all(created for _, created in q.enqueue_many(keyed))
            assert not any(created for _, created in q.enqueue_many(keyed))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            q.close()

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert db.execute("SELECT count(*) FROM job_all").fetchone() == (6 * 80,)
    assert _server_connections(bouncer, dsn) <= POOL_SIZE
    _assert_servers_clean(bouncer, dsn)


def _strand_prepared(bouncer: Bouncer, dsn: str, q: brooq.Queue) -> psycopg.Connection[Any]:
    """Enqueue past psycopg's prepare threshold, then hold the server connection q used
    (pgbouncer hands out the last one released first), so q's next transaction runs on
    the other one. Returns the holding connection (in a transaction)."""
    for i in range(6):
        q.enqueue(brooq.Job("pgb.ok", {"i": i}))
    holder = psycopg.connect(bouncer.pooled(dsn), prepare_threshold=None)
    holder.execute("SELECT 1")  # a transaction open: its server connection is taken
    return holder


def test_prepared_statements_through_pgbouncer_118_fail_with_a_clear_error(
    bouncer: Bouncer, dsn: str
) -> None:
    """Without QUEUE_POOLER=transaction psycopg prepares the INSERT on one server
    connection and the next transaction runs on the other: brooq says what happened and
    what to set, not just `prepared statement "_pg3_0" does not exist`."""
    q = brooq.Queue(bouncer.pooled(dsn), pool_size=1)
    holder = _strand_prepared(bouncer, dsn, q)
    try:
        with pytest.raises(PoolerMismatch, match="QUEUE_POOLER=transaction") as caught:
            for i in range(5):
                q.enqueue(brooq.Job("pgb.ok", {"after": i}))
        assert "prepared statement" in str(caught.value)
    finally:
        holder.close()
        q.close()


def test_prepared_statements_off_survive_the_same_routing(bouncer: Bouncer, dsn: str) -> None:
    q = brooq.Queue(bouncer.pooled(dsn), pool_size=1, pooler="transaction", listen_dsn=dsn)
    holder = _strand_prepared(bouncer, dsn, q)
    try:
        for i in range(5):
            q.enqueue(brooq.Job("pgb.ok", {"after": i}))
    finally:
        holder.close()
        q.close()


def test_pooled_mode_without_a_direct_connection_is_refused(bouncer: Bouncer, dsn: str) -> None:
    pooled = bouncer.pooled(dsn)
    q = brooq.Queue(pooled, pooler="transaction")
    try:
        job_id, _ = q.enqueue(brooq.Job("pgb.ok"))  # producing needs no LISTEN
        with pytest.raises(PoolerMismatch, match="QUEUE_LISTEN_DATABASE_URL"):
            q.wait(job_id, timeout=1)
    finally:
        q.close()


def test_async_producer_and_in_process_drain_through_pgbouncer(bouncer: Bouncer, dsn: str) -> None:
    """enqueue_async past the prepare threshold, brooq.testing.drain (the child's claim
    and outcome code) and wait_async (LISTEN direct), all with Queue's DSN on the
    pooler."""
    import asyncio

    from brooq import testing

    q = brooq.Queue(bouncer.pooled(dsn), pooler="transaction", listen_dsn=dsn)
    runs: list[int] = []
    q.handler("pgb.count")(lambda claim: runs.append(claim.payload))

    async def produce() -> list[uuid.UUID]:
        try:
            return [(await q.enqueue_async(brooq.Job("pgb.count", i)))[0] for i in range(12)]
        finally:
            await q.close_async()

    async def wait_all(ids: list[uuid.UUID]) -> list[str]:
        return [(await q.wait_async(i, timeout=10)).state for i in ids]

    try:
        ids = asyncio.run(produce())
        assert testing.drain(q) == {"done": 12}
        assert sorted(runs) == list(range(12))
        assert asyncio.run(wait_all(ids)) == ["done"] * 12
    finally:
        q.close()
    _assert_servers_clean(bouncer, dsn)


# -- the child's connection ------------------------------------------------------------


def test_child_settings_hold_for_its_transaction_only(bouncer: Bouncer, dsn: str) -> None:
    """The child's claim runs with its settings (set in the same pipeline), and the
    server connection it ran on has them no more for the next client."""
    settings = Settings(pooler="transaction", worker_synchronous_commit="off")
    child = ChildConnection(bouncer.pooled(dsn), "w1", settings, ChildState())
    conn = child.get()
    probe = (
        "SELECT current_setting('enable_bitmapscan'), current_setting('plan_cache_mode'),"
        " current_setting('synchronous_commit'), current_setting('enable_seqscan'),"
        " current_setting('enable_sort')"
    )
    with child.scoped(conn):
        cur = conn.execute(probe)
    assert cur.fetchone() == ("off", "force_generic_plan", "off", "off", "off")
    assert conn.execute(probe).fetchone() == ("on", "auto", "on", "on", "on")
    child.drop()
    _assert_servers_clean(bouncer, dsn)


# -- a real brooq-master ---------------------------------------------------------------


@pytest.fixture
def pooled_master(
    bouncer: Bouncer, dsn: str, tmp_path: Path
) -> Iterator[Callable[..., MasterProcess]]:
    prepare(dsn)
    started: list[MasterProcess] = []

    def start(env: dict[str, str] | None = None, workers: int = 3) -> MasterProcess:
        m = MasterProcess(
            bouncer.pooled(dsn),
            tmp_path / f"master-{len(started)}.log",
            workers=workers,
            app=APP,
            env={**_pooled_env(bouncer, dsn), **(env or {})},
        )
        started.append(m)
        return m

    yield start
    for m in started:
        m.stop()
    for m in started:
        print(f"---- {m.log_path.name}\n{m.log()[-20000:]}")
    print(f"---- pgbouncer\n{bouncer.log.read_text(errors='replace')[-5000:]}")


def _state(db: psycopg.Connection[Any], job_id: uuid.UUID) -> tuple[Any, ...] | None:
    return db.execute("SELECT state, attempts FROM job_all WHERE id = %s", (job_id,)).fetchone()


def test_master_drains_through_pgbouncer(
    bouncer: Bouncer,
    dsn: str,
    db: psycopg.Connection[Any],
    pooled_master: Callable[..., MasterProcess],
) -> None:
    """Three children (one async) on two server connections: jobs picked up by
    notification (the poll interval is a minute), a retried job, a dead one, periodic
    ticks, queue.wait;
    the children's settings reach their transactions and leave nothing behind."""
    master = pooled_master(env={"QUEUE_POLL_INTERVAL": "60s"})
    master.wait_ready(3)
    q = brooq.Queue(bouncer.pooled(dsn), pooler="transaction", listen_dsn=dsn)
    try:
        # Periodic ticks: claimed by the master (direct), run by the children (pooled).
        wait_for(
            lambda: (
                db.execute(
                    "SELECT count(*) FROM job_all WHERE topic = 'pgb.tick' AND state = 'done'"
                ).fetchone()
                >= (2,)
            ),
            20,
            what="two periodic ticks done",
        )
        # The children are idle now, each waiting up to a minute: only the master's
        # LISTEN (direct) and its wake-up can get these run within the test's time.
        for _ in range(3):
            job_id, _ = q.enqueue(brooq.Job("pgb.ok"))
            started = time.monotonic()
            record = q.wait(job_id, timeout=30)  # through the pooler, LISTEN direct
            assert record.state == "done"
            assert time.monotonic() - started < 30
        flaky, _ = q.enqueue(brooq.Job("pgb.flaky"))
        doomed, _ = q.enqueue(brooq.Job("pgb.doomed"))
        assert q.wait(flaky, timeout=30).state == "done"
        assert _state(db, flaky) == ("done", 3)
        assert q.wait(doomed, timeout=30).state == "dead"
        assert _state(db, doomed) == ("dead", 2)
        many = [q.enqueue(brooq.Job("pgb.ok"))[0] for _ in range(40)]
        many += [q.enqueue(brooq.Job("pgb.async"))[0] for _ in range(10)]
        wait_for(
            lambda: (
                db.execute(
                    "SELECT count(*) FROM job_all WHERE id = ANY(%s) AND state = 'done'", (many,)
                ).fetchone()
                == (len(many),)
            ),
            30,
            what="50 jobs done, 10 of them async",
        )
        # Each done job's on_success ran in the child's transaction with its setting.
        assert db.execute("SELECT DISTINCT planner FROM side_effect").fetchall() == [("off",)]
        # The server connections were shared: more clients than servers, and the
        # children's connections are among the clients.
        clients = [c for c in bouncer.show("CLIENTS") if c["database"] != "pgbouncer"]
        assert len(clients) > POOL_SIZE
        assert _server_connections(bouncer, dsn) <= POOL_SIZE
    finally:
        q.close()
    # The master's LISTEN is on the direct connection, none on the pooled ones.
    listening = db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
        "'brooq-master-listen' AND datname = current_database()"
    ).fetchone()
    assert listening == (1,)
    _assert_servers_clean(bouncer, dsn)
    master.signal(signal.SIGTERM)
    assert master.wait(30) == 0


def test_master_refuses_a_pooler_it_was_not_told_about(
    bouncer: Bouncer, dsn: str, pooled_master: Callable[..., MasterProcess]
) -> None:
    """DATABASE_URL on PgBouncer without QUEUE_POOLER: pgbouncer refuses the `options`
    startup parameter, and brooq-master stops at once saying what to set."""
    master = pooled_master(env={"QUEUE_POOLER": "", "QUEUE_LISTEN_DATABASE_URL": ""})
    assert master.wait(30) == 2
    log = master.log()
    assert "unsupported startup parameter" in log
    assert "QUEUE_POOLER=transaction" in log


def test_master_refuses_children_on_a_pooler_it_was_not_told_about(
    bouncer: Bouncer, dsn: str, pooled_master: Callable[..., MasterProcess]
) -> None:
    """The master's own connection direct, the children's on PgBouncer, QUEUE_POOLER
    unset: refused before any child is forked."""
    master = pooled_master(env={"QUEUE_POOLER": ""})
    assert master.wait(30) == 2
    log = master.log()
    assert "unsupported startup parameter" in log
    assert "QUEUE_POOLER=transaction" in log
    assert "child_exited" not in log


def test_master_refuses_a_pooler_that_drops_its_options(
    dsn: str, tmp_path: Path, db: psycopg.Connection[Any]
) -> None:
    """With ignore_startup_parameters=options pgbouncer accepts and drops them: the
    master sees its lock timeout missing and stops, rather than LISTEN through it."""
    prepare(dsn)
    dropping = Bouncer(dsn, ignore="options")
    try:
        # Everything through it; then only the children's connections (listen direct).
        for listen in ("", dsn):
            m = MasterProcess(
                dropping.pooled(dsn),
                tmp_path / f"m{len(listen)}.log",
                workers=1,
                app=APP,
                env={"QUEUE_LISTEN_DATABASE_URL": listen},
            )
            try:
                assert m.wait(30) == 2
                assert "drops them" in m.log()
                assert "QUEUE_POOLER=transaction" in m.log()
                assert "child_exited" not in m.log()
            finally:
                m.stop()
    finally:
        dropping.stop()


def test_child_refuses_options_dropped_by_a_pooler(dsn: str) -> None:
    """The same for a child's connection (direct mode): a clear error at connect."""
    dropping = Bouncer(dsn, ignore="options")
    try:
        child = ChildConnection(dropping.pooled(dsn), "w1", Settings(), ChildState())
        with pytest.raises(PoolerMismatch, match="enable_bitmapscan"):
            child.get()
    finally:
        dropping.stop()


def test_pooled_master_without_direct_connection_does_not_start(
    bouncer: Bouncer, pooled_master: Callable[..., MasterProcess]
) -> None:
    master = pooled_master(env={"QUEUE_LISTEN_DATABASE_URL": ""})
    assert master.wait(30) == 2
    assert "needs QUEUE_LISTEN_DATABASE_URL" in master.log()


# -- the CLI ---------------------------------------------------------------------------


def _brooq(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_")}
    full.update(env)
    full.pop("DATABASE_URL_FILE", None)
    full["PYTHONPATH"] = os.pathsep.join([str(APPS), str(APPS.parent.parent)])
    return subprocess.run(
        [sys.executable, "-m", "brooq", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_through_pgbouncer(bouncer: Bouncer, dsn: str, db: psycopg.Connection[Any]) -> None:
    env = {"DATABASE_URL": bouncer.pooled(dsn), **_pooled_env(bouncer, dsn)}
    for _ in range(3):  # past psycopg's prepare threshold in one command's pool
        done = _brooq(env, "enqueue", "pgb.ok", "--payload", '{"cli": true}')
        assert done.returncode == 0, done.stderr
    for args in (("jobs", "list"), ("stats",), ("queues",), ("migrate", "status")):
        done = _brooq(env, *args)
        assert done.returncode == 0, (args, done.stderr)
    assert db.execute("SELECT count(*) FROM job_all WHERE topic = 'pgb.ok'").fetchone() == (3,)
    job_id = db.execute("SELECT id FROM job_all LIMIT 1").fetchone()
    assert job_id is not None
    shown = _brooq(env, "jobs", "show", str(job_id[0]))
    assert shown.returncode == 0, shown.stderr
    assert _brooq(env, "cancel", str(job_id[0])).returncode == 0
    _assert_servers_clean(bouncer, dsn)


# -- settings --------------------------------------------------------------------------


def test_listen_dsn_sources(tmp_path: Path) -> None:
    from brooq.dsn import resolve_listen

    main = "postgresql://u@pooler:6432/app"
    assert resolve_listen(main, environ={}) == main
    direct = "postgresql://u@db:5432/app"
    assert resolve_listen(main, environ={"QUEUE_LISTEN_DATABASE_URL": direct}) == direct
    f = tmp_path / "listen-url"
    f.write_text(direct + "\n")
    assert resolve_listen(main, environ={"QUEUE_LISTEN_DATABASE_URL_FILE": str(f)}) == direct
    (tmp_path / "listen-database-url").write_text(direct)
    assert resolve_listen(main, environ={"CREDENTIALS_DIRECTORY": str(tmp_path)}) == direct
    assert resolve_listen(main, "host=db", environ={"QUEUE_LISTEN_DATABASE_URL": direct}) == (
        "host=db"
    )


def test_listen_dsn_errors_never_show_the_value(tmp_path: Path) -> None:
    from brooq.dsn import resolve_listen
    from brooq.errors import InvalidDsn

    bad = "postgresql://u:s3cret@db:5432/app?bogus=1"
    with pytest.raises(InvalidDsn, match="QUEUE_LISTEN_DATABASE_URL cannot be parsed") as e:
        resolve_listen("host=x", environ={"QUEUE_LISTEN_DATABASE_URL": bad})
    assert "s3cret" not in str(e.value)
    with pytest.raises(InvalidDsn, match="QUEUE_LISTEN_DATABASE_URL_FILE"):
        resolve_listen("host=x", environ={"QUEUE_LISTEN_DATABASE_URL_FILE": str(tmp_path / "no")})


def test_pooler_setting() -> None:
    from brooq import settings as settings_mod
    from brooq.errors import InvalidSettings

    assert settings_mod.load(environ={}).pooler == "none"
    assert settings_mod.load(environ={"QUEUE_POOLER": "transaction"}).pooler == "transaction"
    with pytest.raises(InvalidSettings, match="pooler must be none or transaction"):
        settings_mod.load(environ={"QUEUE_POOLER": "session"})
