"""What a running job says about itself, through a real brooq-master: its progress
(claim.progress, carried by the master's progress tick and written with the outcome) and
its kept logs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

import brooq
from tests.cliproc import run_brooq
from tests.harness import MasterProcess, StartMaster, wait_for
from tests.process.test_ops_slow_clients import ops_addr
from tests.process.test_status_page import get

APP = "brooq_observeapp:queue"


@pytest.mark.parametrize("topic", ["o.progress", "o.progress_async"])
def test_progress_reaches_the_row_while_the_job_runs(
    start_master: StartMaster,
    queue: brooq.Queue,
    db: psycopg.Connection[Any],
    tmp_path: Path,
    topic: str,
) -> None:
    release = tmp_path / "release"
    job_id, _ = queue.enqueue(brooq.Job(topic, {"release": str(release)}))
    start_master(workers=1, app=APP)
    expected = (0.4, "resizing 3 of 8") if topic == "o.progress" else (0.75, "uploading")

    def reported() -> bool:
        record = queue.get(job_id)
        assert record is not None
        return (record.progress, record.progress_message) == expected

    wait_for(reported, what="the progress in queue.get")
    record = queue.get(job_id)
    assert record is not None and record.state == "processing"
    (flying,) = queue.in_flight()
    assert (flying.id, flying.progress, flying.progress_message) == (job_id, *expected)
    assert flying.to_dict()["progress"] == expected[0]
    release.touch()
    wait_for(lambda: (r := queue.get(job_id)) is not None and r.state == "done", what="done")


# A lease of 30 s: the renewal runs every 10 s, so a report seen within a second came by
# the progress tick, not by a renewal.
LONG_LEASE = {"QUEUE_LEASE": "30s"}
SEEN_WITHIN = 1.0  # seconds: how long a test polls for a report to reach the row


def _row(db: psycopg.Connection[Any], job_id: uuid.UUID) -> tuple[Any, ...]:
    row = db.execute(
        "SELECT state, attempts, progress, progress_message FROM job_all WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None
    return tuple(row)


@pytest.mark.parametrize("topic", ["o.steps", "o.steps_async"])
def test_progress_is_current_seen_within_a_second_and_frozen_with_done(
    start_master: StartMaster,
    queue: brooq.Queue,
    db: psycopg.Connection[Any],
    dsn: str,
    tmp_path: Path,
    topic: str,
) -> None:
    job_id, _ = queue.enqueue(brooq.Job(topic, {"dir": str(tmp_path)}))
    m = start_master(workers=1, app=APP, env=LONG_LEASE)
    wait_for(lambda: _row(db, job_id)[:2] == ("processing", 1), what="the first attempt")
    assert _row(db, job_id)[2:] == (None, None)  # nothing reported yet
    (tmp_path / "go1").touch()
    wait_for(
        lambda: _row(db, job_id)[2:] == (0.25, "reading"),
        timeout=SEEN_WITHIN,
        what="the first report within a second",
    )
    (tmp_path / "next").touch()
    wait_for(
        lambda: _row(db, job_id)[2:] == (0.6, "second step"),
        timeout=SEEN_WITHIN,
        what="the second report within a second",
    )
    # What the operator sees: brooq jobs show (text and --json), the page's in-flight list.
    shown = _brooq(dsn, "jobs", "show", str(job_id))
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"progress:\s+60% second step", shown.stdout), shown.stdout
    as_json = json.loads(_brooq(dsn, "jobs", "show", str(job_id), "--json").stdout)
    assert (as_json["progress"], as_json["progress_message"]) == (0.6, "second step")
    _, body = _page(m, "/in-flight")
    assert b"60% second step" in body
    # The handler reports 1.0 and returns at once: the report rides with its done, long
    # before any renewal could carry it.
    (tmp_path / "release").touch()
    wait_for(lambda: _row(db, job_id)[0] == "done", what="done")
    assert _row(db, job_id) == ("done", 1, 1.0, "finished")
    # A report after the outcome (a thread the handler left) is never written.
    (tmp_path / "late").touch()
    wait_for((tmp_path / "late_sent").exists, what="the late report sent")
    deadline = time.monotonic() + SEEN_WITHIN  # four progress ticks
    while time.monotonic() < deadline:
        assert _row(db, job_id) == ("done", 1, 1.0, "finished")
        time.sleep(0.05)
    # brooq jobs show prints a progress line only while the job runs; --json has it.
    as_json = json.loads(_brooq(dsn, "jobs", "show", str(job_id), "--json").stdout)
    assert (as_json["progress"], as_json["progress_message"]) == (1.0, "finished")


@pytest.mark.parametrize("topic", ["o.steps", "o.steps_async"])
def test_a_retry_starts_with_no_progress_and_a_failure_keeps_its_last(
    start_master: StartMaster,
    queue: brooq.Queue,
    db: psycopg.Connection[Any],
    tmp_path: Path,
    topic: str,
) -> None:
    job_id, _ = queue.enqueue(brooq.Job(topic, {"dir": str(tmp_path), "fail_first": True}))
    start_master(workers=1, app=APP, env=LONG_LEASE)
    wait_for(
        lambda: _row(db, job_id) == ("processing", 1, 0.4, "first try"),
        what="the first attempt's report",
    )
    # Hold the second attempt at its start: the failure's row, then the retry's, are seen.
    (tmp_path / "fail").touch()
    wait_for(lambda: _row(db, job_id)[1] == 2, what="the second attempt claimed")
    assert _row(db, job_id) == ("processing", 2, None, None)  # reset by the claim
    errors = db.execute("SELECT errors FROM job_all WHERE id = %s", (job_id,)).fetchone()
    assert errors is not None and "first try fails" in json.dumps(errors[0])
    (tmp_path / "go2").touch()
    wait_for(
        lambda: _row(db, job_id)[2:] == (0.25, "reading"),
        timeout=SEEN_WITHIN,
        what="the second attempt's report within a second",
    )
    (tmp_path / "next").touch()
    (tmp_path / "release").touch()
    wait_for(lambda: _row(db, job_id)[0] == "done", what="done")
    assert _row(db, job_id) == ("done", 2, 1.0, "finished")


def _page(m: MasterProcess, target: str) -> tuple[int, bytes]:
    status, head, body = get(ops_addr(m), target)
    assert status == 200, head
    return status, body


def _state(queue: brooq.Queue, job_id: Any) -> str | None:
    record = queue.get(job_id)
    return None if record is None else record.state


def _brooq(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_brooq(["--database", dsn, *args], env=dict(os.environ), cwd=Path.cwd())


def test_a_failed_jobs_log_lines_are_kept_per_attempt(
    start_master: StartMaster, queue: brooq.Queue, dsn: str
) -> None:
    failing, _ = queue.enqueue(brooq.Job("o.logs", {"card": "visa-4242"}))
    fetched, _ = queue.enqueue(brooq.Job("o.logs_async", {"url": "https://example.org/a"}))
    chatty, _ = queue.enqueue(brooq.Job("o.logs_many", {}))
    plain, _ = queue.enqueue(brooq.Job("o.plain", {}))
    start_master(workers=2, app=APP)
    for job_id, state in ((failing, "dead"), (fetched, "done"), (chatty, "done"), (plain, "done")):
        wait_for(lambda j=job_id, s=state: _state(queue, j) == s, what=f"{job_id} {state}")

    kept = queue.logs(failing)
    assert [entry.attempt for entry in kept] == [1, 2]
    for entry in kept:
        lines = entry.text.splitlines()
        assert len(lines) == 2, lines
        assert re.match(r"time=\S+ level=info logger=observeapp pid=\d+ ", lines[0]), lines
        assert lines[0].endswith(f"charging card visa-4242, attempt {entry.attempt}")
        assert lines[1].endswith("the gateway answered 502") and "level=warning" in lines[1]
    (entry,) = queue.logs(fetched)
    assert entry.attempt == 1
    assert [line.split(" ", 4)[-1] for line in entry.text.splitlines()] == [
        "fetching https://example.org/a",
        "stored 1234 bytes",
    ]
    assert queue.logs(plain) == []  # a handler without keep_logs keeps nothing

    # 200 lines into 2,048 bytes: the oldest dropped, and the text says so.
    (entry,) = queue.logs(chatty)
    lines = entry.text.splitlines()
    assert re.fullmatch(
        r"\[brooq: (\d+) earlier lines \(\d+ bytes\) dropped; an attempt keeps its last "
        r"2048 bytes of log\]",
        lines[0],
    ), lines[0]
    dropped = int(lines[0].split()[1])
    assert lines[-1].endswith("line 199 of a chatty handler")
    assert lines[1].endswith(f"line {dropped:03d} of a chatty handler")
    assert len(entry.text.encode()) - len(lines[0]) - 1 <= 2048

    # The command: the lines per attempt, and --json.
    out = _brooq(dsn, "jobs", "logs", str(failing))
    assert out.returncode == 0, out.stderr
    blocks = out.stdout.split("\n\n")
    assert len(blocks) == 2
    for attempt, block in enumerate(blocks, 1):
        head, *body = block.strip().splitlines()
        assert head.startswith(f"== attempt {attempt}, ended "), head
        assert body[0].endswith(f"charging card visa-4242, attempt {attempt}")
        assert body[1].endswith("the gateway answered 502")
    out = _brooq(dsn, "jobs", "logs", "--json", str(failing))
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert [(e["attempt"], e["text"]) for e in answer] == [(e.attempt, e.text) for e in kept]
    out = _brooq(dsn, "jobs", "logs", str(plain))
    assert out.returncode == 0 and out.stdout.startswith("(no logs kept for job "), out.stdout
    out = _brooq(dsn, "jobs", "logs", "not-an-id")
    assert out.returncode == 2 and out.stdout == "", (out.returncode, out.stdout, out.stderr)
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    out = _brooq(dsn, "jobs", "logs", str(uuid.uuid4()))
    assert out.returncode == 1 and "no job" in out.stderr, (out.returncode, out.stderr)
