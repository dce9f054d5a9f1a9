"""What brooq-master checks before it forks, and the session it opens: the DSN's options
(search_path, any -c) are kept by the master and the children; a database without brooq's
schema, or with an older one, is one clear error and no child; durations and integers
PostgreSQL cannot represent are refused at start-up."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from psycopg import conninfo

import brooq
from brooq import dsn as dsn_mod
from brooq import migrate
from brooq import settings as settings_mod
from brooq.errors import InvalidSettings
from brooq.schema import files as migration_files
from tests.harness import APPS, FAST, StartMaster, prepare, wait_for

# What the user puts in the DSN: their schema, a setting of their own with a space in its
# value (libpq's backslash escape), a statement_timeout of their own, and a
# synchronous_commit=off that brooq's own value for its children (on) wins over.
USER_OPTIONS = (
    r"-csearch_path=brooq -c brooq_test.marker=kept\ here -c statement_timeout=1234 "
    r"-c synchronous_commit=off"
)

# Every UPDATE of brooq.job records the session it ran in: the master's lease renewals and
# the children's claims and outcomes. current_setting() cannot be read from another
# backend; a trigger runs inside the backend that writes.
OBSERVER = """
CREATE TABLE brooq.observed (
    app text, old_state text, new_state text, search_path text, marker text,
    statement_timeout text, lock_timeout text, synchronous_commit text, bitmapscan text,
    seqscan text, sort text);
CREATE FUNCTION brooq.observe() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO brooq.observed VALUES (
        current_setting('application_name'), OLD.state, NEW.state,
        current_setting('search_path'), current_setting('brooq_test.marker', true),
        current_setting('statement_timeout'), current_setting('lock_timeout'),
        current_setting('synchronous_commit'), current_setting('enable_bitmapscan'),
        current_setting('enable_seqscan'), current_setting('enable_sort'));
    RETURN NEW;
END;
$$;
CREATE TRIGGER observe BEFORE UPDATE ON brooq.job FOR EACH ROW EXECUTE FUNCTION brooq.observe();
"""


def with_options(dsn: str, options: str) -> str:
    """The DSN as a URL with ?options=..., percent-encoded as a user would write it."""
    params = conninfo.conninfo_to_dict(dsn)
    auth = quote(str(params.get("user") or ""))
    if params.get("password"):
        auth += ":" + quote(str(params["password"]), safe="")
    query = {k: str(v) for k, v in params.items() if k not in ("user", "password", "dbname")}
    query["options"] = options
    return f"postgresql://{auth}@/{quote(str(params['dbname']))}?" + "&".join(
        f"{k}={quote(v, safe='')}" for k, v in query.items()
    )


@pytest.fixture
def two_schemas(dsn: str) -> str:
    """The test database with brooq's schema twice: in public (the decoy: what a master
    that drops the DSN's options runs against) and in schema brooq, migrated through a DSN
    whose options set the search_path. Returns the plain DSN."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA brooq")
    migrate.up(with_options(dsn, "-csearch_path=brooq"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(OBSERVER)
    # The test app's bookkeeping tables, where its handlers (same DSN) will look.
    prepare(with_options(dsn, "-csearch_path=brooq"))
    return dsn


@pytest.mark.parametrize("where", ["dsn", "PGOPTIONS"])
def test_the_dsn_options_are_kept_by_the_master_and_the_children(
    two_schemas: str, start_master: StartMaster, where: str
) -> None:
    plain = two_schemas
    if where == "dsn":
        user_dsn, env = with_options(plain, USER_OPTIONS), {}
    else:
        user_dsn, env = plain, {"PGOPTIONS": USER_OPTIONS}
    os.environ.update(env)  # the producer below reads PGOPTIONS the same way
    try:
        q = brooq.Queue(user_dsn)
        # Longer than lease/3 (the lease is 2s): the master renews it, in brooq.job.
        long_id = q.enqueue(brooq.Job("t.ok", {"sleep": 1.5}))[0]
        ids = [long_id] + [r[0] for r in q.enqueue_many([brooq.Job("t.ok") for _ in range(5)])]
        q.close()
    finally:
        for k in env:
            del os.environ[k]
    master = start_master(dsn=user_dsn, env=env)

    with psycopg.connect(plain, autocommit=True) as db:

        def done() -> int:
            row = db.execute(
                "SELECT count(*) FROM brooq.job_all WHERE id = ANY(%s) AND state = 'done'", (ids,)
            ).fetchone()
            return row[0] == len(ids) if row else 0

        wait_for(done, 20, what="every job done in schema brooq")
        assert db.execute("SELECT count(*) FROM public.job_all").fetchone() == (0,)
        assert db.execute("SELECT count(*) FROM brooq.execution").fetchone() == (len(ids),)

        sessions = db.execute(
            "SELECT DISTINCT split_part(app, ' ', 1), search_path, marker, statement_timeout, "
            "lock_timeout, synchronous_commit, bitmapscan, seqscan, sort FROM brooq.observed "
            "WHERE old_state = 'processing' AND new_state = 'processing' OR "
            "new_state = 'processing' AND old_state <> 'processing'"
        ).fetchall()
    master.signal(signal.SIGTERM)
    assert master.wait() == 0
    # The master renewed the long job's lease in the user's schema, with the user's other
    # settings, and its own two timeouts winning over the user's statement_timeout.
    masters = {s[:5] for s in sessions if s[0] == "brooq-master"}
    assert masters == {("brooq-master", "brooq", "kept here", "10s", "2s")}, sessions
    # The children claimed with the user's settings (statement_timeout included: they set
    # none of their own) and brooq's three: synchronous_commit on by default, even where
    # the user's options turn it off (QUEUE_WORKER_SYNCHRONOUS_COMMIT decides), and
    # neither bitmap nor sequential scans nor sorts.
    children = {(*s[:4], *s[5:]) for s in sessions if s[0] == "brooq-child"}
    expected = ("brooq-child", "brooq", "kept here", "1234ms", "on", "off", "off", "off")
    assert children == {expected}, sessions
    assert {s[0] for s in sessions} == {"brooq-master", "brooq-child"}


def test_session_options_merge() -> None:
    so = dsn_mod.session_options
    base = "postgresql://u@h/db"
    assert so(base, {"a": "1"}, {}) == "-c a=1"
    assert so(base, {"a": "1"}, {"PGOPTIONS": "-c search_path=x"}) == "-c search_path=x -c a=1"
    # The DSN's options beat PGOPTIONS, as in libpq.
    assert so(base + "?options=-csearch_path%3Dy", {}, {"PGOPTIONS": "-cz=1"}) == (
        "-csearch_path=y"
    )
    # brooq's values are escaped as the server splits them.
    assert so(base, {"x.y": "a b\\c"}, {}) == r"-c x.y=a\ b\\c"
    with pytest.raises(ValueError):
        so(base, {"a=b -c c": "1"}, {})


# -- the schema check -------------------------------------------------------------------


def run_master(
    dsn: str, *, env: dict[str, str] | None = None, timeout: float = 20
) -> tuple[int, str]:
    """Run brooq-master to its end; (exit code, stderr). A master still running after
    ``timeout`` (it forked and went on) is killed with its children and fails the test."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_")}
    full.update(FAST)
    full.update(
        env or {},
        DATABASE_URL=dsn,
        PYTHONPATH=os.pathsep.join([str(APPS), str(APPS.parent.parent)]),
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "brooq.master_cli",
            "--app",
            "brooq_testapp:queue",
            "--workers",
            "2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=APPS,
        env=full,
        start_new_session=True,  # its own process group: the cleanup below reaches children
    )
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"brooq-master was still running after {timeout}s:\n{err[-3000:]}")
    return proc.returncode, err


def assert_refused_before_forking(code: int, err: str, expected: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert expected in lines[0]
    assert "event=master_started" not in err  # Master.run, which forks, never began


def test_a_master_against_an_empty_database_refuses_to_start(empty_dsn: str) -> None:
    code, err = run_master(empty_dsn)
    assert_refused_before_forking(code, err, "run `brooq migrate up`")
    assert err.startswith("brooq-master: cannot start: the brooq schema is not installed")


def test_a_master_against_an_older_schema_refuses_to_start(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM brooq_migration")  # as if only the bookkeeping were new
    code, err = run_master(dsn)
    latest = migration_files.load()[-1].version
    assert_refused_before_forking(
        code, err, f"is at version 0 but this brooq needs version {latest}"
    )


def test_a_master_against_a_schema_one_migration_behind_refuses_to_start(
    empty_dsn: str,
) -> None:
    # A real older schema (0001 only): lease_expiries is missing, and the message says
    # which version is needed rather than taking the table for someone else's.
    migrate.up(empty_dsn, 1)
    code, err = run_master(empty_dsn)
    latest = migration_files.load()[-1].version
    assert_refused_before_forking(
        code, err, f"is at version 1 but this brooq needs version {latest}"
    )


def test_an_application_table_named_job_is_not_taken_for_brooqs(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE job (id bigint PRIMARY KEY, title text)")
    code, err = run_master(empty_dsn)
    assert_refused_before_forking(code, err, "the table public.job is not brooq's")


class Gate:
    """A TCP port that refuses connections until opened, then forwards them to PostgreSQL:
    a database that is down when the master starts and comes up later."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()  # nothing listens on it now: connection refused
        self.server: socket.socket | None = None

    def open(self) -> None:
        self.server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        assert self.server is not None
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = self._connect_upstream()
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _connect_upstream(self) -> socket.socket:
        host, port = self.target
        if host.startswith("/"):  # a Unix-domain socket directory (the embedded server)
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(f"{host}/.s.PGSQL.{port}")
            return upstream
        return socket.create_connection(self.target)

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass  # the other side closed: end both directions
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


@pytest.fixture
def gate(empty_dsn: str) -> Iterator[tuple[Gate, str]]:
    params = conninfo.conninfo_to_dict(empty_dsn)
    host = str(params.get("host") or "/var/run/postgresql")
    g = Gate(host, int(params.get("port") or 5432))
    yield g, conninfo.make_conninfo(empty_dsn, host="127.0.0.1", port=str(g.port))
    g.close()


def test_the_schema_is_checked_once_a_database_down_at_start_comes_up(
    gate: tuple[Gate, str], start_master: StartMaster
) -> None:
    g, gated = gate
    master = start_master(dsn=gated)
    wait_for(lambda: "event=db_error who=master" in master.log(), 10, what="a failed connect")
    g.open()
    code = master.wait(30)
    log = master.log()
    assert code == 3, log[-3000:]
    assert "event=master_fatal reason='the brooq schema is not installed" in log
    assert "run `brooq migrate up`" in log


# -- bounds -------------------------------------------------------------------------------


def test_a_lease_postgresql_cannot_add_to_now_is_refused_at_start_up(dsn: str) -> None:
    code, err = run_master(dsn, env={"QUEUE_LEASE": "999999999d"})
    assert code == 2, err
    assert "Traceback" not in err
    naming = [line for line in err.splitlines() if "QUEUE_LEASE" in line]
    assert naming == [
        "  - QUEUE_LEASE='999999999d': more than the longest duration brooq accepts, "
        "36500d (100 years)"
    ]
    assert "event=master_started" not in err


DURATION_VARS = sorted(
    v for v, n in settings_mod.ENVIRONMENT.items() if n in settings_mod._DURATIONS
)
INTEGER_VARS = sorted(v for v, n in settings_mod.ENVIRONMENT.items() if n in settings_mod._INTEGERS)


def test_every_duration_and_integer_setting_is_bounded_and_all_are_listed_at_once() -> None:
    environ = {v: "36501d" for v in DURATION_VARS} | {v: "2147483648" for v in INTEGER_VARS}
    with pytest.raises(InvalidSettings) as info:
        settings_mod.load(environ=environ)
    for var in DURATION_VARS + INTEGER_VARS:
        assert any(p.startswith(f"{var}=") for p in info.value.problems), var
    assert "QUEUE_LEASE" in DURATION_VARS and "QUEUE_MAX_ATTEMPTS" in INTEGER_VARS
    # At the limit is accepted.
    ok = settings_mod.load(
        environ={"QUEUE_RETENTION_TTL": "36500d", "QUEUE_MAX_ATTEMPTS": "2147483647"}
    )
    assert ok.retention_ttl == 36500 * 86400 and ok.max_attempts == 2**31 - 1
    # Queue(**settings) and flags go through the same bounds.
    with pytest.raises(InvalidSettings, match=r"Queue\(lease=\.\.\.\): more than"):
        settings_mod.load(environ={}, overrides={"lease": 10**12})
    with pytest.raises(InvalidSettings, match="--max-attempts: more than the largest integer"):
        settings_mod.load(environ={}, flags={"max_attempts": 10**5000})


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"attempt_timeout": "36501d"}, "t.x: attempt_timeout: more than the longest duration"),
        ({"max_execution_timeout": 10.0**10}, "t.x: max_execution_timeout: more than"),
        ({"backoff_base": "999999999d"}, "t.x: backoff_base: more than"),
        ({"backoff_max": 4e9}, "t.x: backoff_max: more than"),
        ({"max_attempts": 2**31}, "t.x: max_attempts must be at most 2147483647"),
    ],
)
def test_a_handler_option_out_of_range_is_refused_at_registration(
    options: dict[str, Any], expected: str
) -> None:
    q = brooq.Queue("postgresql://nobody@127.0.0.1:1/none")
    with pytest.raises(InvalidSettings) as info:
        q.handler("t.x", **options)(lambda claim: None)
    assert any(expected in p for p in info.value.problems), info.value.problems
