"""The enqueue contract (migration 0021, docs/reference/enqueue-contract.md), called from
psql as another language's client would: its jobs run like any other."""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import brooq
from tests.harness import MasterProcess, wait_for

StartMaster = Callable[..., MasterProcess]
PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "enqueue-contract.md"


def psql(dsn: str, sql: str) -> subprocess.CompletedProcess[str]:
    # psql is PostgreSQL's client, installed with the server's packages (.ci/run).
    return subprocess.run(
        ["psql", dsn, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def enqueue(dsn: str, sql: str) -> uuid.UUID:
    done = psql(dsn, sql)
    assert done.returncode == 0, done.stderr
    return uuid.UUID(done.stdout.strip())


def count(db: psycopg.Connection[Any]) -> int:
    row = db.execute("SELECT count(*) FROM job_all").fetchone()
    assert row is not None
    return int(row[0])


def test_a_job_enqueued_from_psql_runs_like_any_other(
    dsn: str, db: psycopg.Connection[Any], queue: brooq.Queue, start_master: StartMaster
) -> None:
    job_id = enqueue(dsn, """SELECT brooq_enqueue('t.echo', '{"echo": "from psql"}')""")
    assert job_id.version == 7
    start_master(workers=1)
    record = wait_for(
        lambda: (r := queue.get(job_id)) is not None and r.state == "done" and r,
        what="the job done",
    )
    assert record.result == {"echo": "from psql"}
    assert record.attempts == 1


def test_the_pages_examples_run_and_the_contract_has_its_version(
    dsn: str, db: psycopg.Connection[Any], queue: brooq.Queue
) -> None:
    page = PAGE.read_text()
    examples = [
        block
        for block in re.findall(r"```sql\n(.*?)```", page, re.S)
        if block.lstrip().startswith("SELECT brooq_enqueue")
    ]
    assert len(examples) == 2
    ids = [enqueue(dsn, block) for block in examples]
    first = queue.get(ids[0])
    assert first is not None and (first.topic, first.payload) == (
        "email.send",
        {"to": "ada@example.com"},
    )
    report = queue.get(ids[1])
    assert report is not None
    assert (report.queue, report.priority, report.tags) == ("reports", 5, ["nightly"])
    assert report.state == "pending" and report.available_at > first.available_at
    # The key is the job's for its life: the same call gives the same job, nothing written.
    before = count(db)
    assert enqueue(dsn, examples[1]) == ids[1]
    assert count(db) == before
    assert psql(dsn, "SELECT brooq_contract_version()").stdout.strip() == "1"


def test_a_key_whose_job_finished_still_names_that_job(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    sql = "SELECT brooq_enqueue('t.ok', idempotency_key => 'once')"
    job_id = enqueue(dsn, sql)
    db.execute("UPDATE job SET state = 'canceled' WHERE id = %s", [job_id])  # moved
    row = db.execute("SELECT state FROM job_history WHERE id = %s", [job_id]).fetchone()
    assert row == ("canceled",)
    assert enqueue(dsn, sql) == job_id


@pytest.mark.parametrize(
    ("call", "named"),
    [
        ("brooq_enqueue('Bad Topic')", "job_topic_check"),
        ("brooq_enqueue('t.ok', queue => 'Q!')", "job_queue_check"),
        ("brooq_enqueue('t.ok', priority => 70000)", "priority must be between"),
        ("brooq_enqueue('t.ok', tags => ARRAY['no spaces'])", "job_tags_check"),
        ("brooq_enqueue(NULL)", "topic is required"),
        ("brooq_enqueue('t.ok', '{not json')", "invalid input syntax for type json"),
        (
            "brooq_enqueue('t.ok', ordering_key => 'k', held => true)",
            "held cannot be combined with ordering_key",
        ),
    ],
)
def test_a_bad_value_is_refused_by_name_and_writes_nothing(
    dsn: str, db: psycopg.Connection[Any], call: str, named: str
) -> None:
    done = psql(dsn, f"SELECT {call}")
    assert done.returncode != 0
    assert named in done.stderr
    assert count(db) == 0


def test_in_the_callers_transaction_a_rollback_leaves_no_job(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    done = psql(dsn, "BEGIN; SELECT brooq_enqueue('t.ok'); ROLLBACK;")
    assert done.returncode == 0, done.stderr
    assert count(db) == 0


def test_jobs_enqueued_from_psql_with_an_ordering_key_run_in_order(
    dsn: str, db: psycopg.Connection[Any], queue: brooq.Queue, start_master: StartMaster
) -> None:
    calls = "; ".join(
        f"""SELECT brooq_enqueue('t.ordered', '{{"n": {n}}}', ordering_key => 'cus_A')"""
        for n in range(3)
    )
    done = psql(dsn, calls + "; SELECT brooq_enqueue('t.ok', held => true)")
    assert done.returncode == 0, done.stderr
    *ordered, held = [uuid.UUID(line) for line in done.stdout.split()]
    states = dict(db.execute("SELECT id, state FROM job").fetchall())
    assert [states[i] for i in ordered] == ["pending", "waiting", "waiting"]
    assert states[held] == "on_hold"
    start_master(workers=2)
    wait_for(
        lambda: all((r := queue.get(i)) is not None and r.state == "done" for i in ordered),
        what="the key's jobs done",
    )
    starts = db.execute("SELECT job_id FROM execution WHERE note = 'start' ORDER BY at").fetchall()
    assert [row[0] for row in starts] == ordered
    record = queue.get(held)
    assert record is not None and record.state == "on_hold"
