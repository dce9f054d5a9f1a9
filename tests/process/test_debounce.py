"""Debounce and unique keys with real brooq-masters (two, of two children each): a
debounced burst runs once, with its last payload, about `debounce` after the last
enqueue; enqueues that arrive while the key's job runs make exactly one next job, which
runs after it with the last of them. The application is tests/apps/brooq_uniqueapp.py."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta
from typing import Any

import psycopg

import brooq
from tests.harness import StartMaster, wait_for

APP = "brooq_uniqueapp:queue"


def runs(db: psycopg.Connection[Any]) -> list[tuple[Any, str, datetime]]:
    """(job, what, when) of every start and end the handler wrote, in order."""
    rows = db.execute("SELECT job_id, note, at FROM execution ORDER BY at").fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def starts(db: psycopg.Connection[Any]) -> list[tuple[Any, dict[str, Any], datetime]]:
    return [
        (job, json.loads(note.removeprefix("start ")), at)
        for job, note, at in runs(db)
        if note.startswith("start ")
    ]


def state(db: psycopg.Connection[Any], job_id: Any) -> str:
    row = db.execute("SELECT state FROM job_all WHERE id = %s", (job_id,)).fetchone()
    return "" if row is None else str(row[0])


def test_a_debounced_burst_runs_once_with_its_last_payload(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    for _ in range(2):
        start_master(workers=2, app=APP)
    debounce = timedelta(seconds=1)
    ids = set()
    for n in range(8):
        job_id, _ = queue.enqueue(
            brooq.Job("u.run", {"n": n}, unique_key="doc-1", debounce=debounce)
        )
        ids.add(job_id)
        time.sleep(0.1)
    last = db.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    assert len(ids) == 1
    (job_id,) = ids
    wait_for(lambda: state(db, job_id) == "done", what="the debounced job done")
    time.sleep(1.5)  # another run would have shown by now (poll 200 ms, debounce 1 s)
    started = starts(db)
    assert [(job, payload) for job, payload, _ in started] == [(job_id, {"n": 7})]
    delay = (started[0][2] - last).total_seconds()
    assert 0.8 <= delay <= 3.0, delay  # about `debounce` after the last enqueue


def test_enqueues_while_the_keys_job_runs_make_exactly_one_next_job(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    for _ in range(2):
        start_master(workers=2, app=APP)
    debounce = timedelta(milliseconds=200)

    def job(payload: dict[str, Any]) -> brooq.Job:
        return brooq.Job("u.run", payload, unique_key="doc-2", debounce=debounce)

    first, _ = queue.enqueue(job({"n": 0, "sleep": 2}))
    wait_for(lambda: starts(db), what="the key's job started")
    nexts = {queue.enqueue(job({"n": n}))[0] for n in range(1, 6)}
    assert len(nexts) == 1 and first not in nexts
    (after,) = nexts
    wait_for(lambda: state(db, after) == "done", timeout=30, what="the next job done")
    time.sleep(1.0)  # nothing else runs
    trail = runs(db)
    assert [(job_id, note) for job_id, note, _ in trail] == [
        (first, 'start {"n": 0, "sleep": 2}'),
        (first, "end"),
        (after, 'start {"n": 5}'),
        (after, "end"),
    ]
    # the next job started after the key's job ended: never two running
    assert trail[2][2] >= trail[1][2]


def test_the_masters_reaper_pass_moves_up_a_waiting_job_with_nothing_before_it(
    db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    """A waiting job whose key has no job (as a producer's rollback can leave one, here
    written by hand, its commit's trigger off) is moved up by the reaper's pass, and runs."""
    m = start_master(workers=1, app=APP)
    with db.transaction():
        db.execute("SET LOCAL session_replication_role = replica")  # no trigger fires
        db.execute(
            "INSERT INTO job (topic, payload, unique_key, available_at, start_after) "
            "VALUES ('u.run', '{\"n\": 1}', 'doc-3', '9999-01-01+00', now())"
        )
    wait_for(lambda: [p for _, p, _ in starts(db)] == [{"n": 1}], what="the waiting job run")
    assert "event=jobs_promoted count=1" in m.log()


def test_the_admin_retry_names_the_job_holding_the_key(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster, tmp_path: Any
) -> None:
    from tests.process.test_operations import get, ops_addr

    token = "t0k3n-" + "x" * 26
    (tmp_path / "admin-token").write_text(token + "\n")
    m = start_master(workers=1, env={"QUEUE_ADMIN_TOKEN_FILE": str(tmp_path / "admin-token")})
    addr = ops_addr(m)
    old, _ = queue.enqueue(brooq.Job("nobody.handles.this", unique_key="k"))
    assert queue.cancel(old)
    new, _ = queue.enqueue(brooq.Job("nobody.handles.this", unique_key="k"))
    status, body = get(addr, f"/admin/jobs/{old}/retry", token=token, method="POST")
    answer = json.loads(body)
    assert status == 409 and answer["held_by"] == str(new) and answer["state"] == "canceled"
    assert f"its unique_key 'k' is taken by job {new} (pending)" in answer["error"]
    assert queue.cancel(new)
    status, _ = get(addr, f"/admin/jobs/{old}/retry", token=token, method="POST")
    assert status == 200 and state(db, old) == "pending"
