"""When each attempt started (job.started_at), through a real brooq-master: a sync and an
async child's claims set it (one claim statement, sent by two loops), a retry's claim
writes its own and starts with no progress, and the job's start is shown by
`brooq jobs show` (text and --json), Queue.get and the job page, with the last attempt's
progress frozen on a finished job. The claim statements' every variant and the limited
topics' functions: tests/db/test_started_at.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

import brooq
from tests.cliproc import run_brooq
from tests.harness import StartMaster, wait_for
from tests.process.test_ops_slow_clients import ops_addr
from tests.process.test_status_page import get

APP = "brooq_observeapp:queue"


def _row(db: psycopg.Connection[Any], job_id: uuid.UUID) -> dict[str, Any]:
    row = db.execute(
        "SELECT state, attempts, started_at, updated_at, progress, errors FROM job_all "
        "WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None
    names = ("state", "attempts", "started_at", "updated_at", "progress", "errors")
    return dict(zip(names, row, strict=True))


def _brooq(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_brooq(["--database", dsn, *args], env=dict(os.environ), cwd=Path.cwd())


@pytest.mark.parametrize("topic", ["o.steps", "o.steps_async"])
def test_each_attempt_has_its_start_from_a_sync_and_an_async_child(
    start_master: StartMaster,
    queue: brooq.Queue,
    db: psycopg.Connection[Any],
    dsn: str,
    tmp_path: Path,
    topic: str,
) -> None:
    job_id, _ = queue.enqueue(brooq.Job(topic, {"dir": str(tmp_path), "fail_first": True}))
    assert _row(db, job_id)["started_at"] is None  # not claimed yet
    m = start_master(workers=1, app=APP)
    wait_for(lambda: _row(db, job_id)["progress"] == 0.4, what="the first attempt running")
    first = _row(db, job_id)
    assert first["state"] == "processing" and first["started_at"] == first["updated_at"]
    (tmp_path / "fail").touch()
    wait_for(lambda: _row(db, job_id)["attempts"] == 2, what="the retry claimed")
    second = _row(db, job_id)
    assert second["state"] == "processing" and second["progress"] is None
    assert second["started_at"] == second["updated_at"] > first["started_at"]
    [entry] = second["errors"]  # the first attempt's start kept in its history entry
    assert datetime.fromisoformat(entry["started_at"]) == first["started_at"]
    for name in ("go2", "next", "release"):
        (tmp_path / name).touch()
    wait_for(lambda: _row(db, job_id)["state"] == "done", what="done")
    done = _row(db, job_id)
    assert done["started_at"] == second["started_at"] < done["updated_at"]

    record = queue.get(job_id)
    assert record is not None and record.started_at == second["started_at"]
    assert record.to_dict()["started_at"] == second["started_at"].isoformat()
    out = _brooq(dsn, "jobs", "show", "--json", str(job_id))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["started_at"] == second["started_at"].isoformat()
    out = _brooq(dsn, "jobs", "show", str(job_id))
    assert out.returncode == 0, out.stderr
    assert re.search(r"^started:\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", out.stdout, re.M), out.stdout
    # A finished job shows the last attempt's progress, frozen with its outcome.
    assert re.search(r"^progress:\s+100% finished$", out.stdout, re.M), out.stdout
    status, _head, body = get(ops_addr(m), f"/jobs/{job_id}")
    assert status == 200
    page = body.decode()
    assert "<strong>attempt 2</strong>: done<br>started " in page, page
