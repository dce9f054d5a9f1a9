"""Reads on a replica (QUEUE_READ_DATABASE_URL, docs/how-to/read-replica.md), against a
real primary and its streaming standby (tests/pgpair.py): the status page of a real
master and the `brooq` commands that only read serve their figures from the standby, with
its lag; the page's actions and `brooq cancel` still write to the primary; a read target
that cannot be reached is one clear error, and its password is never shown.

That a read came from the standby cannot pass by accident: the standby's replay is
paused while the primary takes a job, so the standby alone lacks it; the page's
connection is found on the standby and not on the primary; the commands are given a
primary that does not exist.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

import brooq
from brooq import migrate
from brooq.schema import files as migration_files
from tests.harness import MasterProcess, StartMaster, children_of, wait_for
from tests.pgpair import PostgresPair
from tests.process.test_ops_sessions import csrf_of, sign_in
from tests.process.test_ops_slow_clients import healthz, ops_addr
from tests.process.test_status_page import get, request

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "replica-reads-admin-token-0123456789"
SECRET = "SECRETPW9"
NOWHERE = f"postgresql://ops:{SECRET}@127.0.0.1:1/queue"  # nothing listens on port 1
LAG = re.compile(r"a standby, ([0-9.]+)([smhd]) behind its primary")
UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@pytest.fixture(scope="module")
def pair() -> Iterator[PostgresPair]:
    with PostgresPair() as made:
        yield made


@pytest.fixture
def database(pair: PostgresPair) -> str:
    """A migrated database of the pair's, once it is on the standby too."""
    name = f"brooq_r_{uuid.uuid4().hex[:10]}"
    pair.create_database(name)
    migrate.up(pair.primary.dsn(name))

    newest = migration_files.load()[-1].version

    def on_standby() -> bool:
        # Every migration replayed, not only the first (the views and functions the reads
        # use come with the later ones).
        try:
            with psycopg.connect(pair.standby.dsn(name), connect_timeout=3) as conn:
                if conn.execute("SELECT to_regclass('brooq_migration')").fetchone() == (None,):
                    return False
                row = conn.execute("SELECT max(version) FROM brooq_migration").fetchone()
                return row == (newest,)
        except psycopg.OperationalError:
            return False

    wait_for(on_standby, what="the migrated database on the standby")
    return name


def state_on(dsn: str, job_id: uuid.UUID) -> str | None:
    with psycopg.connect(dsn, connect_timeout=3) as conn:
        row = conn.execute("SELECT state FROM job_all WHERE id = %s", (job_id,)).fetchone()
    return None if row is None else str(row[0])


@contextmanager
def replay_paused(pair: PostgresPair) -> Iterator[None]:
    """The standby receives the primary's WAL (a synchronous commit still returns) but
    applies none of it: what the primary writes meanwhile, the standby alone lacks."""
    with psycopg.connect(pair.standby.dsn(), autocommit=True) as conn:
        conn.execute("SELECT pg_wal_replay_pause()")
    try:
        yield
    finally:
        with psycopg.connect(pair.standby.dsn(), autocommit=True) as conn:
            conn.execute("SELECT pg_wal_replay_resume()")


def behind(text: str) -> float:
    """The lag a page or a command printed, in seconds."""
    found = LAG.search(text)
    assert found is not None, text[-2000:]
    return float(found.group(1)) * UNIT[found.group(2)]


def sessions(dsn: str, database: str, application: str) -> int:
    with psycopg.connect(dsn, connect_timeout=3) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
            (database, application),
        ).fetchone()
    assert row is not None
    return int(row[0])


def brooq_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m brooq ARGS` without the caller's database or QUEUE_* settings."""
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CRED", "QUEUE_"))
    }
    environ["PYTHONPATH"] = str(ROOT)
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "brooq", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
        cwd=ROOT,
    )


def one_line_error(out: subprocess.CompletedProcess[str], code: int) -> str:
    assert out.returncode == code, (out.stdout, out.stderr)
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    assert SECRET not in out.stderr
    return lines[0]


# -- the status page -------------------------------------------------------------------------


def test_the_page_reads_on_the_standby_and_its_actions_write_to_the_primary(
    pair: PostgresPair, database: str, tmp_path: Path
) -> None:
    primary, standby = pair.primary.dsn(database), pair.standby.dsn(database)
    (tmp_path / "token").write_text(TOKEN)
    queue = brooq.Queue(primary)
    m = MasterProcess(
        primary,
        tmp_path / "master.log",
        workers=1,
        app="brooq_opsslow:queue",
        args=("--read-database-url", standby),
        env={"QUEUE_ADMIN_TOKEN_FILE": str(tmp_path / "token")},
    )
    try:
        addr = ops_addr(m)
        # No handler for these topics: the jobs stay pending.
        first, _ = queue.enqueue(brooq.Job("replica.first"))
        wait_for(lambda: state_on(standby, first) == "pending", what="the job on the standby")
        status, _, body = get(addr, "/")
        assert status == 200, body
        assert b"replica.first" in body
        assert b"These pages read from a replica" in body and LAG.search(body.decode())
        # A standby cannot see the primary's snapshot holders: the page says so.
        assert b"This page reads a standby, which cannot see the snapshots" in body
        # The page's connection is on the standby, and none is on the primary.
        assert sessions(standby, database, "brooq-pages") == 1
        assert sessions(primary, database, "brooq-pages") == 0
        assert "event=pages_read_from database=postgres@127.0.0.1:" in m.log()

        with replay_paused(pair):
            second, _ = queue.enqueue(brooq.Job("replica.second"))
            assert state_on(primary, second) == "pending" and state_on(standby, second) is None

            # The page shows what the standby has, and says how far behind it is.
            def lagging() -> bytes:
                page = get(addr, "/")[2]
                return page if behind(page.decode()) >= 1.0 else b""

            body = wait_for(lagging, what="a lag of a second on the page")
            assert b"replica.first" in body and b"replica.second" not in body
            status, _, body = get(addr, f"/jobs/{second}")
            assert status == 404 and b"These pages read from a replica" in body

            # An action writes to the primary; the page shows it once replayed.
            status, cookie = sign_in(addr, TOKEN)
            assert status == 303 and cookie
            token = f"csrf={csrf_of(addr, cookie)}"
            status, head, _ = request(addr, "POST", f"/jobs/{first}/cancel", token, cookie)
            assert status == 303, head
            assert state_on(primary, first) == "canceled"
            assert state_on(standby, first) == "pending"
            status, _, body = get(addr, f"/jobs/{first}")
            assert status == 200 and b"<td>pending</td>" in body and b"canceled" not in body
        wait_for(
            lambda: b"<td>canceled</td>" in get(addr, f"/jobs/{first}")[2],
            what="the cancel replayed, on the page",
        )
        status, _, body = get(addr, f"/jobs/{second}")
        assert status == 200 and b"These pages read from a replica" in body
        for page in ("/in-flight", "/failed", "/dead", "/fleet"):
            status, _, body = get(addr, page)
            assert status == 200 and b"These pages read from a replica" in body, page
        assert SECRET not in m.log()
    finally:
        m.stop()
        queue.close()


def test_an_unreachable_read_target_is_a_clear_503_and_the_actions_still_work(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "read-url").write_text(NOWHERE + "\n")
    m = start_master(
        workers=1,
        app="brooq_opsslow:queue",
        env={
            "QUEUE_ADMIN_TOKEN_FILE": str(tmp_path / "token"),
            "QUEUE_READ_DATABASE_URL_FILE": str(tmp_path / "read-url"),
        },
    )
    addr = ops_addr(m)
    job_id, _ = queue.enqueue(brooq.Job("replica.none"))
    for _ in range(2):
        status, _, body = get(addr, "/")
        assert status == 503, body
        assert b"read target" in body and b"QUEUE_READ_DATABASE_URL" in body
    assert healthz(addr) < 2.0  # the master works on, its page apart
    status, cookie = sign_in(addr, TOKEN)
    assert status == 303
    token = f"csrf={csrf_of(addr, cookie)}"
    assert request(addr, "POST", f"/jobs/{job_id}/cancel", token, cookie)[0] == 303
    assert db.execute("SELECT state FROM job_all WHERE id = %s", (job_id,)).fetchone() == (
        "canceled",
    )
    log = m.log()
    assert log.count("event=pages_read_target_unreachable") == 1, log  # once per outage
    assert "database=ops@127.0.0.1:1/queue" in log and SECRET not in log


# -- the commands ----------------------------------------------------------------------------


def test_the_read_commands_read_on_the_standby_and_cancel_writes_to_the_primary(
    pair: PostgresPair, database: str
) -> None:
    primary, standby = pair.primary.dsn(database), pair.standby.dsn(database)
    queue = brooq.Queue(primary)
    try:
        first, _ = queue.enqueue(brooq.Job("replica.first"))
        wait_for(lambda: state_on(standby, first) == "pending", what="the job on the standby")
        # The database given is nowhere: what the read commands print came from the standby.
        reads = ("--database", NOWHERE, "--read-database-url", standby)
        with replay_paused(pair):
            second, _ = queue.enqueue(brooq.Job("replica.second"))

            def lagging() -> dict[str, Any]:
                out = brooq_cli(*reads, "stats", "--json")
                assert out.returncode == 0, out.stderr
                found: dict[str, Any] = json.loads(out.stdout)
                return found if found["read_from"]["lag_seconds"] >= 1.0 else {}

            stats = wait_for(lagging, timeout=30, what="a lag of a second in brooq stats")
            assert [t["topic"] for t in stats["topics"]] == ["replica.first"]
            assert (
                stats["read_from"]["database"]
                == f"postgres@127.0.0.1:{pair.standby.port}/{database}"
            )
            assert stats["read_from"]["standby"] is True and stats["read_from"]["streaming"] is True
            assert stats["read_from"]["replayed_at"] is not None

            out = brooq_cli(*reads, "stats")
            assert out.returncode == 0 and out.stderr == "", out.stderr
            lines = out.stdout.splitlines()
            assert "replica.first" in lines[1] and "replica.second" not in out.stdout
            assert lines[-1].startswith(f"read from postgres@127.0.0.1:{pair.standby.port}/")
            assert behind(lines[-1]) >= 1.0

            listed = json.loads(brooq_cli(*reads, "jobs", "list", "--json").stdout)["jobs"]
            assert [j["id"] for j in listed] == [str(first)]
            assert "no job with id" in one_line_error(
                brooq_cli(*reads, "jobs", "show", str(second)), 1
            )
            assert (
                json.loads(brooq_cli(*reads, "jobs", "show", str(first), "--json").stdout)["state"]
                == "pending"
            )
            queues = json.loads(brooq_cli(*reads, "queues", "--json").stdout)
            assert [(q["name"], q["ready"]) for q in queues] == [("default", 1)]
            assert json.loads(brooq_cli(*reads, "fleet", "--json").stdout) == {"masters": []}
            top = json.loads(brooq_cli(*reads, "top", "--json").stdout)
            assert [t["topic"] for t in top["topics"]] == ["replica.first"]
            assert top["read_from"]["standby"] is True and top["read_from"]["lag_seconds"] >= 1.0
            once = brooq_cli(*reads, "top", "--once").stdout.splitlines()
            assert once[1].startswith("read target: a standby, ") and behind(once[1]) >= 1.0

            # A write goes to the database, never to the read target.
            out = brooq_cli(
                "--database", primary, "--read-database-url", standby, "cancel", str(first)
            )
            assert out.returncode == 0, out.stderr
            assert state_on(primary, first) == "canceled" and state_on(standby, first) == "pending"
            out = brooq_cli(*reads, "cancel", str(second))
            assert "cannot reach the database ops@127.0.0.1:1/queue" in one_line_error(out, 1)
        wait_for(lambda: state_on(standby, first) == "canceled", what="the cancel replayed")
        stats = json.loads(brooq_cli(*reads, "stats", "--json").stdout)
        assert [t["topic"] for t in stats["topics"]] == ["replica.second"]
        # Caught up and streaming: nothing behind.
        wait_for(
            lambda: (
                json.loads(brooq_cli(*reads, "stats", "--json").stdout)["read_from"]["lag_seconds"]
                == 0.0
            ),
            what="the standby caught up",
        )
    finally:
        queue.close()


def test_a_read_target_that_is_not_a_standby_says_so(dsn: str) -> None:
    stats = json.loads(brooq_cli("--read-database-url", dsn, "stats", "--json").stdout)
    assert stats["topics"] == []
    assert stats["read_from"]["standby"] is False and stats["read_from"]["lag_seconds"] is None
    out = brooq_cli("--read-database-url", dsn, "stats")
    assert out.stdout.splitlines()[-1].endswith(
        "not a standby (it takes writes): nothing to lag behind"
    )
    # Without a read target, stats is as it always was: no such line, no such field.
    assert json.loads(brooq_cli("--database", dsn, "stats", "--json").stdout) == {"topics": []}


def test_an_unreachable_or_malformed_read_target_is_one_line(dsn: str, tmp_path: Path) -> None:
    prefix = "error: the read target (--read-database-url, QUEUE_READ_DATABASE_URL): "
    for command in (("stats",), ("jobs", "list"), ("top", "--once"), ("queues",), ("fleet",)):
        line = one_line_error(
            brooq_cli("--database", dsn, "--read-database-url", NOWHERE, *command), 1
        )
        assert line.startswith(prefix + "cannot reach the database ops@127.0.0.1:1/queue"), line
    line = one_line_error(brooq_cli("stats", env={"QUEUE_READ_DATABASE_URL": NOWHERE}), 1)
    assert line.startswith(prefix), line
    bad = f"postgresql://ops:{SECRET}@db:5432/app?bogus=1"
    line = one_line_error(brooq_cli("--read-database-url", bad, "stats"), 2)
    assert line.startswith("error: --read-database-url cannot be parsed"), line
    line = one_line_error(brooq_cli("stats", env={"QUEUE_READ_DATABASE_URL": bad}), 2)
    assert line.startswith("error: QUEUE_READ_DATABASE_URL cannot be parsed"), line
    (tmp_path / "read-url").write_text(bad)
    line = one_line_error(
        brooq_cli("stats", env={"QUEUE_READ_DATABASE_URL_FILE": str(tmp_path / "read-url")}), 2
    )
    assert line.startswith("error: QUEUE_READ_DATABASE_URL_FILE cannot be parsed"), line
    # A write never needs the read target: a malformed one is not even read.
    job = brooq_cli("--database", dsn, "enqueue", "replica.t", env={"QUEUE_READ_DATABASE_URL": bad})
    assert job.returncode == 0, job.stderr


# -- the master's start and its secrets ------------------------------------------------------


def test_the_master_refuses_a_malformed_read_target(dsn: str, tmp_path: Path) -> None:
    bad = f"postgresql://ops:{SECRET}@db:5432/app?bogus=1"
    for how in ("flag", "env"):
        m = MasterProcess(
            dsn,
            tmp_path / f"master-{how}.log",
            workers=1,
            app="brooq_opsslow:queue",
            args=("--read-database-url", bad) if how == "flag" else (),
            env={"QUEUE_READ_DATABASE_URL": bad} if how == "env" else {},
        )
        try:
            assert m.wait(30) == 2
        finally:
            m.stop()
        log = m.log()
        what = "--read-database-url" if how == "flag" else "QUEUE_READ_DATABASE_URL"
        assert "cannot start" in log and f"- {what} cannot be parsed" in log, log
        assert SECRET not in log and "Traceback" not in log


def test_the_read_targets_password_stays_out_of_the_processes(
    dsn: str, start_master: StartMaster, tmp_path: Path
) -> None:
    """Given in a file, the read target's password is in no process's environment or
    command line: the master's, its children's, the page process's."""
    from psycopg import conninfo

    (tmp_path / "read-url").write_text(conninfo.make_conninfo(dsn, password=SECRET))
    m = start_master(
        workers=1,
        app="brooq_opsslow:queue",
        env={"QUEUE_READ_DATABASE_URL_FILE": str(tmp_path / "read-url")},
    )
    addr = ops_addr(m)
    assert get(addr, "/")[0] == 200  # trust authentication ignores the password
    processes = wait_for(lambda: len(kids := children_of(m.pid)) >= 2 and kids, what="children")
    for pid in [m.pid, *processes]:
        for what in ("environ", "cmdline"):
            assert SECRET.encode() not in Path(f"/proc/{pid}/{what}").read_bytes(), (pid, what)
    assert SECRET not in m.log()
