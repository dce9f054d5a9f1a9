"""Queues, pause and global_limit under real brooq-master processes (two masters where
the point is the fleet). Handlers of tests/apps/brooq_queuesapp.py stamp what they ran."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import brooq
from tests.harness import APPS, MasterProcess, wait_for

StartMaster = Callable[..., MasterProcess]
APP = "brooq_queuesapp:queue"


@pytest.fixture
def stamp_dir(tmp_path: Path) -> Path:
    path = tmp_path / "stamps"
    path.mkdir()
    return path


def stamps(directory: Path) -> list[tuple[str, uuid.UUID, int, int, int]]:
    """Every (topic, job id, start ns, end ns, master pid) the handlers wrote."""
    found = []
    for path in directory.glob("*.log"):
        for line in path.read_text(encoding="ascii").splitlines():
            topic, job_id, start, end, _, master = line.split()
            found.append((topic, uuid.UUID(job_id), int(start), int(end), int(master)))
    return found


def max_overlap(spans: list[tuple[int, int]]) -> int:
    """The most spans open at one instant (an end at the same instant as a start first)."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def count(db: psycopg.Connection[Any], where: str, *args: Any) -> int:
    row = db.execute(f"SELECT count(*) FROM job_all WHERE {where}", args).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return int(row[0])


def test_a_master_runs_only_the_queues_it_works(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster, stamp_dir: Path
) -> None:
    """--queues bulk=1: the bulk jobs run, the default ones stay; the row's queue decides,
    whatever queue the topic's handler declares."""
    queue.enqueue_many([brooq.Job("q.bulk", queue="bulk") for _ in range(20)])
    queue.enqueue_many([brooq.Job("q.default") for _ in range(20)])
    moved, _ = queue.enqueue(brooq.Job("q.default", queue="bulk"))
    m = start_master(
        app=APP, workers=2, args=("--queues", "bulk=1"), env={"BROOQ_STAMPS": str(stamp_dir)}
    )
    wait_for(lambda: count(db, "queue = 'bulk' AND state = 'done'") == 21, what="bulk drained")
    m.signal(15)
    assert m.wait() == 0
    assert count(db, "queue = 'default' AND state = 'pending'") == 20
    ran = stamps(stamp_dir)
    assert len(ran) == 21 and moved in {job_id for _, job_id, *_ in ran}
    assert "event=queues queues=bulk=1" in m.log()
    assert "event=queue_not_worked topic=q.default queue=default" in m.log()


def test_pause_stops_claims_lets_running_jobs_finish_and_resume_restarts(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster, stamp_dir: Path
) -> None:
    queue.pause("bulk")  # before any bulk job exists
    m = start_master(app=APP, workers=2, env={"BROOQ_STAMPS": str(stamp_dir)})
    m.wait_ready(2)
    running, _ = queue.enqueue(brooq.Job("q.default", {"sleep": 1.5}))
    wait_for(lambda: count(db, "id = %s AND state = 'processing'", running), what="running")
    queue.pause("default")  # while its job runs
    time.sleep(0.5)  # a pause holds within poll_interval (200 ms here): let it pass
    held = [queue.enqueue(brooq.Job("q.bulk"))[0] for _ in range(5)]  # producers go on
    later, _ = queue.enqueue(brooq.Job("q.default"))
    wait_for(lambda: count(db, "id = %s AND state = 'done'", running), what="running job done")
    # Several poll intervals (200 ms here) and NOTIFYs later, nothing paused was claimed.
    wait_for(lambda: len(stamps(stamp_dir)) == 1, what="the running job's stamp")
    queue.enqueue(brooq.Job("q.bulk"))  # another NOTIFY: the children look, and leave it
    with pytest.raises(AssertionError):
        wait_for(lambda: count(db, "state <> 'pending' AND id <> %s", running), timeout=1.5)
    assert {q.name: q.paused for q in queue.queues()} == {"bulk": True, "default": True}
    queue.resume("bulk")
    queue.resume("default")
    wait_for(lambda: count(db, "state = 'done'") == 8, what="everything done after resume")
    assert {job_id for _, job_id, *_ in stamps(stamp_dir)} >= {*held, later}
    m.signal(15)
    assert m.wait() == 0


def test_global_limit_holds_across_two_masters_and_keeps_the_slots_busy(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster, stamp_dir: Path
) -> None:
    """Two masters of 8 children each run one topic with global_limit=4 and 150 ms
    handlers, each from a queue of its own (so both surely run some: a child that frees a
    slot takes the next job in the same statement, so one master could otherwise keep all
    four slots). The cap is fleet-wide: never more than 4 handlers at once over both
    masters (from the handlers' own start/end stamps; a cap per master would show 8), and
    the slots stay busy: a freed slot takes the next job at once, not at the next poll."""
    per_queue, cap, job_time = 60, 4, 0.15
    jobs = 2 * per_queue
    queue.enqueue_many(
        [brooq.Job("api.limited", queue=q) for _ in range(per_queue) for q in ("east", "west")]
    )
    # A long poll, so that a slot refilled by polling would show (see the end).
    env = {
        "BROOQ_STAMPS": str(stamp_dir),
        "BROOQ_LIMITED_SLEEP": str(job_time),
        "QUEUE_POLL_INTERVAL": "2s",
    }
    masters = [
        start_master(app=APP, workers=8, env=env, args=("--queues", q)) for q in ("east", "west")
    ]
    wait_for(lambda: count(db, "state = 'done'") == jobs, timeout=60, what="all done")
    for m in masters:
        m.signal(15)
    assert [m.wait() for m in masters] == [0, 0]
    ran = stamps(stamp_dir)
    assert len(ran) == jobs
    by_master = {m.pid: sum(1 for *_, pid in ran if pid == m.pid) for m in masters}
    assert list(by_master.values()) == [per_queue, per_queue], by_master
    overlap = max_overlap([(start, end) for _, _, start, end, _ in ran])
    assert overlap <= cap, overlap
    # Busy slots, told apart from slow ones without timing the machine: a freed slot is
    # taken by the next job at once (the finishing child claims in its outcome's
    # statement), not at the next poll (2 s here). Over the middle of the run, the median
    # wait from a handler's end to the next start is far below a poll.
    starts = sorted(start for _, _, start, _, _ in ran)
    ends = sorted(end for _, _, _, end, _ in ran)
    refills = [
        (next(s for s in starts if s >= end) - end) / 1e9 for end in ends[jobs // 10 : jobs // 2]
    ]
    median = sorted(refills)[len(refills) // 2]
    assert median < 0.5, f"a freed slot waited {median:.3f} s (median) for its next job"


def test_bad_queues_are_refused_at_start_with_every_problem(dsn: str) -> None:
    env = {"DATABASE_URL": dsn, "PYTHONPATH": f"{APPS}:{APPS.parent.parent}"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "brooq.master_cli",
            "--app",
            APP,
            "--queues",
            "default=0,bulk,bulk=2,Bad",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=APPS,
    )
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    for problem in ("'default' must be at least 1, got 0", "'bulk' is named twice", "'Bad'"):
        assert problem in out.stderr, out.stderr
