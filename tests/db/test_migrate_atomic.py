"""A down step is all or nothing, and the recorded version never lies: a revert that
stops part-way is recorded as such, `up` checks that what is recorded as applied is
there, and each refusal says what to run next."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from brooq import migrate
from brooq.errors import SchemaMissing
from brooq.schema import check as migration_check
from brooq.schema import files as migration_files
from tests.cliproc import run_brooq


def cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_brooq(
        ["--database", dsn, "migrate", *args], env=dict(os.environ), cwd=Path.cwd(), timeout=120
    )


def workflow_objects(dsn: str) -> list[str]:
    """What 0013 adds, as the catalog has it (an index counts only when valid)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            """
            SELECT 'relation ' || c.relname FROM pg_class c
            LEFT JOIN pg_index i ON i.indexrelid = c.oid
            WHERE c.relname IN ('brooq_job_edge', 'brooq_job_edge_upstream_idx',
                                'job_waiting_idx') AND coalesce(i.indisvalid, true)
            UNION ALL
            SELECT 'function ' || proname FROM pg_proc
            WHERE proname IN ('brooq_job_after', 'brooq_job_upstream_ended')
            UNION ALL
            SELECT 'trigger ' || tgname FROM pg_trigger WHERE tgname = 'job_upstream_ended'
            UNION ALL
            SELECT 'column ' || attname FROM pg_attribute
            WHERE attrelid = 'job'::regclass AND NOT attisdropped
              AND attname IN ('upstream_open', 'upstream_failed', 'on_upstream_failure',
                              'has_downstream')
            UNION ALL
            SELECT 'constraint ' || conname || (CASE WHEN convalidated THEN '' ELSE ' (not valid)'
                                                END)
            FROM pg_constraint WHERE conname = 'job_on_upstream_failure_check'
            """
        ).fetchall()
    return sorted(r[0] for r in rows)


ALL_0013 = [
    "column has_downstream",
    "column on_upstream_failure",
    "column upstream_failed",
    "column upstream_open",
    "constraint job_on_upstream_failure_check",
    "function brooq_job_after",
    "function brooq_job_upstream_ended",
    "relation brooq_job_edge",
    "relation brooq_job_edge_upstream_idx",
    "relation job_waiting_idx",
    "trigger job_upstream_ended",
]


def applied(dsn: str) -> list[int]:
    return [s.version for s in migrate.status(dsn) if s.applied_at]


def state_of(dsn: str, version: int) -> str:
    return next(s.state for s in migrate.status(dsn) if s.version == version)


def wait_for_lock_wait(dsn: str, pid_not: int) -> None:
    """Poll until a session other than ``pid_not`` waits for a lock on job."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        deadline = time.monotonic() + 30
        while not conn.execute(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND pid <> %s "
            "AND relation = 'job'::regclass",
            (pid_not,),
        ).fetchone()[0]:  # type: ignore[index]
            assert time.monotonic() < deadline, "the down step never waited for the producer"
            time.sleep(0.02)


def enqueue_at_0013(conn: psycopg.Connection[Any], after: uuid.UUID | None = None) -> uuid.UUID:
    """A job as the producer of migration 0013 wrote it (today's producer needs a later
    schema): its row, and with ``after`` its edge through brooq_job_after."""
    job_id = uuid.uuid4()
    conn.execute("INSERT INTO job (id, topic) VALUES (%s, 't')", (job_id,))
    if after is not None:
        conn.execute(
            "SELECT brooq_job_after(ARRAY[%s]::uuid[], ARRAY['cancel'], ARRAY[%s]::uuid[], "
            "ARRAY[%s]::uuid[])",
            (job_id, job_id, after),
        )
    return job_id


def test_down_beside_an_open_graph_enqueue_is_all_or_nothing(empty_dsn: str) -> None:
    """A producer's transaction holds a waiting job (uncommitted) while 0013 is reverted:
    the down step waits for it, then sees the job and refuses with nothing changed; 0013
    stays whole and recorded, the job is released when its upstream ends, and the down
    step succeeds once no job waits."""
    migrate.up(empty_dsn, 15)
    out = cli(empty_dsn, "down", "--steps", "2")
    assert out.returncode == 0, out.stderr
    assert applied(empty_dsn)[-1] == 13
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        upstream = enqueue_at_0013(conn)
    producer = psycopg.connect(empty_dsn)
    downstream = enqueue_at_0013(producer, after=upstream)
    down = subprocess.Popen(
        [sys.executable, "-m", "brooq", "--database", empty_dsn, "migrate", "down"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_lock_wait(empty_dsn, producer.info.backend_pid)
        producer.commit()  # the waiting job is there now
        stdout, stderr = down.communicate(timeout=120)
    finally:
        producer.close()
        if down.poll() is None:
            down.kill()
    assert down.returncode == 1, (stdout, stderr)
    assert "jobs are waiting for other jobs" in stderr and "cancel" in stderr, stderr
    assert "0013_workflows" in stderr and "nothing was reverted" in stderr, stderr
    assert "Traceback" not in stderr
    # Nothing of 0013 went, and it is recorded as applied, truthfully.
    assert workflow_objects(empty_dsn) == ALL_0013
    status = cli(empty_dsn, "status")
    assert status.returncode == 0, status.stderr
    assert "0013_workflows" in status.stdout and "partly" not in status.stdout, status.stdout
    assert applied(empty_dsn)[-1] == 13
    out = cli(empty_dsn, "up", "--to", "15")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "applied 0014_observe\napplied 0015_lighter_inserts\n", out.stdout
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("UPDATE job SET state = 'done' WHERE id = %s", (upstream,))
        assert conn.execute("SELECT state FROM job WHERE id = %s", (downstream,)).fetchone() == (
            "pending",
        )
    # No job waits any more: the down step reverts 0013 wholly.
    out = cli(empty_dsn, "down", "--steps", "3")
    assert out.returncode == 0, out.stderr
    assert applied(empty_dsn)[-1] == 12
    assert workflow_objects(empty_dsn) == []


def test_down_beside_a_rolled_back_graph_enqueue_reverts_wholly(empty_dsn: str) -> None:
    """The same producer rolls back: the down step, which waited for it, reverts 0013."""
    migrate.up(empty_dsn, 13)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        upstream = enqueue_at_0013(conn)
    producer = psycopg.connect(empty_dsn)
    enqueue_at_0013(producer, after=upstream)
    down = subprocess.Popen(
        [sys.executable, "-m", "brooq", "--database", empty_dsn, "migrate", "down"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_lock_wait(empty_dsn, producer.info.backend_pid)
        producer.rollback()
        stdout, stderr = down.communicate(timeout=120)
    finally:
        producer.close()
        if down.poll() is None:
            down.kill()
    assert down.returncode == 0 and stdout == "reverted 0013_workflows\n", (stdout, stderr)
    assert workflow_objects(empty_dsn) == []
    assert applied(empty_dsn)[-1] == 12
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute(
            "SELECT convalidated FROM pg_constraint WHERE conname = 'job_state_check'"
        ).fetchone() == (True,)


def queue_check(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_get_constraintdef(oid) || CASE WHEN convalidated THEN '' "
            "ELSE ' (not valid)' END FROM pg_constraint WHERE conname = 'job_queue_check'"
        ).fetchone()
    assert row is not None
    return str(row[0])


def ready_index(dsn: str) -> list[tuple[str, bool]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT c.relname::text, i.indisvalid FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = 'job_ready_idx'"
        ).fetchall()


def test_down_beside_an_old_snapshot_changes_nothing_or_everything(
    empty_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0015's down builds an index concurrently, which waits for every older snapshot. A
    snapshot held through every retry: the step gives up with nothing changed, 0015
    recorded as applied, and the advice to run the down step again; once the snapshot
    is gone, the down step reverts 0015 wholly."""
    monkeypatch.setattr(migrate, "LOCK_RETRIES", 2)
    monkeypatch.setattr(migrate, "LOCK_RETRY_PAUSE", 0.1)
    migrate.up(empty_dsn, 15)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO job (topic) SELECT 't' FROM generate_series(1, 1000)")
    applied_check = queue_check(empty_dsn)
    assert "'default'" in applied_check
    with psycopg.connect(empty_dsn) as reader:
        reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        reader.execute("SELECT count(*) FROM brooq_master")  # a snapshot, no lock on job
        with pytest.raises(migrate.MigrationError) as failed:
            migrate.down(empty_dsn)
        message = str(failed.value)
        assert "0015_lighter_inserts" in message and "`brooq migrate down`" in message, message
        assert "nothing was reverted" in message and "migrate up" not in message, message
        assert applied(empty_dsn)[-1] == 15
        assert state_of(empty_dsn, 15) == "applied"
        assert queue_check(empty_dsn) == applied_check
        assert ready_index(empty_dsn) == []
    assert [m.name for m in migrate.down(empty_dsn)] == ["lighter_inserts"]
    assert "'default'" not in queue_check(empty_dsn)
    assert "not valid" not in queue_check(empty_dsn)
    assert ready_index(empty_dsn) == [("job_ready_idx", True)]


def test_up_refuses_a_schema_recorded_as_applied_that_is_not(empty_dsn: str) -> None:
    """What an interrupted revert of an older brooq left: 0013 recorded as applied without
    its table, functions and trigger. `up` and `status` say so and exit 1; `up --repair`
    runs 0013's up part again."""
    migrate.up(empty_dsn, 15)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("DROP TRIGGER job_upstream_ended ON job")
        conn.execute("DROP FUNCTION brooq_job_after(uuid[], text[], uuid[], uuid[])")
        conn.execute("DROP FUNCTION brooq_job_upstream_ended()")
        conn.execute("DROP TABLE brooq_job_edge")
    out = cli(empty_dsn, "up", "--to", "15")
    assert out.returncode == 1, out.stdout
    assert "0013_workflows" in out.stderr and "brooq_job_edge" in out.stderr, out.stderr
    assert "brooq migrate up --repair" in out.stderr, out.stderr
    status = cli(empty_dsn, "status")
    assert status.returncode == 1
    assert "0013_workflows" in status.stdout and "damaged" in status.stdout, status.stdout
    out = cli(empty_dsn, "up", "--to", "15", "--repair")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "repaired 0013_workflows\n", out.stdout
    assert workflow_objects(empty_dsn) == ALL_0013
    assert cli(empty_dsn, "status").returncode == 0


def test_up_refuses_a_schema_without_the_error_historys_function(empty_dsn: str) -> None:
    """0018 recorded as applied without brooq_errors_append (every failed attempt's write
    calls it): `up` and `status` name the function and exit 1 (0018 runs in one
    transaction: only a hand could do that, and the message says how to restore it)."""
    migrate.up(empty_dsn, 18)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("DROP FUNCTION brooq_errors_append(jsonb, jsonb)")
    out = cli(empty_dsn, "up", "--to", "18")
    assert out.returncode == 1, out.stdout
    assert "0018_tracebacks" in out.stderr, out.stderr
    assert "lacks function brooq_errors_append" in out.stderr, out.stderr
    status = cli(empty_dsn, "status")
    assert status.returncode == 1 and "damaged" in status.stdout, status.stdout
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(migration_files.load()[17].up)
    assert cli(empty_dsn, "status").returncode == 0


def with_extra(tmp_path: Path, down: str) -> list[migration_files.Migration]:
    """brooq's migrations and a next one, in the usual format, that creates a table and
    an index concurrently and whose down part is ``down``."""
    every = migration_files.load()[:15]
    for m in every:
        (tmp_path / f"{m.version:04d}_{m.name}.sql").write_text(
            ("-- migrate:no-transaction\n" if not m.transactional else "")
            + f"-- migrate:up\n{m.up}\n-- migrate:down\n{m.down}\n"
        )
    nxt = len(every) + 1
    (tmp_path / f"{nxt:04d}_extra.sql").write_text(
        "-- migrate:no-transaction\n-- migrate:up\n"
        "CREATE TABLE IF NOT EXISTS extra_thing (id integer);\n\n"
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS job_extra_idx ON job (created_at);\n\n"
        "DO $$ BEGIN IF to_regclass('extra_stop_up') IS NOT NULL THEN "
        "RAISE EXCEPTION 'stopped'; END IF; END $$;\n\n"
        f"-- migrate:down\n{down}\n"
    )
    return migration_files.load(tmp_path)


def test_a_stopped_step_is_recorded_as_part_way(
    empty_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any no-transaction file in the usual format: a down part that stops after its first
    statement is recorded as partly reverted (status, verify and up say so), and a
    second down finishes it; an up part that stops part-way is recorded as partly
    applied, and a down reverts what it did."""
    down = (
        "DROP INDEX CONCURRENTLY IF EXISTS job_extra_idx;\n\n"
        "DO $$ BEGIN IF to_regclass('extra_stop_down') IS NOT NULL THEN "
        "RAISE EXCEPTION 'stopped'; END IF; END $$;\n\n"
        "DROP TABLE IF EXISTS extra_thing;"
    )
    every = with_extra(tmp_path, down)
    monkeypatch.setattr(migrate, "load", lambda: every)
    monkeypatch.setattr(migration_check, "load", lambda: every)
    extra = every[-1].version
    migrate.up(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE extra_stop_down ()")
    with pytest.raises(migrate.MigrationError) as failed:
        migrate.down(empty_dsn)
    assert "partly reverted" in str(failed.value) and "`brooq migrate down`" in str(failed.value)
    assert state_of(empty_dsn, extra) == "reverting"
    with (
        psycopg.connect(empty_dsn, autocommit=True) as conn,
        pytest.raises(SchemaMissing, match="partly reverted"),
    ):
        migrate.verify(conn)
    with pytest.raises(migrate.MigrationError, match="partly reverted"):
        migrate.up(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE extra_stop_down")
    assert [m.version for m in migrate.down(empty_dsn)] == [extra]
    assert applied(empty_dsn)[-1] == extra - 1
    # An up part stopped after its index: partly applied; a down reverts it.
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE extra_stop_up ()")
    with pytest.raises(migrate.MigrationError, match="partly applied"):
        migrate.up(empty_dsn)
    assert state_of(empty_dsn, extra) == "applying"
    assert [m.version for m in migrate.down(empty_dsn)] == [extra]
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('job_extra_idx')").fetchone() == (None,)
        conn.execute("DROP TABLE extra_stop_up")
    assert [m.version for m in migrate.up(empty_dsn)] == [extra]
