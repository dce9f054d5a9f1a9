"""The error history (job.errors) written by a real brooq-master: each entry names the
child that failed the attempt, or the dead child.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import uuid
from datetime import datetime
from typing import Any

import psycopg

import brooq
from tests.db.test_cli import as_json, ok
from tests.harness import StartMaster, wait_for

HOST = socket.gethostname()


def attempt_pids(db: psycopg.Connection[Any], job_id: uuid.UUID) -> dict[int, int]:
    """attempt -> pid of the child that ran it (the test app records each execution)."""
    rows = db.execute(
        "SELECT attempt, pid FROM execution WHERE job_id = %s AND note IN ('', 'start')",
        (job_id,),
    ).fetchall()
    return {int(a): int(p) for a, p in rows}


def is_identity_of(worker: str, pid: int) -> bool:
    """A child's identity is host:pid:tag (brooq.worker.state.identity_for)."""
    host, wpid, tag = worker.split(":")
    return (host, int(wpid)) == (HOST, pid) and len(tag) == 6


# -- the error history -------------------------------------------------------------------------


def test_three_failures_leave_three_entries_with_the_childs_identity(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster, dsn: str
) -> None:
    job_id, _ = queue.enqueue(brooq.Job("t.fail"))  # max_attempts 3, backoff 50-100 ms
    start_master(workers=2)
    record = queue.wait(job_id, timeout=30)
    assert (record.state, record.attempts) == ("dead", 3)
    pids = attempt_pids(db, job_id)
    assert sorted(pids) == [1, 2, 3]
    assert [e["attempt"] for e in record.errors] == [1, 2, 3]  # oldest first
    for entry in record.errors:
        assert set(entry) == {
            "attempt",
            "at",
            "started_at",
            "worker",
            "error",
            "kind",
            "traceback",
        }
        assert entry["kind"] == "raised" and entry["traceback"].endswith(entry["error"])
        n = entry["attempt"]
        assert entry["error"] == f"ValueError: bad input on attempt {n}"
        assert is_identity_of(entry["worker"], pids[n]), (entry, pids)
    times = [datetime.fromisoformat(e["at"]) for e in record.errors]
    assert times == sorted(times) and len(set(times)) == 3
    assert queue.get(job_id) == record
    assert json.loads(json.dumps(record.to_dict()))["errors"] == record.errors

    # brooq jobs show: one line per entry; --json carries the history whole
    text = ok(dsn, "jobs", "show", str(job_id))
    lines = text.splitlines()
    at = lines.index("errors (3, oldest first):")
    for i, entry in enumerate(record.errors, start=1):
        line = lines[at + i]
        assert line.startswith(f"  attempt {i}  ") and entry["worker"] in line
        assert line.endswith(f"ValueError: bad input on attempt {i}")
    assert lines[at + 4] == "last error:      ValueError: bad input on attempt 3"
    shown = as_json(dsn, "jobs", "show", str(job_id))
    assert shown["errors"] == record.errors and shown["result"] is None


def test_a_killed_childs_job_gets_one_entry_with_the_dead_childs_identity(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    start_master(workers=1)
    job_id, _ = queue.enqueue(brooq.Job("t.slow", {"seconds": 2}))
    pid = wait_for(lambda: attempt_pids(db, job_id).get(1), what="the handler started")
    os.kill(pid, signal.SIGKILL)
    record = queue.wait(job_id, timeout=30)  # settled by the master, then run again
    assert (record.state, record.attempts) == ("done", 2)
    assert len(record.errors) == 1
    entry = record.errors[0]
    assert (entry["attempt"], entry["error"]) == (1, "worker died: SIGKILL")
    assert (entry["kind"], entry["traceback"]) == ("worker_died", None)  # no stack was read
    assert is_identity_of(entry["worker"], pid)
    assert attempt_pids(db, job_id)[2] != pid


# -- tracebacks kept --------------------------------------------------------------------------


def frames(traceback: str) -> list[str]:
    """The function names of a kept traceback's frames, outermost first."""
    return [ln.rsplit(", in ", 1)[1] for ln in traceback.splitlines() if ln.startswith('  File "')]


def test_a_raised_exception_keeps_its_traceback_from_the_handler_down(
    queue: brooq.Queue, start_master: StartMaster, dsn: str
) -> None:
    job_id, _ = queue.enqueue(brooq.Job("t.divide"))  # max_attempts 2
    start_master(workers=1)
    record = queue.wait(job_id, timeout=30)
    assert (record.state, record.last_error) == ("dead", "ZeroDivisionError: division by zero")
    shown = as_json(dsn, "jobs", "show", str(job_id))
    assert shown["errors"] == record.errors  # the name users read: errors, with tracebacks
    for n, entry in enumerate(shown["errors"], start=1):
        assert (entry["attempt"], entry["kind"]) == (n, "raised")
        assert datetime.fromisoformat(entry["started_at"]) <= datetime.fromisoformat(entry["at"])
        tb = entry["traceback"]
        assert tb.startswith("Traceback (most recent call last):\n")
        # the handler and the user's functions it called, innermost last; brooq's loop
        # around the handler is left out
        assert frames(tb) == ["divide", "price_per_item", "share"], tb
        assert "return total / count" in tb and "brooq/worker" not in tb
        assert tb.endswith("ZeroDivisionError: division by zero")
    # brooq jobs show: the newest traceback under its own heading, whole (it is short)
    text = ok(dsn, "jobs", "show", str(job_id))
    assert "traceback (attempt 2, raised):" in text
    assert "in share" in text and "ZeroDivisionError: division by zero" in text


def test_a_watchdog_kill_keeps_the_stack_with_the_handlers_frame(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster, dsn: str
) -> None:
    """t.spin loops forever, swallowing brooq's interruptions: the watchdog reads its stack
    and kills its child; the entry keeps that stack, the handler's frame shown, and
    `brooq jobs show` shows it (before, the screen kept the end of last_error's stack:
    brooq's and the interpreter's frames)."""
    job_id, _ = queue.enqueue(brooq.Job("t.spin"))  # max_execution_timeout 1.5 s
    m = start_master(workers=1)
    record = wait_for(
        lambda: (r := queue.get(job_id)) is not None and r.errors and r,
        timeout=15,
        what="the kill settled",
    )
    entry = record.errors[0]
    assert entry["kind"] == "killed"
    assert entry["error"].startswith("killed: max_execution_timeout 1.5s exceeded (ran ")
    assert "\n" not in entry["error"]
    tb = entry["traceback"]
    assert tb.startswith("Stack when killed (most recent call last):\n"), tb
    assert frames(tb) == ["spin"], tb  # from the handler's frame; brooq's loop left out
    assert "brooq_testapp.py" in tb
    text = ok(dsn, "jobs", "show", str(job_id))
    lines = text.splitlines()
    at = lines.index("traceback (attempt 1, killed):")
    assert lines[at + 1 : at + 3] == ["  " + ln for ln in tb.splitlines()[:2]]
    m.signal(signal.SIGTERM)


def test_a_very_deep_traceback_is_kept_bounded(
    queue: brooq.Queue, start_master: StartMaster, dsn: str
) -> None:
    job_id, _ = queue.enqueue(brooq.Job("t.recurse"))
    start_master(workers=1)
    record = queue.wait(job_id, timeout=30)
    assert record.state == "dead"
    [entry] = as_json(dsn, "jobs", "show", str(job_id))["errors"]
    tb = entry["traceback"]
    assert len(tb) <= 8192
    assert tb.endswith("RecursionError: maximum recursion depth exceeded")
    assert frames(tb)[0] == "recurse"  # the handler, then the innermost calls
    assert frames(tb)[-1] in ("ping", "pong") and "frames not kept" in tb


def test_an_async_childs_raise_and_kill_keep_the_handlers_frames(
    queue: brooq.Queue, start_master: StartMaster
) -> None:
    """An async child: a coroutine's raise keeps its frames from the application's first
    (the app's middleware, then the handler); a task swallowing its cancellation is
    killed by the hard limit and the entry keeps its await chain."""
    failed, _ = queue.enqueue(brooq.Job("a.fail"))
    swallowed, _ = queue.enqueue(brooq.Job("a.swallow"))  # max_execution_timeout 2 s
    start_master(workers=1, app="brooq_asyncapp:queue", args=("--concurrency", "4"))
    raised = queue.wait(failed, timeout=30)
    [entry] = raised.errors
    assert (entry["kind"], entry["error"]) == ("raised", "ValueError: async bad input")
    tb = entry["traceback"]
    assert frames(tb)[-1] == "a_fail" and "brooq/worker" not in tb, tb
    killed = queue.wait(swallowed, timeout=30)
    [entry] = killed.errors
    assert entry["kind"] == "killed" and "\n" not in entry["error"]
    assert "Task await chain (most recent call last):" in entry["traceback"], entry
    assert "in a_swallow" in entry["traceback"] and "brooq/worker" not in entry["traceback"]
