"""`brooq jobs stack ID`: the live stack of a running job, asked for and
answered through PostgreSQL, with a real brooq-master running the job."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import psycopg

import brooq
from tests.cliproc import run_brooq
from tests.harness import StartMaster, wait_for


def stack_cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_brooq(
        ["--database", dsn, "jobs", "stack", *args], env=dict(os.environ), cwd=Path.cwd()
    )


def running(db: psycopg.Connection[Any], job_id: uuid.UUID) -> bool:
    row = db.execute("SELECT state FROM job_all WHERE id = %s", (job_id,)).fetchone()
    return row is not None and row[0] == "processing"


def answered(dsn: str, job_id: uuid.UUID) -> subprocess.CompletedProcess[str] | None:
    out = stack_cli(dsn, str(job_id), "--timeout", "2s")
    return out if out.returncode == 0 else None


def test_the_stack_of_a_running_sync_job_is_its_handlers_traceback(
    dsn: str, queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    m = start_master(workers=1)
    job_id, _ = queue.enqueue(brooq.Job("t.ok", {"sleep": 20}))
    wait_for(lambda: running(db, job_id), what="running")
    out = wait_for(lambda: answered(dsn, job_id), what="an answer")
    lines = out.stdout.splitlines()
    assert lines[0] == "Traceback (most recent call last):", out.stdout
    assert "brooq_testapp.py" in lines[1], out.stdout  # from the application's frames on
    assert "in ok" in out.stdout and "time.sleep(float(claim.payload" in out.stdout
    assert "brooq/worker/" not in out.stdout
    assert "worker " in out.stderr and str(job_id) in out.stderr
    assert f"event=stack_requested job={job_id}" in m.log()
    # Nothing is left behind in the request table.
    assert db.execute("SELECT count(*) FROM brooq_stack_request").fetchone() == (0,)
    assert queue.cancel(job_id)


def test_the_stack_of_an_async_job_is_its_await_chain(
    dsn: str, queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    start_master(workers=1, app="brooq_asyncapp:queue")
    others = [queue.enqueue(brooq.Job("a.sleep", {"s": 20}))[0] for _ in range(3)]
    job_id = others[1]
    wait_for(lambda: all(running(db, j) for j in others), what="running")
    out = wait_for(lambda: answered(dsn, job_id), what="an answer")
    assert out.stdout.startswith("Traceback (most recent call last):\n"), out.stdout
    assert "in a_sleep" in out.stdout and "await asyncio.sleep" in out.stdout
    assert "brooq/worker/" not in out.stdout
    for j in others:
        queue.cancel(j)


def test_a_job_that_is_not_running_exits_1_saying_so(
    dsn: str, queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    job_id, _ = queue.enqueue(brooq.Job("t.ok"))
    out = stack_cli(dsn, str(job_id))
    assert out.returncode == 1
    assert out.stderr.strip() == f"error: job {job_id} is not running (state: pending)"
    unknown = uuid.uuid4()
    out = stack_cli(dsn, str(unknown))
    assert out.returncode == 1 and f"no job with id {unknown}" in out.stderr
    out = stack_cli(dsn, "not-a-uuid")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    out = stack_cli(dsn, str(job_id), "--timeout", "0s")
    assert out.returncode == 2 and "--timeout" in out.stderr


def test_no_master_answering_is_exit_1_and_leaves_no_request(
    dsn: str, queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    job_id, _ = queue.enqueue(brooq.Job("t.ok"))
    db.execute(
        "UPDATE job SET state = 'processing', locked_by = 'elsewhere:1:x', "
        "locked_until = now() + interval '1 minute', attempts = 1 WHERE id = %s",
        (job_id,),
    )
    db.commit()
    out = stack_cli(dsn, str(job_id), "--timeout", "500ms")
    assert out.returncode == 1
    assert f"no master answered for job {job_id} within 0.5s" in out.stderr
    assert db.execute("SELECT count(*) FROM brooq_stack_request").fetchone() == (0,)
