"""Migrations: up, down to zero, up again on a clean database; nothing left after down."""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from brooq import migrate
from brooq.schema import files as migration_files
from tests.cliproc import run_brooq


def brooq_objects(dsn: str) -> list[str]:
    """Every relation, function, trigger and type in public, i.e. what brooq could leave."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            """
            SELECT 'relation ' || c.relname FROM pg_class c
              JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'
            UNION ALL
            SELECT 'function ' || p.proname FROM pg_proc p
              JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'
            UNION ALL
            SELECT 'type ' || t.typname FROM pg_type t
              JOIN pg_namespace n ON n.oid = t.typnamespace WHERE n.nspname = 'public'
            UNION ALL
            SELECT 'trigger ' || tgname FROM pg_trigger WHERE NOT tgisinternal
            """
        ).fetchall()
    return sorted(r[0] for r in rows)


def test_up_down_to_zero_up_again(empty_dsn: str) -> None:
    assert brooq_objects(empty_dsn) == []
    applied = migrate.up(empty_dsn)
    assert [m.version for m in applied] == [m.version for m in migration_files.load()]
    first = brooq_objects(empty_dsn)
    assert "relation job" in first and "relation brooq_migration" in first

    assert migrate.up(empty_dsn) == []  # up twice is a no-op

    while any(s.applied_at for s in migrate.status(empty_dsn)):
        assert len(migrate.down(empty_dsn)) == 1
    assert brooq_objects(empty_dsn) == []
    assert migrate.down(empty_dsn) == []  # nothing left to undo

    migrate.up(empty_dsn)
    assert brooq_objects(empty_dsn) == first


def test_status_reports_each_version(empty_dsn: str) -> None:
    assert all(s.applied_at is None for s in migrate.status(empty_dsn))
    migrate.up(empty_dsn)
    statuses = migrate.status(empty_dsn)
    assert statuses and all(s.applied_at is not None for s in statuses)


def test_schema_matches_the_declared_shape(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        columns = conn.execute(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
            "WHERE table_name = 'job' ORDER BY ordinal_position"
        ).fetchall()
        indexes = {
            r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'job'")
        }
        options = conn.execute("SELECT reloptions FROM pg_class WHERE relname = 'job'").fetchone()
    assert [c[0] for c in columns] == [
        "id",
        "topic",
        "payload",
        "state",
        "attempts",
        "available_at",
        "locked_by",
        "locked_until",
        "last_error",
        "idempotency_key",
        "created_at",
        "updated_at",
        "lease_expiries",
        "queue",
        "priority",
        "result",
        "errors",
        "waited",
        "unique_key",
        "start_after",
        "tags",
        "group_key",
        "upstream_open",
        "upstream_failed",
        "on_upstream_failure",
        "has_downstream",
        "progress",
        "progress_message",
        "logs",
        "traceparent",
        "parked",
        "started_at",
        "ordering_key",
    ]
    nullable = {c[0] for c in columns if c[2] == "YES"}
    assert nullable == {
        "locked_by",
        "locked_until",
        "last_error",
        "idempotency_key",
        "result",
        "errors",
        "waited",
        "unique_key",
        "start_after",
        "tags",
        "group_key",
        "upstream_open",
        "upstream_failed",
        "on_upstream_failure",
        "has_downstream",
        "progress",
        "progress_message",
        "logs",
        "traceparent",
        "parked",
        "started_at",
        "ordering_key",
    }
    assert {
        "job_pkey",
        "job_topic_idempotency_key_key",
        "job_processing_lease_idx",
        "job_terminal_updated_idx",
        "job_ready_queue_idx",
        "job_failed_dead_idx",
        "job_unique_key_idx",
        "job_unique_key_waiting_idx",
        "job_ready_group_idx",
        "job_ordering_idx",
        "job_ordering_busy_idx",
    } <= indexes
    assert options is not None
    assert set(options[0]) >= {
        "autovacuum_vacuum_scale_factor=0.02",
        "autovacuum_vacuum_threshold=100",
    }


@pytest.mark.parametrize(
    ("statement", "constraint"),
    [
        ("INSERT INTO job (topic, state) VALUES ('a', 'running')", "job_state_check"),
        ("INSERT INTO job (topic, attempts) VALUES ('a', -1)", "job_attempts_check"),
        ("INSERT INTO job (topic) VALUES ('Bad Topic')", "job_topic_check"),
        ("INSERT INTO job (topic) VALUES (repeat('a', 129))", "job_topic_check"),
        ("INSERT INTO job (topic, state) VALUES ('a', 'processing')", "job_processing_lease_check"),
        (
            "INSERT INTO job (topic, state, locked_by) VALUES ('a', 'processing', 'w')",
            "job_processing_lease_check",
        ),
        ("INSERT INTO job (topic, idempotency_key) VALUES ('a', '')", "job_idempotency_key_check"),
        ("INSERT INTO job (topic, queue) VALUES ('a', 'Bad Queue')", "job_queue_check"),
        ("INSERT INTO job (topic, queue) VALUES ('a', repeat('q', 129))", "job_queue_check"),
        ("INSERT INTO brooq_queue (name) VALUES ('no way')", "brooq_queue_name_check"),
        ("INSERT INTO job (topic, unique_key) VALUES ('a', '')", "job_unique_key_check"),
        ("INSERT INTO job (topic, tags) VALUES ('a', '{}')", "job_tags_check"),
        ("INSERT INTO job (topic, tags) VALUES ('a', '{a,NULL}')", "job_tags_check"),
        ("INSERT INTO job (topic, tags) VALUES ('a', '{\"a b\"}')", "job_tags_check"),
        ("INSERT INTO job (topic, tags) VALUES ('a', '{{a,b},{c,d}}')", "job_tags_check"),
        ("INSERT INTO job (topic, tags) VALUES ('a', '{1,2,3,4,5,6,7,8,9}')", "job_tags_check"),
        ("INSERT INTO job (topic, tags) VALUES ('a', ARRAY[repeat('a', 65)])", "job_tags_check"),
    ],
)
def test_schema_enforces_invariants(dsn: str, statement: str, constraint: str) -> None:
    with psycopg.connect(dsn) as conn, pytest.raises(psycopg.errors.CheckViolation) as err:
        conn.execute(statement)
    assert err.value.diag.constraint_name == constraint


def test_terminal_rows_may_keep_their_last_lease(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "INSERT INTO job (topic, state, locked_by, locked_until) "
            "VALUES ('a', 'done', 'w', now())"
        )


def test_concurrent_up_applies_each_migration_once(empty_dsn: str) -> None:
    results: list[list[migration_files.Migration]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(migrate.up(empty_dsn))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(len(r) for r in results) == [0, 0, 0, len(migration_files.load())]


def run_script(dsn: str, direction: str) -> None:
    """``brooq migrate sql`` run the way its header says: a file marked no-transaction
    statement by statement, the others as one script."""
    text = migrate.script(direction)
    files = text.split("-- brooq migration ")[1:]
    assert len(files) == len(migration_files.load())
    with psycopg.connect(dsn, autocommit=True) as conn:
        for part in files:
            if "run outside a transaction" in part.splitlines()[0]:
                for statement in migration_files.statements("-- " + part):
                    conn.execute(statement)  # type: ignore[arg-type]
            else:
                conn.execute("-- " + part)  # type: ignore[arg-type]


def test_sql_script_builds_the_same_schema(empty_dsn: str, dsn: str) -> None:
    run_script(empty_dsn, "up")
    declared = [o for o in brooq_objects(dsn) if "brooq_migration" not in o]
    assert brooq_objects(empty_dsn) == declared
    run_script(empty_dsn, "down")
    assert brooq_objects(empty_dsn) == []


def test_cli_migrate(empty_dsn: str) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_brooq(
            ["--database", empty_dsn, "migrate", *args], env=dict(os.environ), cwd=Path.cwd()
        )

    out = cli("status")
    assert out.returncode == 0, out.stderr
    assert "pending" in out.stdout
    out = cli("up")
    assert out.returncode == 0 and "applied 0001_job" in out.stdout, out.stderr
    assert "nothing to apply" in cli("up").stdout
    out = cli("sql")
    assert "CREATE TABLE job" in out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0031_graph_counts\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0030_graph_after\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0029_group_windows\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0028_group_floors\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0027_rated_batches\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0026_ordering_keys\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0025_schedules\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0024_group_claims\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0023_on_hold\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0022_history_key_release\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0021_enqueue_contract\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0020_job_history\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0019_started_at\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0018_tracebacks\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0017_durable\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0016_flat_cascades\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0015_lighter_inserts\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0014_observe\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0013_workflows\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0012_rate_limits_groups\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout.startswith("reverted 0011_"), out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0010_masters\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0009_own_schema\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0008_status_page\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0007_stack_requests\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0006_handlers\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0005_periodic\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0004_claim_limited\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0003_queues\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and out.stdout == "reverted 0002_lease_expiries\n", out.stdout
    out = cli("down")
    assert out.returncode == 0 and "reverted 0001_job" in out.stdout
    assert brooq_objects(empty_dsn) == []


def test_lease_expiries_up_and_down_on_a_live_table(empty_dsn: str) -> None:
    """0002 adds a column to a table that holds jobs; its down step gives back exactly the
    table 0001 made, rows included."""

    def shape() -> list[tuple[str, str]]:
        with psycopg.connect(empty_dsn) as conn:
            return conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_name = 'job' ORDER BY ordinal_position"
            ).fetchall()

    migrate.up(empty_dsn, 1)
    before = shape()
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO job (topic) SELECT 't' FROM generate_series(1, 100)")
    assert [m.name for m in migrate.up(empty_dsn, 2)] == ["lease_expiries"]
    with psycopg.connect(empty_dsn) as conn:
        row = conn.execute("SELECT count(*), sum(lease_expiries) FROM job").fetchone()
    assert row == (100, 0)
    assert [m.name for m in migrate.down(empty_dsn)] == ["lease_expiries"]
    assert shape() == before
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM job").fetchone() == (100,)


def test_periodic_up_and_down(empty_dsn: str) -> None:
    """0005 adds brooq_periodic and nothing else (transactional); down drops exactly it,
    the jobs untouched, and up works again."""
    migrate.up(empty_dsn, 4)
    before = brooq_objects(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO job (topic) SELECT 't' FROM generate_series(1, 100)")
    assert [(m.name, m.transactional) for m in migrate.up(empty_dsn, 5)] == [("periodic", True)]
    added = sorted(set(brooq_objects(empty_dsn)) - set(before))
    assert "relation brooq_periodic" in added and "relation brooq_periodic_pkey" in added
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO brooq_periodic (name, last_tick) VALUES ('n', now())")
    assert [m.name for m in migrate.down(empty_dsn)] == ["periodic"]
    assert brooq_objects(empty_dsn) == before
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM job").fetchone() == (100,)
    migrate.up(empty_dsn, 5)
    assert "relation brooq_periodic" in brooq_objects(empty_dsn)


def test_stack_requests_up_and_down(empty_dsn: str) -> None:
    """0007 adds brooq_stack_request (and its index) and nothing else, on a table that
    holds jobs (a new table: no lock on job); down drops exactly it; up works again."""
    migrate.up(empty_dsn, 6)
    before = brooq_objects(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO job (topic) SELECT 't' FROM generate_series(1, 100)")
    assert [(m.name, m.transactional) for m in migrate.up(empty_dsn, 7)] == [
        ("stack_requests", True)
    ]
    added = sorted(set(brooq_objects(empty_dsn)) - set(before))
    assert "relation brooq_stack_request" in added
    assert "relation brooq_stack_request_job" in added
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO brooq_stack_request (job_id) VALUES (gen_random_uuid())")
    assert [m.name for m in migrate.down(empty_dsn)] == ["stack_requests"]
    assert brooq_objects(empty_dsn) == before
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM job").fetchone() == (100,)
    migrate.up(empty_dsn, 7)
    assert "relation brooq_stack_request" in brooq_objects(empty_dsn)


def test_masters_up_and_down_on_a_live_table(empty_dsn: str) -> None:
    """0010 adds brooq_master (and its key) and nothing else, on a table that holds jobs (a
    new table: no lock on job), while a producer's transaction holds job open; down drops
    exactly it; up works again."""
    migrate.up(empty_dsn, 9)
    before = brooq_objects(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO job (topic) SELECT 't' FROM generate_series(1, 100)")
    with psycopg.connect(empty_dsn) as producer:  # a transaction open on job meanwhile
        producer.execute("INSERT INTO job (topic) VALUES ('during')")
        assert [(m.name, m.transactional) for m in migrate.up(empty_dsn, 10)] == [("masters", True)]
        producer.commit()
    added = sorted(set(brooq_objects(empty_dsn)) - set(before))
    assert [a for a in added if not a.startswith("type ")] == [
        "relation brooq_master",
        "relation brooq_master_pkey",
    ]
    assert all("brooq_master" in a for a in added)  # its row types
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO brooq_master (id, host, pid, version, app, queues, topics, "
            "beat_seconds, started_at) VALUES (gen_random_uuid(), 'h', 1, '0', 'a:q', "
            "'{default}', '{t}', 10, now())"
        )
    assert [m.name for m in migrate.down(empty_dsn)] == ["masters"]
    assert brooq_objects(empty_dsn) == before
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM job").fetchone() == (101,)
    migrate.up(empty_dsn, 10)
    assert "relation brooq_master" in brooq_objects(empty_dsn)


def job_shape(dsn: str) -> list[tuple[object, ...]]:
    """Columns, constraints and indexes of job, and brooq_queue's presence."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            """
            SELECT 'column', column_name || ' ' || data_type || ' ' || coalesce(column_default, '')
            FROM information_schema.columns WHERE table_name = 'job'
            UNION ALL
            SELECT 'constraint', conname || ' ' || pg_get_constraintdef(oid) || ' ' || convalidated
            FROM pg_constraint WHERE conrelid = 'job'::regclass
            UNION ALL
            SELECT 'index', indexname || ' ' || indexdef FROM pg_indexes WHERE tablename = 'job'
            UNION ALL
            SELECT 'table', 'brooq_queue' WHERE to_regclass('brooq_queue') IS NOT NULL
            ORDER BY 1, 2
            """
        ).fetchall()


def test_queues_up_and_down_on_a_live_table(empty_dsn: str) -> None:
    """0003 runs statement by statement on a table that holds jobs: the rows get the
    default queue and priority, the CHECK is validated, the index is valid; down gives back
    exactly 0002's table, rows included, and up works again."""
    migrate.up(empty_dsn, 2)
    before = job_shape(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO job (topic) SELECT 't' FROM generate_series(1, 500)")
    assert [(m.name, m.transactional) for m in migrate.up(empty_dsn, 3)] == [("queues", False)]
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute(
            "SELECT count(*), min(queue), max(queue), min(priority), max(priority) FROM job"
        ).fetchone() == (500, "default", "default", 0, 0)
        assert conn.execute(
            "SELECT convalidated FROM pg_constraint WHERE conname = 'job_queue_check'"
        ).fetchone() == (True,)
        assert conn.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'job_ready_queue_idx'::regclass"
        ).fetchone() == (True,)
    after = job_shape(empty_dsn)
    assert [m.name for m in migrate.down(empty_dsn)] == ["queues"]
    assert job_shape(empty_dsn) == before
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM job").fetchone() == (500,)
        assert conn.execute("SELECT max(version) FROM brooq_migration").fetchone() == (2,)
    migrate.up(empty_dsn, 3)
    assert job_shape(empty_dsn) == after


def test_handlers_up_and_down_on_a_live_table(empty_dsn: str) -> None:
    """0006 adds result, errors and waited (nullable, no default) and the waited trigger
    to a table that holds jobs; down gives back exactly 0005's schema, rows included, and
    up again the same as the first time."""

    def schema() -> tuple[list[tuple[object, ...]], list[str]]:
        return job_shape(empty_dsn), brooq_objects(empty_dsn)

    migrate.up(empty_dsn, 5)
    before = schema()
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO job (topic) SELECT 't' FROM generate_series(1, 500)")
    assert [(m.name, m.transactional) for m in migrate.up(empty_dsn, 6)] == [("handlers", False)]
    after = schema()
    assert "trigger job_waited_notify" in after[1]
    assert "function brooq_job_waited_notify" in after[1]
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute(
            "SELECT count(*), count(result), count(errors), count(waited) FROM job"
        ).fetchone() == (500, 0, 0, 0)
        # The trigger notifies the end of a waited job, and only of one.
        conn.execute("LISTEN brooq_outcome")
        ids = [r[0] for r in conn.execute("SELECT id FROM job ORDER BY id LIMIT 2")]
        conn.execute("UPDATE job SET waited = true WHERE id = %s", (ids[0],))
        conn.execute("UPDATE job SET state = 'done' WHERE id = ANY(%s)", (ids,))
        assert [n.payload for n in conn.notifies(timeout=1, stop_after=2)] == [str(ids[0])]
    assert [m.name for m in migrate.down(empty_dsn)] == ["handlers"]
    assert schema() == before
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM job").fetchone() == (500,)
    migrate.up(empty_dsn, 6)
    assert schema() == after


def test_status_page_index_up_and_down_on_a_live_table(empty_dsn: str) -> None:
    """0008 builds job_failed_dead_idx concurrently on a table that holds jobs; the status
    page's list of dead jobs reads through it; down gives back exactly 0007's schema, rows
    included, and up again the same as the first time."""
    from brooq.sql import Q

    def schema() -> tuple[list[tuple[object, ...]], list[str]]:
        return job_shape(empty_dsn), brooq_objects(empty_dsn)

    migrate.up(empty_dsn, 7)
    before = schema()
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO job (topic, state) SELECT 't', "
            "(ARRAY['done', 'dead', 'failed', 'pending'])[1 + i % 4] "
            "FROM generate_series(1, 2000) AS i"
        )
    assert [(m.name, m.transactional) for m in migrate.up(empty_dsn, 8)] == [("status_page", False)]
    after = schema()
    assert any("job_failed_dead_idx" in str(row) for row in after[0])
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'job_failed_dead_idx'::regclass"
        ).fetchone() == (True,)
    newest = migration_files.load()[-1].version
    migrate.up(empty_dsn)  # today's statement reads columns of later migrations
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("ANALYZE job")
        conn.execute("SET enable_seqscan = off")  # a small table: is the index usable?
        params = {"state": "dead", "after_at": "infinity", "limit": 51, "error_chars": 300,
                  "after_id": "ffffffff-ffff-ffff-ffff-ffffffffffff", "tag": None,
                  "topic": None, "group": None}  # fmt: skip
        plan = conn.execute("EXPLAIN " + Q.web_finished_badly, params).fetchall()
        assert "job_failed_dead_idx" in " ".join(r[0] for r in plan), plan
    migrate.down(empty_dsn, newest - 8)
    assert [m.name for m in migrate.down(empty_dsn)] == ["status_page"]
    assert schema() == before
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM job").fetchone() == (2000,)
    migrate.up(empty_dsn, 8)
    assert schema() == after


def test_unique_keys_up_and_down_on_a_live_table(empty_dsn: str) -> None:
    """0011 adds unique_key, start_after and tags (nullable), their CHECKs (validated), the
    two partial unique indexes (valid), the functions and triggers, on a table that holds
    jobs; the index refuses a second active job of a key and the triggers move a waiting
    job up; down gives back exactly 0010's schema, rows included; up again the same."""

    def schema() -> tuple[list[tuple[object, ...]], list[str]]:
        return job_shape(empty_dsn), brooq_objects(empty_dsn)

    migrate.up(empty_dsn, 10)
    before = schema()
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO job (topic) SELECT 't' FROM generate_series(1, 500)")
    assert [(m.name, m.transactional) for m in migrate.up(empty_dsn, 11)] == [
        ("unique_keys", False)
    ]
    after = schema()
    assert {
        "trigger job_unique_key_freed",
        "trigger job_unique_key_waiting",
        "function brooq_job_promote",
        "function brooq_job_unique_key_freed",
        "function brooq_job_unique_key_waiting",
    } <= set(after[1])
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute(
            "SELECT count(*), count(unique_key), count(start_after), count(tags) FROM job"
        ).fetchone() == (500, 0, 0, 0)
        assert conn.execute(
            "SELECT bool_and(convalidated) FROM pg_constraint "
            "WHERE conname IN ('job_unique_key_check', 'job_tags_check')"
        ).fetchone() == (True,)
        assert conn.execute(
            "SELECT count(*), bool_and(indisvalid AND indisunique) FROM pg_index WHERE indexrelid "
            "IN ('job_unique_key_idx'::regclass, 'job_unique_key_waiting_idx'::regclass)"
        ).fetchone() == (2, True)
        conn.execute("INSERT INTO job (topic, unique_key, tags) VALUES ('t', 'k', '{a}')")
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("INSERT INTO job (topic, unique_key) VALUES ('t', 'k')")
        # a waiting job, moved up when the key's job ends
        conn.execute(
            "INSERT INTO job (topic, unique_key, available_at, start_after) "
            "VALUES ('t', 'k', '9999-01-01+00', now())"
        )
        conn.execute("UPDATE job SET state = 'done' WHERE unique_key = 'k' AND start_after IS NULL")
        assert conn.execute(
            "SELECT state, start_after IS NULL, available_at <= now() FROM job "
            "WHERE unique_key = 'k' ORDER BY created_at, id"
        ).fetchall() == [("done", True, True), ("pending", True, True)]
    assert [m.name for m in migrate.down(empty_dsn)] == ["unique_keys"]
    assert schema() == before
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM job").fetchone() == (502,)
    migrate.up(empty_dsn, 11)
    assert schema() == after


def test_rate_limits_up_and_down_on_a_live_table(empty_dsn: str) -> None:
    """0012 adds job.group_key (nullable, no default: the rows keep theirs), its CHECK
    (validated), job_ready_group_idx built concurrently, brooq_rate_slot, brooq_group_turn,
    brooq_master.limits and the coordinated claim's functions, on a table that holds jobs
    while a producer's transaction is open; down gives back exactly 0011's schema, rows
    included, and up again the same as the first time."""

    def schema() -> tuple[list[tuple[object, ...]], list[str]]:
        return job_shape(empty_dsn), brooq_objects(empty_dsn)

    migrate.up(empty_dsn, 11)
    before = schema()
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO job (topic) SELECT 't' FROM generate_series(1, 2000)")
    assert [(m.name, m.transactional) for m in migrate.up(empty_dsn, 12)] == [
        ("rate_limits_groups", False)
    ]
    after = schema()
    added = sorted(set(after[1]) - set(before[1]))
    assert [a for a in added if not a.startswith("type ")] == [
        "function brooq_claim_coordinated",
        "function brooq_window_room",
        "function brooq_window_sweep",
        "function brooq_window_take",
        "relation brooq_group_turn",
        "relation brooq_group_turn_pkey",
        "relation brooq_rate_slot",
        "relation brooq_rate_slot_free_idx",
        "relation brooq_rate_slot_pkey",
        "relation job_ready_group_idx",
    ]
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*), count(group_key) FROM job").fetchone() == (2000, 0)
        assert conn.execute(
            "SELECT convalidated FROM pg_constraint WHERE conname = 'job_group_key_check'"
        ).fetchone() == (True,)
        assert conn.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'job_ready_group_idx'::regclass"
        ).fetchone() == (True,)
        for bad in ("''", "repeat('x', 129)"):
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute(f"INSERT INTO job (topic, group_key) VALUES ('t', {bad})")
        # The functions find brooq's tables whatever the caller's search_path.
        conn.execute("SET search_path = pg_catalog")
        assert conn.execute(
            "SELECT count(*) FROM public.brooq_claim_coordinated('t', NULL, 1, 1.0, 1, NULL, "
            "NULL, '{default}', '{}', 'w', 30, 1)"
        ).fetchone() == (1,)
        assert conn.execute("SELECT public.brooq_window_sweep(10)").fetchone() == (0,)
        conn.execute("RESET search_path")
        assert conn.execute("SELECT count(*) FROM brooq_rate_slot").fetchone() == (1,)
        conn.execute("UPDATE brooq_master SET limits = '{}'")  # the column is there
    assert [m.name for m in migrate.down(empty_dsn)] == ["rate_limits_groups"]
    assert schema() == before
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM job").fetchone() == (2000,)
    migrate.up(empty_dsn, 12)
    assert schema() == after


def test_lighter_inserts_up_and_down_on_a_live_table(empty_dsn: str) -> None:
    """0015 drops job_ready_idx concurrently on a table that holds jobs, and lets the
    default queue's rows pass the queue name's CHECK without its regular expression (the
    CHECK still refuses what it refused); every claim of a child still reads
    job_ready_queue_idx (no sequential scan, no sort); down gives back exactly 0014's
    schema, rows included, and up again the same as the first time."""
    from brooq.sql import Q

    def schema() -> tuple[list[tuple[object, ...]], list[str]]:
        return job_shape(empty_dsn), brooq_objects(empty_dsn)

    migrate.up(empty_dsn, 14)
    before = schema()
    assert "relation job_ready_idx" in before[1]
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO job (topic) SELECT 't' FROM generate_series(1, 2000)")
    assert [(m.name, m.transactional) for m in migrate.up(empty_dsn, 15)] == [
        ("lighter_inserts", False)
    ]
    after = schema()
    assert sorted(set(before[1]) - set(after[1])) == ["relation job_ready_idx"]
    assert set(after[1]) <= set(before[1])
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        check = "SELECT convalidated, pg_get_constraintdef(oid) FROM pg_constraint "
        check += "WHERE conname = 'job_queue_check'"
        valid, text = conn.execute(check).fetchone()  # type: ignore[misc]
        assert valid and "'default'" in text, text
        for bad in ("'Bad Queue'", "repeat('q', 129)", "'default '"):
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute(f"INSERT INTO job (topic, queue) VALUES ('t', {bad})")
        added = conn.execute(
            "INSERT INTO job (topic, queue) VALUES ('t', 'default'), ('t', 'mail.eu') RETURNING id"
        ).fetchall()
        conn.execute("DELETE FROM job WHERE id = ANY(%s)", ([row[0] for row in added],))
    newest = migration_files.load()[-1].version
    migrate.up(empty_dsn)  # today's claim writes columns of later migrations
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("ANALYZE job")
        conn.execute("SET enable_seqscan = off")  # as the children run
        conn.execute("SET enable_bitmapscan = off")
        conn.execute("SET enable_sort = off")
        params = {"done": [], "topics": ["t"], "limit": 32, "children": 2, "worker": "w",
                  "lease": 30.0, "queue": "default"}  # fmt: skip
        plan = " ".join(
            r[0] for r in conn.execute("EXPLAIN " + Q.job_finish_and_claim, params).fetchall()
        )
        assert "job_ready_queue_idx" in plan and "Seq Scan on job" not in plan, plan
        assert " Sort " not in plan, plan
    migrate.down(empty_dsn, newest - 15)
    assert [m.name for m in migrate.down(empty_dsn)] == ["lighter_inserts"]
    assert schema() == before
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM job").fetchone() == (2000,)
        assert conn.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'job_ready_idx'::regclass"
        ).fetchone() == (True,)
    # Behind a transaction that has read the table, the drop times out (lock_timeout),
    # leaving the index invalid; the migrator retries and the drop completes.
    reader = psycopg.connect(empty_dsn)
    reader.execute("SELECT count(*) FROM job")
    ender = threading.Timer(2.5, reader.rollback)
    ender.start()
    try:
        assert [m.name for m in migrate.up(empty_dsn, 15)] == ["lighter_inserts"]
    finally:
        ender.join()
        reader.close()
    assert schema() == after


def test_observe_columns_up_and_down_on_a_live_table(empty_dsn: str) -> None:
    """0014 adds job.progress, progress_message, logs and traceparent (nullable, no
    default: the rows keep what they have, all NULL); down gives back exactly 0013's
    schema, rows included, and up again the same as the first time."""
    migrate.up(empty_dsn, 13)
    before = job_shape(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO job (topic) SELECT 't' FROM generate_series(1, 2000)")
    assert [m.name for m in migrate.up(empty_dsn, 14)] == ["observe"]
    after = job_shape(empty_dsn)
    assert sorted(set(after) - set(before)) == [
        ("column", "logs jsonb "),
        ("column", "progress double precision "),
        ("column", "progress_message text "),
        ("column", "traceparent text "),
    ]
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute(
            "SELECT count(*), count(progress), count(logs), count(traceparent) FROM job"
        ).fetchone() == (2000, 0, 0, 0)
    assert [m.name for m in migrate.down(empty_dsn)] == ["observe"]
    assert job_shape(empty_dsn) == before
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM job").fetchone() == (2000,)
    migrate.up(empty_dsn, 14)
    assert job_shape(empty_dsn) == after


def test_tracebacks_up_and_down_on_a_live_table(empty_dsn: str) -> None:
    """0018 adds brooq_errors_append and nothing else (job's shape is 0017's); the rows
    and their error history stay as they are, down and up; down gives back exactly
    0017's objects. After down, the error history written meanwhile (with tracebacks)
    is still read by the release before (its four keys are there)."""
    migrate.up(empty_dsn, 17)
    before, shape = brooq_objects(empty_dsn), job_shape(empty_dsn)
    old = '[{"attempt": 1, "at": "2026-12-01T10:00:00+00:00", "error": "e", "worker": "w"}]'
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO job (topic, errors) SELECT 't', %s::jsonb FROM generate_series(1, 2000)",
            (old,),
        )
    assert [(m.name, m.transactional) for m in migrate.up(empty_dsn, 18)] == [("tracebacks", True)]
    after = brooq_objects(empty_dsn)
    assert sorted(set(after) - set(before)) == ["function brooq_errors_append"]
    assert job_shape(empty_dsn) == shape
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        appended = conn.execute(
            "SELECT brooq_errors_append(errors, jsonb_build_object("
            "'attempt', 2, 'error', 'x', 'traceback', 'tb')) FROM job LIMIT 1"
        ).fetchone()
        assert appended is not None and [e["attempt"] for e in appended[0]] == [1, 2]
        conn.execute(
            "UPDATE job SET errors = brooq_errors_append(errors, "
            '\'{"attempt": 2, "at": "x", "error": "e2", "worker": "w", '
            '"kind": "raised", "traceback": "tb"}\')'
        )
    assert [m.name for m in migrate.down(empty_dsn)] == ["tracebacks"]
    assert brooq_objects(empty_dsn) == before and job_shape(empty_dsn) == shape
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute(
            "SELECT count(*), min(jsonb_array_length(errors)), "
            "count(*) FILTER (WHERE errors->1->>'error' = 'e2' AND errors->1 ? 'worker') FROM job"
        ).fetchone() == (2000, 2, 2000)
    migrate.up(empty_dsn, 18)
    assert brooq_objects(empty_dsn) == after


CLAIM_FUNCTIONS = (
    "brooq_claim_limited(text, integer, text[], uuid[], text, float8, integer)",
    "brooq_claim_coordinated(text, integer, integer, float8, integer, integer, float8, "
    "text[], uuid[], text, float8, integer)",
)


def claim_functions(dsn: str) -> list[tuple[str, list[str] | None]]:
    """The limited claims' definitions and settings (their pinned search_path)."""
    found = []
    with psycopg.connect(dsn) as conn:
        for fn in CLAIM_FUNCTIONS:
            row = conn.execute(
                "SELECT pg_get_functiondef(%s::regprocedure), proconfig FROM pg_proc "
                "WHERE oid = %s::regprocedure",
                (fn, fn),
            ).fetchone()
            assert row is not None, fn
            found.append((row[0], row[1]))
    return found


def test_started_at_up_and_down_on_a_live_table(empty_dsn: str) -> None:
    """0019 adds job.started_at (nullable, no default: the rows keep what they have, all
    NULL) and redefines the limited claims (brooq_claim_limited, brooq_claim_coordinated)
    to set it and to clear the progress, their search_path pinned as before, on a table
    that holds jobs; down gives back exactly 0018's table and function bodies, rows
    included, and up again the same as the first time."""
    migrate.up(empty_dsn, 18)
    before, functions = job_shape(empty_dsn), claim_functions(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO job (topic, progress, progress_message) "
            "SELECT 'lim', 0.5, 'old' FROM generate_series(1, 2000)"
        )
    assert [(m.name, m.transactional) for m in migrate.up(empty_dsn, 19)] == [("started_at", False)]
    after, redefined = job_shape(empty_dsn), claim_functions(empty_dsn)
    assert sorted(set(after) - set(before)) == [("column", "started_at timestamp with time zone ")]
    assert [c for _, c in redefined] == [c for _, c in functions]  # the settings kept
    assert all(c and any(s.startswith("search_path=pg_catalog") for s in c) for _, c in redefined)
    for (old, _), (new, _) in zip(functions, redefined, strict=True):
        assert "started_at" not in old and "progress" not in old
        assert new.count("started_at = now()") == 1
        assert new.count("progress = NULL, progress_message = NULL") == 1
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*), count(started_at) FROM job").fetchone() == (2000, 0)
        # Each function claims with its start and no progress, whatever the caller's
        # search_path.
        conn.execute("SET search_path = pg_catalog")
        limited = conn.execute(
            "SELECT id FROM public.brooq_claim_limited('lim', 5, '{default}', '{}', 'w', 30, 1)"
        ).fetchall()
        coordinated = conn.execute(
            "SELECT id FROM public.brooq_claim_coordinated('lim', NULL, 100, 1.0, 1, NULL, "
            "NULL, '{default}', '{}', 'w', 30, 1)"
        ).fetchall()
        conn.execute("RESET search_path")
        claimed = [r[0] for r in limited + coordinated]
        assert len(claimed) == 2
        assert conn.execute(
            "SELECT count(*) FROM job WHERE id = ANY(%s) AND started_at = updated_at "
            "AND progress IS NULL AND progress_message IS NULL",
            (claimed,),
        ).fetchone() == (2,)
    assert [m.name for m in migrate.down(empty_dsn)] == ["started_at"]
    assert job_shape(empty_dsn) == before
    assert claim_functions(empty_dsn) == functions
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT count(*), count(progress) FROM job").fetchone() == (2000, 1998)
    migrate.up(empty_dsn, 19)
    assert job_shape(empty_dsn) == after and claim_functions(empty_dsn) == redefined


def test_workflows_up_and_down_on_a_live_table(empty_dsn: str) -> None:
    """0013 adds the waiting state to job_state_check (validated), four nullable columns
    (the rows keep theirs), brooq_job_edge, the trigger and the producer's function, on a
    table that holds jobs; down refuses while a job waits, then gives back exactly
    0012's schema, rows included, and up again the same as the first time."""

    def schema() -> tuple[list[tuple[object, ...]], list[str]]:
        return job_shape(empty_dsn), brooq_objects(empty_dsn)

    migrate.up(empty_dsn, 12)
    before = schema()
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO job (topic) SELECT 't' FROM generate_series(1, 2000)")
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("INSERT INTO job (topic, state) VALUES ('t', 'waiting')")
    assert [(m.name, m.transactional) for m in migrate.up(empty_dsn, 13)] == [("workflows", False)]
    after = schema()
    added = sorted(set(after[1]) - set(before[1]))
    assert [a for a in added if not a.startswith("type ")] == [
        "function brooq_job_after",
        "function brooq_job_upstream_ended",
        "relation brooq_job_edge",
        "relation brooq_job_edge_pkey",
        "relation brooq_job_edge_upstream_idx",
        "relation job_waiting_idx",
        "trigger job_upstream_ended",
    ]
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute(
            "SELECT count(*), count(upstream_open), count(has_downstream) FROM job"
        ).fetchone() == (2000, 0, 0)
        assert conn.execute(
            "SELECT conname, convalidated FROM pg_constraint "
            "WHERE conname IN ('job_state_check', 'job_on_upstream_failure_check') ORDER BY 1"
        ).fetchall() == [("job_on_upstream_failure_check", True), ("job_state_check", True)]
        # The graph as 0013's producer wrote it (today's producer needs a later schema):
        # the two rows, then brooq_job_after for the edge.
        up, down = uuid.uuid4(), uuid.uuid4()
        conn.execute("INSERT INTO job (id, topic) VALUES (%s, 't'), (%s, 't')", (up, down))
        conn.execute(
            "SELECT brooq_job_after(ARRAY[%s]::uuid[], ARRAY['cancel'], ARRAY[%s]::uuid[], "
            "ARRAY[%s]::uuid[])",
            (down, down, up),
        )
        # The functions find brooq's tables whatever the caller's search_path.
        conn.execute("SET search_path = pg_catalog")
        conn.execute("UPDATE public.job SET state = 'done' WHERE id = %s", (up,))
        conn.execute("RESET search_path")
        assert conn.execute("SELECT state FROM job WHERE id = %s", (down,)).fetchone() == (
            "pending",
        )
        conn.execute("UPDATE job SET state = 'waiting' WHERE id = %s", (down,))
    with pytest.raises(migrate.MigrationError, match="jobs are waiting for other jobs"):
        migrate.down(empty_dsn)
    assert schema() == after  # nothing was reverted
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM job WHERE id IN (%s, %s)", (up, down))
    assert [m.name for m in migrate.down(empty_dsn)] == ["workflows"]
    assert schema() == before
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM job").fetchone() == (2000,)
    migrate.up(empty_dsn, 13)
    assert schema() == after


def test_a_failed_concurrent_build_is_rebuilt(empty_dsn: str) -> None:
    """A canceled CREATE INDEX CONCURRENTLY leaves an INVALID index that `IF NOT EXISTS`
    would skip; the migrator drops it and builds it again, and records the version only
    then."""
    migrate.up(empty_dsn, 3)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO job (topic) SELECT 't' FROM generate_series(1, 50000)")
        conn.execute("DROP INDEX job_ready_queue_idx")
        conn.execute("DELETE FROM brooq_migration WHERE version = 3")
        # An open writer: the build enters the catalog (INVALID), then waits for it.
        with psycopg.connect(empty_dsn) as writer:
            writer.execute("INSERT INTO job (topic) VALUES ('t')")
            conn.execute("SET lock_timeout = '200ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                conn.execute(
                    "CREATE INDEX CONCURRENTLY job_ready_queue_idx "
                    "ON job (queue, priority DESC, available_at, id) "
                    "WHERE state IN ('pending', 'failed')"
                )
            conn.execute("RESET lock_timeout")
        assert conn.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'job_ready_queue_idx'::regclass"
        ).fetchone() == (False,)
    assert [m.name for m in migrate.up(empty_dsn, 3)] == ["queues"]
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'job_ready_queue_idx'::regclass"
        ).fetchone() == (True,)


def test_a_waiting_statement_does_not_queue_producers(
    empty_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction that read job holds the ALTER of 0003 back. Without lock_timeout the
    ALTER would wait in the lock queue and every producer behind it; with it, the ALTER
    gives up after LOCK_TIMEOUT, producers go on while the reader is still open, and the
    migration succeeds once it is gone."""
    monkeypatch.setattr(migrate, "LOCK_RETRY_PAUSE", 0.2)
    migrate.up(empty_dsn, 2)
    reader = psycopg.connect(empty_dsn)
    reader.execute("SELECT count(*) FROM job")  # holds ACCESS SHARE until it ends
    done: list[object] = []
    migrating = threading.Thread(target=lambda: done.append(migrate.up(empty_dsn, 3)))
    migrating.start()
    with psycopg.connect(empty_dsn, autocommit=True) as producer:
        # Wait until the ALTER is in the lock queue (or between its tries), then insert.
        deadline = time.monotonic() + 10
        while not producer.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE 'ALTER TABLE job%%'"
        ).fetchone()[0]:  # type: ignore[index]
            assert time.monotonic() < deadline, "the migration never waited for its lock"
            time.sleep(0.01)
        producer.execute("SET statement_timeout = '3s'")  # without lock_timeout: canceled
        producer.execute("INSERT INTO job (topic) VALUES ('t')")
    assert migrating.is_alive()  # the reader still holds it back
    reader.close()
    migrating.join(30)
    assert not migrating.is_alive() and len(done) == 1
    assert [m.name for m in done[0]] == ["queues"]  # type: ignore[attr-defined]


def test_a_lock_never_granted_fails_with_the_holder_named(
    empty_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(migrate, "LOCK_RETRIES", 2)
    monkeypatch.setattr(migrate, "LOCK_RETRY_PAUSE", 0.1)
    migrate.up(empty_dsn, 2)
    with psycopg.connect(empty_dsn, application_name="long-report") as reader:
        reader.execute("SELECT count(*) FROM job")
        pid = reader.info.backend_pid
        with pytest.raises(migrate.MigrationError) as failed:
            migrate.up(empty_dsn, 3)
    message = str(failed.value)
    assert "0003_queues" in message and f"pid {pid} (long-report" in message, message
    assert [s.version for s in migrate.status(empty_dsn) if s.applied_at] == [1, 2]
    assert [m.name for m in migrate.up(empty_dsn, 3)] == ["queues"]  # idempotent re-run
