"""QUEUE_SCHEMA: brooq in a schema of its own, next to an application table
public.job of another shape, with every connection's search_path left at the default."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest

import brooq
from brooq import migrate
from brooq import settings as settings_mod
from brooq.errors import InvalidSettings
from brooq.schema import files as migration_files
from brooq.sql import RELATIONS, Q, queries
from brooq.supervisor.connections import Connections
from tests.cliproc import run_brooq
from tests.harness import APPS, wait_for

SCHEMA = "brooq_q"
MIGRATIONS = migration_files.load()
NEWEST = f"{MIGRATIONS[-1].version:04d}_{MIGRATIONS[-1].name}"
ROOT = Path(__file__).resolve().parents[2]


def cli(
    dsn: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_")}
    full.update(env or {})
    return run_brooq(["--database", dsn, *args], env=full, cwd=ROOT)


def app_job_rows(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT id, title FROM public.job ORDER BY id").fetchall()


@pytest.fixture
def own(empty_dsn: str) -> Iterator[str]:
    """A database with the application's public.job (two rows) and brooq migrated into
    SCHEMA by the CLI, QUEUE_SCHEMA in its environment."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.job (id serial PRIMARY KEY, title text NOT NULL)")
        conn.execute("INSERT INTO public.job (title) VALUES ('invoice'), ('refund')")
    out = cli(empty_dsn, "migrate", "up", env={"QUEUE_SCHEMA": SCHEMA})
    assert out.returncode == 0 and f"applied {NEWEST}" in out.stdout, out.stderr
    yield empty_dsn


def test_every_mark_is_rendered_and_every_relation_qualified() -> None:
    """Unset, the statements name brooq's relations bare (today's text); with a schema,
    every reference to one of them is qualified: none is left to the search_path."""
    mark = re.compile(r"\{(" + "|".join(RELATIONS) + r")(:name)?\}")
    bare = re.compile(
        r"\b(FROM|JOIN|INTO|UPDATE|TABLE|EXISTS|COPY)\s+(" + "|".join(RELATIONS) + r")\b"
    )
    q = queries(SCHEMA)
    assert q is queries(SCHEMA)  # rendered once, cached
    for name in Q.names():
        plain, qualified = getattr(Q, name), getattr(q, name)
        assert not mark.search(plain) and not mark.search(qualified), name
        code = "\n".join(
            line for line in qualified.splitlines() if not line.lstrip().startswith("--")
        )
        assert not bare.search(code), (name, bare.search(code))
        assert "to_regclass('job')" not in code and "to_regclass('brooq_" not in code, name
    assert 'INSERT INTO "brooq_q"."job"' in q.job_insert
    assert "INSERT INTO job (" in Q.job_insert


@pytest.mark.parametrize("bad", ["Jobs", "a-b", "x" * 64, "pg_brooq", "1st", "a b"])
def test_a_bad_schema_name_is_refused(bad: str) -> None:
    with pytest.raises(InvalidSettings, match="QUEUE_SCHEMA"):
        settings_mod.load(environ={"QUEUE_SCHEMA": bad})
    with pytest.raises(InvalidSettings):
        queries(bad)


def test_migrate_with_a_schema_next_to_an_application_job_table(own: str) -> None:
    dsn = own
    with psycopg.connect(dsn) as conn:
        tables = conn.execute(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_schema IN ('public', %s) ORDER BY 1, 2",
            [SCHEMA],
        ).fetchall()
        pinned = conn.execute(
            "SELECT proconfig FROM pg_proc WHERE proname = 'brooq_claim_limited'"
        ).fetchone()
        # The coordinated claim and its helpers (0012) too.
        pinned_0012 = conn.execute(
            "SELECT DISTINCT proconfig FROM pg_proc WHERE proname IN ('brooq_claim_coordinated', "
            "'brooq_window_room', 'brooq_window_take', 'brooq_window_sweep')"
        ).fetchall()
        # The workflows' trigger and producer's function (0013, 0031): the migration's own
        # path.
        pinned_0013 = conn.execute(
            "SELECT DISTINCT proconfig FROM pg_proc WHERE proname IN ("
            "'brooq_job_upstream_ended', 'brooq_job_after')"
        ).fetchall()
    assert ("public", "job") in tables
    days = {t for s, t in tables if s == SCHEMA and t.startswith("job_history_2")}
    assert len(days) == 5  # the migration's partitions: today and four days ahead
    assert {t for s, t in tables if s == SCHEMA} - days == {
        "job",
        "brooq_queue",
        "brooq_periodic",
        "brooq_stack_request",
        "brooq_master",
        "brooq_migration",
        "brooq_rate_slot",
        "brooq_rate_cursor",
        "brooq_group_turn",
        "brooq_job_edge",
        "brooq_job_step",
        "brooq_event",
        "brooq_event_wait",
        # Migration 0020: the finished jobs, their default partition, the view of both
        # tables, the idempotency keys of every job.
        "job_history",
        "job_history_default",
        "job_all",
        "brooq_job_key",
        # Migration 0024: the groups' own limits; 0025: the schedules stored at runtime;
        # 0026: the keys dead jobs block.
        "brooq_group_limit",
        "brooq_schedule",
        "brooq_key_block",
    }
    assert pinned == ([f"search_path=pg_catalog, {SCHEMA}, pg_temp"],)
    assert pinned_0012 == [([f"search_path=pg_catalog, {SCHEMA}, pg_temp"],)]
    # Both on the migration's own path; brooq_job_after also runs with jit off (0031).
    paths = {config[0] for (config,) in pinned_0013}
    assert len(paths) == 1 and min(paths).startswith("search_path=") and SCHEMA in min(paths)
    assert sorted(config[1:] for (config,) in pinned_0013) == [[], ["jit=off"]]
    assert app_job_rows(dsn) == [(1, "invoice"), (2, "refund")]
    # status honours the schema; without it, nothing of brooq's is on the search_path
    out = cli(dsn, "--schema", SCHEMA, "migrate", "status")
    assert out.returncode == 0 and "pending" not in out.stdout, out.stdout
    assert "pending" in cli(dsn, "migrate", "status").stdout
    # the script for one's own tool creates the schema and sets the search_path first
    script = cli(dsn, "migrate", "sql", env={"QUEUE_SCHEMA": SCHEMA}).stdout
    created = script.index(f'CREATE SCHEMA IF NOT EXISTS "{SCHEMA}"')
    assert created < script.index("set_config('search_path'") < script.index("CREATE TABLE job")
    # a bad name: one line, exit 2, nothing written
    out = cli(dsn, "migrate", "up", env={"QUEUE_SCHEMA": "Bad-Name"})
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "QUEUE_SCHEMA" in out.stderr
    # every down step, in the schema; the application's table is left alone
    newest = migration_files.load()[-1]
    out = cli(dsn, "--schema", SCHEMA, "migrate", "down", "--steps", str(newest.version))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"reverted {newest.version:04d}_{newest.name}"), out.stdout
    with psycopg.connect(dsn) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s",
            [SCHEMA],
        ).fetchone()
    assert left == (0,)
    assert app_job_rows(dsn) == [(1, "invoice"), (2, "refund")]


def test_producers_on_the_callers_connection_and_the_queue(own: str) -> None:
    dsn = own
    with psycopg.connect(dsn) as conn:  # the default search_path: public.job first
        job_id, created = brooq.enqueue(conn, brooq.Job("t.ok", {"n": 1}), schema=SCHEMA)
        many = brooq.enqueue_many(
            conn, [brooq.Job("t.ok"), brooq.Job("t.ok", idempotency_key="k")], schema=SCHEMA
        )
        again = brooq.enqueue_many(conn, [brooq.Job("t.ok", idempotency_key="k")], schema=SCHEMA)
    assert created and len(many) == 2 and again == [(many[1][0], False)]
    q = brooq.Queue(dsn, schema=SCHEMA)
    try:
        q.enqueue(brooq.Job("t.ok", idempotency_key="k2"))
        assert q.get(job_id) is not None
        assert sum(s.pending for s in q.stats()) == 4
        assert q.cancel(job_id) and q.get(job_id).state == "canceled"  # type: ignore[union-attr]
        assert q.retry(job_id)
    finally:
        q.close()
    assert app_job_rows(dsn) == [(1, "invoice"), (2, "refund")]


def test_async_producers(own: str) -> None:
    import asyncio

    async def main() -> tuple[Any, Any]:
        async with await psycopg.AsyncConnection.connect(own) as conn:
            one = await brooq.enqueue_async(conn, brooq.Job("t.ok"), schema=SCHEMA)
            many = await brooq.enqueue_many_async(conn, [brooq.Job("t.ok")], schema=SCHEMA)
            return one, many

    one, many = asyncio.run(main())
    with psycopg.connect(own) as conn:
        found = conn.execute(
            f'SELECT count(*) FROM "{SCHEMA}".job WHERE id = ANY(%s)', [[one[0], many[0][0]]]
        ).fetchone()
    assert found == (2,)


def test_a_master_drains_the_schema_and_wait_returns(own: str, tmp_path: Path) -> None:
    from tests.harness import MasterProcess, prepare

    dsn = own
    prepare(dsn)
    q = brooq.Queue(dsn, schema=SCHEMA)
    m = MasterProcess(dsn, tmp_path / "m.log", env={"QUEUE_SCHEMA": SCHEMA})
    try:
        ids = [q.enqueue(brooq.Job("t.ok", {"i": i}))[0] for i in range(20)]
        last = q.wait(ids[-1], timeout=30)
        assert last.state == "done"
        wait_for(lambda: all(q.get(i).state == "done" for i in ids), what="all done")  # type: ignore[union-attr]
        # the CLI, QUEUE_SCHEMA in its environment
        env = {"QUEUE_SCHEMA": SCHEMA}
        listed = cli(dsn, "jobs", "list", "--json", env=env)
        assert listed.returncode == 0 and str(ids[0]) in listed.stdout, listed.stderr
        assert cli(dsn, "stats", env=env).returncode == 0
        assert cli(dsn, "queues", env=env).returncode == 0
        later, _ = q.enqueue(
            brooq.Job("t.ok", available_at=datetime.now(timezone.utc) + timedelta(hours=1))
        )
        assert cli(dsn, "cancel", str(later), env=env).returncode == 0
        assert q.get(later).state == "canceled"  # type: ignore[union-attr]
        out = cli(dsn, "retry", str(later), env=env)
        assert out.returncode == 0, out.stderr  # retried now: the channel wakes the master
        wait_for(lambda: q.get(later).state == "done", what="the retried job done")  # type: ignore[union-attr]
        # without the schema the CLI finds no brooq table (public.job is the app's)
        assert cli(dsn, "jobs", "list").returncode == 1
    finally:
        m.stop()
        q.close()
    assert "event=db_error" not in m.log()
    assert app_job_rows(dsn) == [(1, "invoice"), (2, "refund")]


def test_the_master_refuses_a_missing_schema(own: str, tmp_path: Path) -> None:
    from tests.harness import MasterProcess

    m = MasterProcess(own, tmp_path / "m.log", env={"QUEUE_SCHEMA": "nowhere"})
    assert m.wait(30) == 2
    assert "no table job in schema nowhere (QUEUE_SCHEMA)" in m.log()
    m = MasterProcess(own, tmp_path / "m2.log", env={"QUEUE_SCHEMA": "x" * 64})
    assert m.wait(30) == 2
    assert "QUEUE_SCHEMA" in m.log() and "63 bytes" in m.log()
    # unset: the search_path finds public.job, the application's table, and refuses it
    m = MasterProcess(own, tmp_path / "m3.log")
    assert m.wait(30) == 2
    assert "is not brooq's" in m.log()


def test_a_notification_of_another_schema_wakes_no_child(own: str) -> None:
    """Two installations in one database: the job channel's payload names the schema,
    and a master wakes its children for its own only."""
    migrate.up(own, schema="other")
    woken: list[int] = []
    stacks: list[str] = []
    conns = Connections(
        own,
        schema=SCHEMA,
        schema_verified=True,
        wake=lambda: woken.append(1),
        reconnected=lambda: None,
    )
    conns.stack_requested = stacks.append

    def read(what: list[Any]) -> bool:
        conns.read_notifications()
        return bool(what)

    try:
        assert conns.connect()
        woken.clear()
        with psycopg.connect(own, autocommit=True) as producer:
            brooq.enqueue(producer, brooq.Job("t.ok"), schema="other")
            # A sentinel after it: notifications arrive in commit order.
            producer.execute("SELECT pg_notify('brooq_stack', 'sentinel')")
            wait_for(lambda: read(stacks), what="the sentinel")
            assert woken == [] and stacks == ["sentinel"]
            brooq.enqueue(producer, brooq.Job("t.ok"), schema=SCHEMA)
            wait_for(lambda: read(woken), what="a wake-up for our schema")
    finally:
        conns.close()


def test_unset_the_master_listens_for_the_schema_its_search_path_found(dsn: str) -> None:
    """No QUEUE_SCHEMA: the schema the job table was found in (public here) is the one
    whose notifications wake children; a notification of another schema's does not."""
    migrate.up(dsn, schema="other")
    woken: list[int] = []
    stacks: list[str] = []
    conns = Connections(
        dsn, schema_verified=False, wake=lambda: woken.append(1), reconnected=lambda: None
    )
    conns.stack_requested = stacks.append
    try:
        assert conns.connect() and conns.job_schema == "public"
        woken.clear()
        with psycopg.connect(dsn, autocommit=True) as producer:
            brooq.enqueue(producer, brooq.Job("t.ok"), schema="other")
            producer.execute("SELECT pg_notify('brooq_stack', 'sentinel')")

            def read(what: list[Any]) -> bool:
                conns.read_notifications()
                return bool(what)

            wait_for(lambda: read(stacks), what="the sentinel")
            assert woken == []
            brooq.enqueue(producer, brooq.Job("t.ok"))  # the search_path's: public.job
            wait_for(lambda: read(woken), what="a wake-up for public")
    finally:
        conns.close()


def _in_schema(dsn: str, query: str) -> list[tuple[Any, ...]]:
    """A read of brooq's tables in SCHEMA on a connection with the default search_path."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(query).fetchall()


def test_a_limited_topic_periodic_jobs_and_a_stack_under_a_master(own: str, tmp_path: Path) -> None:
    """brooq_claim_limited runs from a child whose search_path finds public.job first: its
    pinned search_path (0009) finds brooq's. Periodic ticks land in SCHEMA's
    brooq_periodic; `brooq jobs stack` asks and is answered through SCHEMA's requests."""
    from tests.harness import MasterProcess, prepare

    dsn = own
    prepare(dsn)
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    env = {"QUEUE_SCHEMA": SCHEMA, "BROOQ_STAMPS": str(stamps), "BROOQ_LIMITED_SLEEP": "0"}
    q = brooq.Queue(dsn, schema=SCHEMA)
    limited = MasterProcess(dsn, tmp_path / "l.log", app="brooq_queuesapp:queue", env=env)
    periodic = MasterProcess(
        dsn, tmp_path / "p.log", app="brooq_periodicapp:queue", workers=1, env=env
    )
    try:
        ids = [q.enqueue(brooq.Job("api.limited"))[0] for _ in range(10)]
        wait_for(
            lambda: all(q.get(i).state == "done" for i in ids),  # type: ignore[union-attr]
            what="the limited jobs done",
        )
        ticks = (
            f"SELECT count(*) FROM \"{SCHEMA}\".job_all WHERE topic = 'p.tick' AND state = 'done'"
        )
        wait_for(lambda: _in_schema(dsn, ticks)[0][0] >= 1, what="a periodic tick done")
        names = _in_schema(dsn, f'SELECT name FROM "{SCHEMA}".brooq_periodic ORDER BY 1')
        assert ("tick",) in names
        apps = {**env, "PYTHONPATH": os.pathsep.join([str(APPS), str(ROOT)])}
        out = cli(dsn, "periodic", "--app", "brooq_periodicapp:queue", "--json", env=apps)
        assert out.returncode == 0, out.stderr
        listed = {row["name"]: row for row in json.loads(out.stdout)}
        assert listed["tick"]["last_job"] is not None, listed["tick"]
    finally:
        limited.stop()
        periodic.stop()
    m = MasterProcess(dsn, tmp_path / "s.log", workers=1, env={"QUEUE_SCHEMA": SCHEMA})
    try:
        job_id, _ = q.enqueue(brooq.Job("t.ok", {"sleep": 20}))
        wait_for(lambda: q.get(job_id).state == "processing", what="running")  # type: ignore[union-attr]

        def answered() -> subprocess.CompletedProcess[str] | None:
            out = cli(dsn, "--schema", SCHEMA, "jobs", "stack", str(job_id), "--timeout", "2s")
            return out if out.returncode == 0 else None

        out = wait_for(answered, what="the stack")
        assert "in ok" in out.stdout, out.stdout
        assert _in_schema(dsn, f'SELECT count(*) FROM "{SCHEMA}".brooq_stack_request') == [(0,)]
        assert q.cancel(job_id)
    finally:
        m.stop()
        q.close()
    for log in ("l.log", "p.log", "s.log"):
        assert "event=db_error" not in (tmp_path / log).read_text(), log
    assert app_job_rows(dsn) == [(1, "invoice"), (2, "refund")]


def test_status_page_reads_and_testing_helpers(own: str) -> None:
    from brooq import testing
    from brooq.page import routes

    q = brooq.Queue(dsn=own, schema=SCHEMA)
    seen: list[int] = []

    @q.handler("s.seen")
    def handle(claim: brooq.Claim) -> None:
        seen.append(claim.payload["n"])

    @q.handler("s.broken", max_attempts=1)
    def broken(claim: brooq.Claim) -> None:
        raise RuntimeError("no")

    try:
        q.enqueue_many([brooq.Job("s.seen", {"n": i}) for i in range(3)])
        dead_id, _ = q.enqueue(brooq.Job("s.broken"))
        assert testing.drain(q) == {"done": 3, "dead": 1}
        assert sorted(seen) == [0, 1, 2]
        assert len(testing.jobs(q, topic="s.seen", state="done")) == 3
        with psycopg.connect(own, autocommit=True) as conn:  # default search_path
            overview = routes.serve(conn, "GET", "/", actions_enabled=False, q=queries(SCHEMA))
            assert overview.status == 200 and b"s.broken" in overview.body
            dead = routes.serve(conn, "GET", "/dead", actions_enabled=False, q=queries(SCHEMA))
            assert dead.status == 200 and str(dead_id).encode() in dead.body
            one = routes.serve(
                conn, "GET", f"/jobs/{dead_id}", actions_enabled=False, q=queries(SCHEMA)
            )
            assert one.status == 200 and b"RuntimeError" in one.body
    finally:
        q.close()


def test_the_django_path_applies_into_the_schema_and_gives_the_search_path_back(
    empty_dsn: str,
) -> None:
    """script_parts(schema=...) run piece by piece on one autocommit connection, as
    Django's RunSQL does: everything lands in the schema, and the session's own
    search_path is back afterwards (Django's next migration must not land there)."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.job (id serial PRIMARY KEY, title text)")
        conn.execute("SET search_path TO public")
        for part in migrate.script_parts("up", schema="dj"):
            conn.execute(part.encode())
        assert conn.execute("SHOW search_path").fetchone() == ("public",)
        assert migrate.verify(conn, "dj") == "dj"
        brooq.enqueue(conn, brooq.Job("t.ok"), schema="dj")
        for part in migrate.script_parts("down", schema="dj"):
            conn.execute(part.encode())
        assert conn.execute("SHOW search_path").fetchone() == ("public",)
        left = conn.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'dj'"
        ).fetchone()
        assert left == (0,)
