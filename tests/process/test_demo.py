"""`make run`'s demo: migrate, master, jobs fed and finished, a durable job resumed after
its child was killed, clean drain."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_and_drains(empty_dsn: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_")}
    env.update(DATABASE_URL=empty_dsn, QUEUE_OPS_ADDR="127.0.0.1:0")
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "examples/run_demo.py", "--workers", "2", "--seconds", "4"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )
    took = time.monotonic() - started
    assert out.returncode == 0, out.stdout + out.stderr
    assert "applied migration 0001_job" in out.stdout
    assert_video_resumed(out.stdout, empty_dsn)
    assert "brooq-master exited with status 0" in out.stdout
    # It says where the status page is and how to watch with brooq top.
    page = re.search(r"\[demo\] status page: (http://127\.0\.0\.1:\d+/)", out.stdout)
    assert page is not None, out.stdout
    assert f"DATABASE_URL='{empty_dsn}' .venv/bin/brooq top" in out.stdout
    with psycopg.connect(empty_dsn) as conn:
        done: dict[str, int] = dict(
            conn.execute(
                "SELECT topic, count(*) FROM job_all WHERE state = 'done' GROUP BY topic"
            ).fetchall()
        )
    # CPU-heavy renders ran and chained their notifications; flaky jobs got through.
    assert done.get("demo.render", 0) > 0
    # The async fetches ran in the async child beside them, many at once.
    assert done.get("demo.fetch", 0) >= 40
    with psycopg.connect(empty_dsn) as conn:
        chained = conn.execute(
            # Chained in the render's done transaction: one per done render, whether the
            # drain at the end left time to run it or not.
            "SELECT count(*) FROM job_all WHERE topic = 'demo.notify' AND payload ? 'rendered'"
        ).fetchone()
    assert chained is not None and chained[0] == done["demo.render"]
    assert done.get("demo.flaky", 0) > 0
    with psycopg.connect(empty_dsn) as conn:
        queues: dict[str, str] = dict(
            conn.execute("SELECT topic, min(queue) FROM job_all GROUP BY topic").fetchall()
        )
        urgent = conn.execute("SELECT count(*) FROM job_all WHERE priority = 10").fetchone()
    assert queues["demo.render"] == "bulk" and queues["demo.flaky"] == "default"
    assert urgent is not None and urgent[0] > 0
    assert "default:" in out.stdout
    assert_reports_count_in_brooqs_words(out.stdout)
    # The heartbeat schedule (every 3 s): new, so its first job comes with the first tick
    # after the master's start (or at once if the last one is under 2 s old); the demo
    # runs 4 s or until the video's story is told, so one job per tick of its run.
    with psycopg.connect(empty_dsn) as conn:
        beats = conn.execute(
            "SELECT count(*) FROM job_all WHERE idempotency_key LIKE 'periodic:heartbeat:%%' "
            "AND payload ? 'heartbeat'"
        ).fetchone()
    assert beats is not None and 1 <= beats[0] <= int(took / 3) + 2
    assert "[demo] periodic: a heartbeat job every 3 s" in out.stdout
    # Quotes: a typed payload stored as JSON, a result read back through queue.wait.
    with psycopg.connect(empty_dsn) as conn:
        quotes = conn.execute(
            "SELECT payload, result FROM job_all WHERE topic = 'demo.quote' AND state = 'done' "
            "ORDER BY created_at LIMIT 1"
        ).fetchone()
    assert quotes == (
        {"sku": "sku-0", "quantity": 1, "unit_price": 9.99},
        {"sku": "sku-0", "total": 9.99},
    )
    # The round's report waits for that round's quote (on a loaded machine an early one may
    # still be queued behind the renders; the demo says so and waits for the next).
    said = re.findall(
        r"\[demo\] quote done: result=\{'sku': 'sku-(\d+)', 'total': ([\d.]+)\} \(queue\.wait\)",
        out.stdout,
    )
    assert said, out.stdout
    assert all(float(total) == round((int(n) + 1) * 9.99, 2) for n, total in said), said
    # Each round's report waited for its four renders: released exactly when all were done.
    import brooq

    reader = brooq.Queue(empty_dsn)
    try:
        with psycopg.connect(empty_dsn) as conn:
            reports = conn.execute("SELECT id, state FROM job_all WHERE topic = 'demo.report'")
            reports_by_id: dict[Any, str] = dict(reports.fetchall())
        assert len(reports_by_id) >= 1
        for job_id, state in reports_by_id.items():
            upstream = reader.upstream(job_id)
            assert [u.topic for u in upstream] == ["demo.render"] * 4
            assert (state == "waiting") == any(u.state != "done" for u in upstream), state
    finally:
        reader.close()


def test_ctrl_c_in_a_pause_stops_feeding_and_leaves_no_queue_paused(empty_dsn: str) -> None:
    """Ctrl-C (SIGINT to the terminal's process group) while the bulk queue is paused:
    no round is fed after it, the master drains, the bulk queue is resumed for the next
    run, and the commands the demo printed run as printed."""
    import signal
    import time

    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_")}
    env.update(DATABASE_URL=empty_dsn, QUEUE_OPS_ADDR="127.0.0.1:0", PYTHONUNBUFFERED="1")
    demo = subprocess.Popen(
        [sys.executable, "examples/run_demo.py", "--workers", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    assert demo.stdout is not None
    lines: list[str] = []
    try:
        for line in demo.stdout:
            lines.append(line)
            if "paused queue bulk" in line:
                break
        with psycopg.connect(empty_dsn) as conn:
            row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        interrupted_at = row[0]
        os.killpg(demo.pid, signal.SIGINT)
        time.sleep(0.01)
        lines += demo.stdout.readlines()
        assert demo.wait(60) == 0, "".join(lines)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
    out = "".join(lines)
    assert "[demo] resumed queue bulk" in out and "exited with status 0" in out, out
    with psycopg.connect(empty_dsn) as conn:
        paused = conn.execute("SELECT paused FROM brooq_queue WHERE name = 'bulk'").fetchone()
        fed_after = conn.execute(
            # demo.notify: the heartbeat's ticks and the renders' chained jobs go on.
            "SELECT count(*) FROM job_all WHERE created_at > %s AND topic <> 'demo.notify'",
            (interrupted_at,),
        ).fetchone()
    assert paused == (False,)
    assert fed_after == (0,)
    printed = re.search(r"list it with: (.+)$", out, re.MULTILINE)
    assert printed is not None, out
    listed = subprocess.run(
        printed.group(1), shell=True, capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert listed.returncode == 0 and "heartbeat" in listed.stdout, listed.stderr


def assert_video_resumed(stdout: str, dsn: str) -> None:
    """The demo kills the child running the durable video once its second step is
    recorded: the job ends done in its second attempt, the steps recorded before the kill
    ran once (in the killed child) and were replayed, the others ran in the new child."""
    printed = stdout
    found = re.search(r"\[demo\] video: job ([0-9a-f-]{36}), 5 steps", stdout)
    assert found is not None, printed
    job_id = found.group(1)
    killed = re.search(
        r"step (\d) of 5 recorded; killing the worker running it "
        r"\(child pid (\d+), SIGKILL\)",
        stdout,
    )
    assert killed is not None, printed
    assert killed.group(1) == "2", printed
    killed_pid = int(killed.group(2))
    with psycopg.connect(dsn) as conn:
        job = conn.execute(
            "SELECT state, attempts, errors FROM job_all WHERE id = %s", (job_id,)
        ).fetchone()
        steps = conn.execute(
            "SELECT name, result FROM brooq_job_step WHERE job_id = %s ORDER BY created_at",
            (job_id,),
        ).fetchall()
    assert job is not None
    state, attempts, errors = job
    assert (state, attempts) == ("done", 2), printed
    assert [e["error"] for e in errors] == ["worker died: SIGKILL"]
    names = ["fetch", "frames", "encode", "thumbnail", "publish"]
    assert [name for name, _ in steps] == names
    # Steps 1-2 were recorded by the killed child's attempt, 3-5 by the next, elsewhere.
    assert [r["attempt"] for _, r in steps] == [1, 1, 2, 2, 2], steps
    assert [r["pid"] == killed_pid for _, r in steps] == [True, True, False, False, False]
    # Each step's function ran once: the steps recorded before the kill were not run
    # again, only replayed (the third was killed before it finished).
    for number, name in enumerate(names, 1):
        ran = stdout.count(f"[video] step {number} of 5 ({name}) ran in child pid")
        assert ran == 1, (name, printed)
    for number, name in enumerate(names[:2], 1):
        assert f"[video] step {number} of 5 ({name}) replayed from its record" in stdout
    assert (
        "[demo] video: done after 2 attempts. Resumed: steps 1-2 replayed from their records, "
        "3-5 ran" in stdout
    ), printed


def assert_reports_count_in_brooqs_words(stdout: str) -> None:
    """Each round's report line: per queue, its non-zero counts in brooq's words and
    order (docs/explanation/guarantees.md, "Counts"), as `brooq queues` shows them."""
    from brooq.operator.records import COUNTS

    reports = re.findall(r"^\[demo\] done=\d+  (.+)$", stdout, re.M)
    assert reports, stdout
    for report in reports:
        for part in report.split(" | "):
            name, _, counts = part.partition(": ")
            assert re.fullmatch(r"[a-z]+( \(paused\))?", name), report
            if counts == "no jobs":
                continue
            shown = [count.split(" ") for count in counts.split(", ")]
            assert all(n.isdigit() and int(n) > 0 for n, _ in shown), report
            words = [word for _, word in shown]
            assert words == [word for word in COUNTS if word in words], report
