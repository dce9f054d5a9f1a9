"""Migrations: up, down to zero, up again on a clean database; nothing left after down."""

from __future__ import annotations

import subprocess
import sys
import threading

import psycopg
import pytest

from brooq import migrate


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
    assert [m.version for m in applied] == [m.version for m in migrate.load()]
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
    ]
    nullable = {c[0] for c in columns if c[2] == "YES"}
    assert nullable == {"locked_by", "locked_until", "last_error", "idempotency_key"}
    assert {
        "job_pkey",
        "job_topic_idempotency_key_key",
        "job_ready_idx",
        "job_processing_lease_idx",
        "job_terminal_updated_idx",
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
    results: list[list[migrate.Migration]] = []
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
    assert sorted(len(r) for r in results) == [0, 0, 0, len(migrate.load())]


def test_sql_script_builds_the_same_schema(empty_dsn: str, dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(migrate.script("up"))  # type: ignore[arg-type]
    declared = [o for o in brooq_objects(dsn) if "brooq_migration" not in o]
    assert brooq_objects(empty_dsn) == declared
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(migrate.script("down"))  # type: ignore[arg-type]
    assert brooq_objects(empty_dsn) == []


def test_cli_migrate(empty_dsn: str) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "brooq", "--database", empty_dsn, "migrate", *args],
            capture_output=True,
            text=True,
            timeout=60,
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
    assert [m.name for m in migrate.up(empty_dsn)] == ["lease_expiries"]
    with psycopg.connect(empty_dsn) as conn:
        row = conn.execute("SELECT count(*), sum(lease_expiries) FROM job").fetchone()
    assert row == (100, 0)
    assert [m.name for m in migrate.down(empty_dsn)] == ["lease_expiries"]
    assert shape() == before
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM job").fetchone() == (100,)
