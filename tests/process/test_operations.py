"""Operations: metrics, the ops HTTP surface, retention, systemd, credentials, logs."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import conninfo, sql

import brooq
from brooq.supervisor import maintenance
from tests import harness
from tests.harness import StartMaster, executions, states, wait_for

ROOT = Path(__file__).resolve().parents[2]


def ops_addr(m: object) -> str:
    log = m.log  # type: ignore[attr-defined]
    found = wait_for(lambda: re.search(r"event=ops_listening addr=(\S+)", log()), what="ops")
    return found.group(1)


def get(addr: str, path: str, token: str | None = None, method: str = "GET") -> tuple[int, str]:
    request = urllib.request.Request(f"http://{addr}{path}", method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text format (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return 0.0


def _retention_logged(log: str) -> int:
    """The rows the master's log says retention deleted."""
    counts = re.findall(r"event=retention_(?:deleted|caught_up) count=(\d+)", log)
    return sum(int(n) for n in counts)


FAST_STATS = {"QUEUE_STATS_PERIOD": "200ms"}


def test_scrape_after_a_mixed_run_matches_the_table(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    queue.enqueue_many(
        [brooq.Job("t.ok") for _ in range(20)]
        + [brooq.Job("t.fail") for _ in range(3)]
        + [brooq.Job("t.cancel") for _ in range(2)]
    )
    m = start_master(workers=2, env=FAST_STATS)
    addr = ops_addr(m)
    wait_for(lambda: states(db) == {"done": 20, "dead": 3, "canceled": 2}, what="finished")
    time.sleep(0.5)  # one stats refresh
    _, text = get(addr, "/metrics")
    assert sample(text, "brooq_outcomes_total", topic="t.ok", outcome="done") == 20
    assert sample(text, "brooq_outcomes_total", topic="t.fail", outcome="failed") == 6
    assert sample(text, "brooq_outcomes_total", topic="t.fail", outcome="dead") == 3
    assert sample(text, "brooq_outcomes_total", topic="t.cancel", outcome="canceled") == 2
    assert sample(text, "brooq_claims_total", topic="t.fail") == 9
    assert sample(text, "brooq_attempt_duration_seconds_count", topic="t.ok") == 20
    assert sample(text, "brooq_attempt_cpu_seconds_count", topic="t.ok") == 20
    assert sample(text, "brooq_attempt_peak_rss_bytes_count", topic="t.ok") == 20
    assert sample(text, "brooq_jobs", topic="t.fail", state="dead") == 3
    assert sample(text, "brooq_jobs", topic="t.ok", state="ready") == 0
    assert 'state="done"' not in text  # done grows forever and is never counted
    assert sample(text, "brooq_children_configured") == 2
    assert sample(text, "brooq_children_busy") == 0
    assert sample(text, "brooq_ready_oldest_age_seconds", topic="t.ok") == 0
    # The table's upkeep: 25 jobs' claims and outcomes leave dead tuples (fewer than
    # autovacuum's threshold for this table: 100 + 2 %), which the statistics collector
    # reports within a second or so and the gauge a stats period later; the xid age is
    # at most what PostgreSQL says now (it only grows until a freeze).
    wait_for(
        lambda: sample(get(addr, "/metrics")[1], "brooq_table_dead_tuples") > 0,
        what="dead tuples counted",
    )
    row = db.execute(
        "SELECT age(relfrozenxid) FROM pg_class WHERE oid = 'job'::regclass"
    ).fetchone()
    assert row is not None
    assert 0 < sample(get(addr, "/metrics")[1], "brooq_table_xid_age") <= row[0]

    # Counters survive a child kill.
    victim = m.children()[0]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: victim not in m.children() and len(m.children()) == 2, what="respawn")
    _, text = get(addr, "/metrics")
    assert sample(text, "brooq_outcomes_total", topic="t.ok", outcome="done") == 20
    assert sample(text, "brooq_child_restarts_total", reason="crash") == 1
    queue.enqueue_many([brooq.Job("t.ok") for _ in range(5)])
    wait_for(lambda: states(db).get("done") == 25, what="five more")
    _, text = get(addr, "/metrics")
    assert sample(text, "brooq_outcomes_total", topic="t.ok", outcome="done") == 25
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_oldest_ready_age_and_busy_children(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    m = start_master(workers=1, env=FAST_STATS)
    addr = ops_addr(m)
    queue.enqueue(brooq.Job("t.slow", {"seconds": 3}))
    wait_for(lambda: states(db).get("processing") == 1, what="busy")
    queue.enqueue(brooq.Job("t.ok"))

    def aged() -> str | None:
        """The scrape once the stats duty has seen the t.ok job half a second old."""
        text = get(addr, "/metrics")[1]
        return text if sample(text, "brooq_ready_oldest_age_seconds", topic="t.ok") >= 0.5 else None

    # Within the t.slow job's 3 s: its child stays busy and t.ok waits behind it.
    text = wait_for(aged, timeout=2.0, interval=0.1, what="the t.ok job 0.5 s old")
    assert sample(text, "brooq_children_busy") == 1
    assert sample(text, "brooq_jobs", topic="t.slow", state="processing") == 1
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_jobs_gauges_carry_the_queue_and_drop_to_zero_when_it_empties(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    # A topic without a handler in this app: its jobs stay where they are put.
    queue.enqueue_many([brooq.Job("nobody.handles", queue="bulk") for _ in range(3)])
    first, _ = queue.enqueue(brooq.Job("nobody.handles"))
    queue.enqueue(brooq.Job("nobody.waits", after=[first]))  # a workflow's waiting job
    m = start_master(workers=1, env=FAST_STATS)
    addr = ops_addr(m)

    def jobs(queue_name: str) -> float:
        _, text = get(addr, "/metrics")
        return sample(text, "brooq_jobs", topic="nobody.handles", state="ready", queue=queue_name)

    wait_for(lambda: jobs("bulk") == 3, what="bulk counted")
    assert jobs("default") == 1
    _, text = get(addr, "/metrics")
    assert sample(text, "brooq_jobs", topic="nobody.waits", state="waiting") == 1
    assert sample(text, "brooq_jobs", topic="nobody.handles", state="waiting") == 0
    assert 'brooq_jobs{queue="bulk",state="ready",topic="nobody.handles"} 3.0' in text
    assert 'state="pending"' not in text and 'state="failed"' not in text  # not counts
    assert sample(text, "brooq_ready_oldest_age_seconds", topic="nobody.handles", queue="bulk") > 0
    # The label set of a queue whose jobs are gone reads 0, not its last count.
    db.execute("UPDATE job SET state = 'canceled' WHERE queue = 'bulk'")
    wait_for(lambda: jobs("bulk") == 0 and 'queue="bulk"' in get(addr, "/metrics")[1], what="0")
    _, text = get(addr, "/metrics")
    assert sample(text, "brooq_ready_oldest_age_seconds", topic="nobody.handles", queue="bulk") == 0
    assert jobs("default") == 1
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def queue_rows(db: psycopg.Connection) -> list[tuple[str, bool]]:
    return [(n, p) for n, p in db.execute("SELECT name, paused FROM brooq_queue ORDER BY name")]


def test_pause_resume_and_the_queues(queue: brooq.Queue, db: psycopg.Connection) -> None:
    assert queue.queues() == []
    queue.pause("fresh")  # before any job: allowed, it holds when jobs come
    assert queue.queues() == [brooq.QueueStats(name="fresh", paused=True)]
    assert queue_rows(db) == [("fresh", True)]
    queue.pause("fresh")
    assert queue_rows(db) == [("fresh", True)]

    queue.enqueue_many([brooq.Job("a", queue="bulk") for _ in range(3)])
    queue.enqueue(
        brooq.Job("a", queue="bulk", available_at=datetime.now(timezone.utc) + timedelta(hours=1))
    )
    queue.enqueue_many([brooq.Job("b") for _ in range(2)])
    db.execute(
        "UPDATE job SET available_at = now() - interval '5 s' WHERE queue = 'bulk' "
        "AND available_at <= now()"
    )
    db.execute(
        "UPDATE job SET state = 'processing', locked_by = 'w', locked_until = now() + "
        "interval '1 min' WHERE id = (SELECT id FROM job WHERE queue = 'bulk' "
        "AND available_at <= now() LIMIT 1)"
    )
    db.execute(
        "UPDATE job SET state = 'dead' WHERE id = (SELECT id FROM job WHERE topic = 'b' LIMIT 1)"
    )
    queue.pause("bulk")
    by_name = {q.name: q for q in queue.queues()}
    assert list(by_name) == ["bulk", "default", "fresh"]
    bulk = by_name["bulk"]
    assert (bulk.paused, bulk.ready, bulk.scheduled, bulk.processing, bulk.failed, bulk.dead) == (
        True,
        2,
        1,
        1,
        0,
        0,
    )
    assert (bulk.waiting, bulk.held, bulk.retrying, bulk.parked) == (0, 0, 0, 0)
    assert 5 <= bulk.oldest_ready_seconds < 30
    default = by_name["default"]
    assert (default.paused, default.ready, default.processing, default.dead) == (False, 1, 0, 1)
    assert bulk.to_dict() == {
        "name": "bulk",
        "paused": True,
        "waiting": 0,
        "scheduled": 1,
        "ready": 2,
        "held": 0,
        "retrying": 0,
        "parked": 0,
        "on_hold": 0,
        "processing": 1,
        "dead": 0,
        "oldest_ready_seconds": round(bulk.oldest_ready_seconds, 3),
        "failed": 0,
    }
    # A pause stops claims, not producers: enqueueing goes on.
    queue.enqueue(brooq.Job("a", queue="bulk"))
    assert {q.name: q.ready for q in queue.queues()}["bulk"] == 3

    queue.resume("bulk")
    queue.resume("never.paused")  # a row saying it runs
    assert queue_rows(db) == [("bulk", False), ("fresh", True), ("never.paused", False)]
    assert [(q.name, q.paused) for q in queue.queues()] == [
        ("bulk", False),
        ("default", False),
        ("fresh", True),
        ("never.paused", False),
    ]


@pytest.mark.parametrize("name", ["Bad Name", "UPPER", "", "a" * 129, "x-", 3, None, b"bulk"])
def test_a_malformed_queue_name_is_refused_before_any_write(
    queue: brooq.Queue, db: psycopg.Connection, name: object
) -> None:
    for act in (queue.pause, queue.resume):
        with pytest.raises(brooq.InvalidQueue, match="queue"):
            act(name)  # type: ignore[arg-type]
    if name is not None:  # list_jobs(queue=None) lists every queue
        with pytest.raises(brooq.InvalidQueue):
            queue.list_jobs(queue=name)  # type: ignore[arg-type]
    assert queue_rows(db) == []


def test_list_jobs_and_stats_by_queue(queue: brooq.Queue) -> None:
    bulk = [queue.enqueue(brooq.Job("a", {"n": n}, queue="bulk", priority=n))[0] for n in range(3)]
    plain, _ = queue.enqueue(brooq.Job("a"))
    other, _ = queue.enqueue(brooq.Job("b", queue="bulk"))
    listed = queue.list_jobs(queue="bulk")
    assert {r.id for r in listed} == {*bulk, other}
    assert {(r.queue, r.priority) for r in listed if r.topic == "a"} == {
        ("bulk", n) for n in range(3)
    }
    assert [r.id for r in queue.list_jobs(queue="bulk", topic="b")] == [other]
    assert [r.id for r in queue.list_jobs(queue="default")] == [plain]
    assert queue.list_jobs(queue="nothing.here") == []
    assert len(queue.list_jobs()) == 5
    record = queue.get(bulk[2])
    assert record is not None and (record.queue, record.priority) == ("bulk", 2)

    stats = queue.stats()
    assert [(s.queue, s.topic, s.pending, s.ready) for s in stats] == [
        ("bulk", "a", 3, 3),
        ("bulk", "b", 1, 1),
        ("default", "a", 1, 1),
    ]
    assert stats[0].to_dict()["queue"] == "bulk"
    assert queue.throughput(60) == {}


def test_readyz_follows_the_database(
    private_server,
    start_master: StartMaster,  # type: ignore[no-untyped-def]
) -> None:
    m = start_master(workers=1, dsn=private_server.dsn)
    addr = ops_addr(m)
    wait_for(lambda: get(addr, "/readyz") == (200, "ready\n"), what="ready")
    private_server.stop()
    wait_for(lambda: get(addr, "/readyz")[0] == 503, timeout=15, what="503")
    assert "database unreachable" in get(addr, "/readyz")[1]
    assert get(addr, "/healthz") == (200, "ok\n")  # the master loop is alive
    private_server.start()
    wait_for(lambda: get(addr, "/readyz")[0] == 200, timeout=30, what="200 again")
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_readyz_is_503_while_draining(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    m = start_master(workers=1)
    addr = ops_addr(m)
    wait_for(lambda: get(addr, "/readyz")[0] == 200, what="ready")
    job_id, _ = queue.enqueue(brooq.Job("t.slow", {"seconds": 2}))
    # The handler, not the claim: a job claimed but not started when TERM lands is given
    # back at once, and the master, with nothing left to drain, is gone before a probe.
    wait_for(lambda: executions(db, job_id) == 1, what="the handler running")
    m.signal(signal.SIGTERM)
    assert wait_for(lambda: get(addr, "/readyz") == (503, "draining\n"), what="503 draining")
    assert m.wait() == 0


def test_admin_endpoints_need_the_token(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster, tmp_path: Path
) -> None:
    token = "t0k3n-" + "x" * 26
    token_file = tmp_path / "admin-token"
    token_file.write_text(token + "\n")
    m = start_master(workers=1, env={"QUEUE_ADMIN_TOKEN_FILE": str(token_file)})
    addr = ops_addr(m)
    # A topic without a handler here: nothing claims the job after a retry.
    job_id, _ = queue.enqueue(brooq.Job("nobody.handles.this"))
    path = f"/admin/jobs/{job_id}/cancel"
    assert get(addr, path, method="POST")[0] == 401
    assert get(addr, path, token="wrong", method="POST")[0] == 401
    assert get(addr, path, token=token[:-1], method="POST")[0] == 401
    assert states(db) == {"pending": 1}
    status, body = get(addr, path, token=token, method="POST")
    assert status == 200 and json.loads(body)["ok"] is True
    assert states(db) == {"canceled": 1}
    status, body = get(addr, path, token=token, method="POST")
    assert status == 409 and "only pending, failed, processing, waiting or on_hold" in body
    status, body = get(addr, f"/admin/jobs/{job_id}/retry", token=token, method="POST")
    assert status == 200 and states(db) == {"pending": 1}
    unknown = "00000000-0000-4000-8000-000000000000"
    assert get(addr, f"/admin/jobs/{unknown}/retry", token=token, method="POST")[0] == 404
    assert get(addr, "/healthz") == (200, "ok\n")  # stays open
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_admin_endpoints_hold_and_release(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster, tmp_path: Path
) -> None:
    """POST /admin/jobs/<id>/hold and /release: the token as for cancel and retry, 200
    when the job moved, 409 worded as brooq.job words it (or, for a hold its state
    allows, explain_refusal: a unique_key), 404 for an unknown id; cancel takes a held
    job."""
    token = "t0k3n-" + "x" * 26
    token_file = tmp_path / "admin-token"
    token_file.write_text(token + "\n")
    m = start_master(workers=1, env={"QUEUE_ADMIN_TOKEN_FILE": str(token_file)})
    addr = ops_addr(m)
    # A topic without a handler here: nothing claims the job once released.
    job_id, _ = queue.enqueue(brooq.Job("nobody.handles.this"))
    hold, release = f"/admin/jobs/{job_id}/hold", f"/admin/jobs/{job_id}/release"
    assert get(addr, hold, method="POST")[0] == 401
    assert get(addr, hold, token="wrong", method="POST")[0] == 401
    assert states(db) == {"pending": 1}
    status, body = get(addr, hold, token=token, method="POST")
    assert status == 200 and json.loads(body) == {"id": str(job_id), "action": "hold", "ok": True}
    assert states(db) == {"on_hold": 1}
    status, body = get(addr, hold, token=token, method="POST")
    assert status == 409 and json.loads(body) == {
        "error": "job is on_hold; only pending or failed jobs can be held",
        "state": "on_hold",
    }
    status, body = get(addr, release, token=token, method="POST")
    assert status == 200 and json.loads(body)["action"] == "release"
    assert states(db) == {"pending": 1}
    status, body = get(addr, release, token=token, method="POST")
    assert status == 409 and "job is pending; only on_hold jobs can be released" in body
    assert get(addr, hold, token=token, method="POST")[0] == 200
    status, _ = get(addr, f"/admin/jobs/{job_id}/cancel", token=token, method="POST")
    assert status == 200 and states(db) == {"canceled": 1}
    keyed, _ = queue.enqueue(brooq.Job("nobody.handles.this", unique_key="k"))
    status, body = get(addr, f"/admin/jobs/{keyed}/hold", token=token, method="POST")
    answer = json.loads(body)
    assert status == 409 and answer["state"] == "pending"
    assert f"cannot hold job {keyed}: it has a unique_key ('k')" in answer["error"]
    unknown = "00000000-0000-4000-8000-000000000000"
    for action in ("hold", "release"):
        path = f"/admin/jobs/{unknown}/{action}"
        assert get(addr, path, token=token, method="POST")[0] == 404
    assert get(addr, f"/admin/jobs/{job_id}/pause", token=token, method="POST")[0] == 404
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_admin_endpoints_off_without_a_token(start_master: StartMaster) -> None:
    m = start_master(workers=1)
    addr = ops_addr(m)
    unknown = "00000000-0000-4000-8000-000000000000"
    status, body = get(addr, f"/admin/jobs/{unknown}/cancel", token="x" * 20, method="POST")
    assert status == 403 and "no admin token configured" in body
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def finished_in_job(
    db: psycopg.Connection, topic: str, n: int, ended: str, state: str = "'done'"
) -> None:
    """n finished jobs of ``topic`` left in job, as every finished job was before
    job_history (migration 0020), ended ``ended`` ago (an interval); ``state`` is an SQL
    expression, per row. An UPDATE into a terminal state would move them to job_history:
    an INSERT keeps them in job, where only the row-by-row retention deletes them."""
    db.execute(
        "INSERT INTO job (topic, state, attempts, updated_at) "
        f"SELECT %s, {state}, 1, now() - %s::interval FROM generate_series(1, %s)",
        (topic, ended, n),
    )


def test_retention_run_once(queue: brooq.Queue, db: psycopg.Connection) -> None:
    finished_in_job(
        db, "old", 35, "2 hours", state="(ARRAY['done','dead','canceled'])[1 + (random() * 2)::int]"
    )
    finished_in_job(db, "recent", 5, "0 s")
    queue.enqueue_many([brooq.Job("active") for _ in range(6)])
    db.execute(
        "UPDATE job SET state = CASE WHEN random() < 0.5 THEN 'pending' ELSE 'failed' END, "
        "updated_at = now() - interval '400 days' WHERE topic = 'active'"
    )
    assert maintenance.delete_expired(db, ttl=0, batch=10) == ({}, False)  # 0 means off
    # Budget enough for every batch on a loaded machine: the budget is the next test's.
    deleted, more = maintenance.delete_expired(db, ttl=3600, batch=10, budget=60.0)
    assert deleted == {"old": 35} and more is False
    left = dict(db.execute("SELECT topic, count(*) FROM job_all GROUP BY topic").fetchall())
    assert left == {"recent": 5, "active": 6}


def test_retention_reports_what_is_left_beyond_the_time_budget(
    queue: brooq.Queue, db: psycopg.Connection
) -> None:
    """A pass deletes batch after batch until its budget is spent (a clock that moves one
    second per look, so two batches fit in 1.5 s), then says more may remain; a budget of
    0 still deletes one batch."""
    finished_in_job(db, "old", 30, "2 days")
    ticks = iter(range(100))
    deleted, more = maintenance.delete_expired(
        db, ttl=3600, batch=10, budget=1.5, clock=lambda: float(next(ticks))
    )
    assert deleted == {"old": 20} and more is True
    deleted, more = maintenance.delete_expired(db, ttl=3600, batch=5, budget=0.0)
    assert deleted == {"old": 5} and more is True
    deleted, more = maintenance.delete_expired(db, ttl=3600, batch=10)
    assert deleted == {"old": 5} and more is False


def test_the_master_drains_a_retention_backlog_between_its_other_work(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    """20,000 expired rows, batches of 10 and a period of an hour: only passes that run
    again while behind (not a period later) delete them all, and the loop stays free
    meanwhile: jobs enqueued during the backlog are picked up and /healthz answers."""
    finished_in_job(db, "old", 20_000, "2 hours")
    m = start_master(
        workers=1,
        env={
            "QUEUE_RETENTION_TTL": "1h",
            "QUEUE_RETENTION_BATCH": "10",
            "QUEUE_RETENTION_PERIOD": "1h",
        },
    )
    addr = ops_addr(m)
    wait_for(lambda: "event=retention_behind" in m.log(), what="a backlog seen")
    queue.enqueue(brooq.Job("t.ok"))
    status, _ = get(addr, "/healthz")
    assert status == 200
    wait_for(lambda: states(db) == {"done": 1}, timeout=60, what="the backlog deleted")
    # The line follows the last batch's commit: it may reach the log a moment after.
    wait_for(lambda: "event=retention_caught_up count=20000" in m.log(), what="caught up said")
    _, text = get(addr, "/metrics")
    assert sample(text, "brooq_retention_deleted_total", topic="old") == 20_000
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_retention_in_the_master(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    finished_in_job(db, "old", 25, "2 hours")
    queue.enqueue(brooq.Job("keep"))
    # Ended through job_history, three days ago: the master makes partitions from the
    # day before today, so these stay in the default partition, which retention deletes
    # a batch a period.
    queue.enqueue_many([brooq.Job("older") for _ in range(15)])
    db.execute(
        "UPDATE job SET state = 'dead', updated_at = now() - interval '3 days' "
        "WHERE topic = 'older'"
    )
    assert db.execute("SELECT count(*) FROM job_history_default").fetchone() == (15,)
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    queue.enqueue(brooq.Job("keep", available_at=later))
    m = start_master(
        workers=1,
        env={
            "QUEUE_RETENTION_TTL": "1h",
            "QUEUE_RETENTION_BATCH": "10",
            "QUEUE_RETENTION_PERIOD": "200ms",
        },
    )
    addr = ops_addr(m)
    wait_for(lambda: states(db) == {"pending": 2}, what="old rows deleted")
    _, text = get(addr, "/metrics")
    assert sample(text, "brooq_retention_deleted_total", topic="old") == 25
    assert sample(text, "brooq_retention_deleted_total", topic="older") == 15
    # The log accounts for every deleted row: one count per pass that caught up at once
    # (retention_deleted), or one total when passes ran behind (retention_caught_up).
    wait_for(lambda: _retention_logged(m.log()) == 25, what="the 25 deletions logged")
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_the_master_releases_an_expired_partitions_keys_in_passes_and_drops_it(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    """A day of keyed jobs that ended nine days ago, with a TTL of 7 days and a retention
    period of an hour: its 40,000 keys take more than one pass of key releases, so only
    passes that come back while keys are left (not a period later) release them all and
    drop the partition. Jobs run meanwhile, and a released key is free again."""
    start = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    start -= timedelta(days=9)
    name = "job_history_" + start.strftime("%Y%m%d") + "_000000"
    db.execute(
        sql.SQL("CREATE TABLE {} PARTITION OF job_history FOR VALUES FROM ({}) TO ({})").format(
            sql.Identifier(name), sql.Literal(start), sql.Literal(start + timedelta(days=1))
        )
    )
    db.execute(
        "INSERT INTO job_history (id, topic, state, idempotency_key, updated_at) "
        "SELECT gen_random_uuid(), 'old', 'done', 'k' || g, %s "
        "FROM generate_series(1, 40000) AS g",
        (start + timedelta(hours=12),),
    )
    db.execute(
        "INSERT INTO brooq_job_key (topic, idempotency_key, job_id) "
        "SELECT topic, idempotency_key, id FROM job_history WHERE topic = 'old'"
    )
    m = start_master(workers=1, env={"QUEUE_RETENTION_TTL": "7d", "QUEUE_RETENTION_PERIOD": "1h"})
    queue.enqueue(brooq.Job("t.ok"))
    wait_for(
        lambda: f"event=history_partition_dropped partition={name} " in m.log(),
        timeout=60,
        what="the partition dropped",
    )
    assert re.search(rf"partition={name} rows=\d+ kept=0 keys=40000", m.log()), m.log()
    assert db.execute("SELECT to_regclass(%s)", (name,)).fetchone() == (None,)
    assert db.execute("SELECT count(*) FROM brooq_job_key WHERE topic = 'old'").fetchone() == (0,)
    _, created = queue.enqueue(brooq.Job("old", idempotency_key="k1"))
    assert created
    wait_for(lambda: states(db).get("done") == 1, what="the job enqueued meanwhile ran")
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_sd_notify_messages_arrive(start_master: StartMaster, tmp_path: Path) -> None:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(10)
    m = start_master(workers=2, env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"})
    received: list[str] = []

    def until(word: str) -> None:
        while not any(word in r for r in received):
            received.append(sock.recv(4096).decode())

    until("READY=1")
    assert len(m.children()) == 2  # ready only once the children are up
    until("WATCHDOG=1")
    m.signal(signal.SIGTERM)
    until("STOPPING=1")
    assert m.wait() == 0
    sock.close()


def test_password_never_shows_in_proc_or_logs(
    dsn: str, tmp_path: Path, start_master: StartMaster
) -> None:
    secret = "pw-" + os.urandom(8).hex()
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "database-url").write_text(conninfo.make_conninfo(dsn, password=secret))
    app = tmp_path / "quiet_app.py"
    app.write_text(
        textwrap.dedent(
            """
            import brooq
            queue = brooq.Queue()

            @queue.handler("q.noop")
            def noop(claim):
                pass
            """
        )
    )
    m = start_master(
        workers=2,
        app="quiet_app:queue",
        cwd=tmp_path,
        env={"DATABASE_URL": "", "CREDENTIALS_DIRECTORY": str(creds)},
    )
    kids = m.wait_ready(2)
    q = brooq.Queue(dsn)
    job_id, _ = q.enqueue(brooq.Job("q.noop"))
    wait_for(lambda: (r := q.get(job_id)) is not None and r.state == "done", what="done")
    q.close()
    for pid in [m.pid, *kids]:
        for name in ("environ", "cmdline"):
            content = Path(f"/proc/{pid}/{name}").read_bytes()
            assert secret.encode() not in content, f"/proc/{pid}/{name}"
    m.signal(signal.SIGTERM)
    assert m.wait() == 0
    assert secret not in m.log()


def test_json_logs(queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster) -> None:
    m = start_master(workers=1, args=("--log-format", "json"))
    job_id, _ = queue.enqueue(brooq.Job("t.fail"))
    wait_for(lambda: states(db) == {"dead": 1}, what="dead")
    m.signal(signal.SIGTERM)
    assert m.wait() == 0
    records = [json.loads(line) for line in m.log().splitlines() if line.startswith("{")]
    events = {r.get("event") for r in records}
    assert {"master_started", "job_failed", "job_dead", "master_stopped"} <= events
    dead = next(r for r in records if r.get("event") == "job_dead")
    assert dead["level"] == "error" and dead["job"] == str(job_id)


@pytest.mark.parametrize("fmt", ["kv", "json"])
def test_every_job_done_gets_one_whole_log_line(
    fmt: str, queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    """The children write their job_done lines per round trip, without LogRecords: each
    finished job still gets its own complete line, from the child that ran it."""
    m = start_master(workers=2, args=("--log-format", fmt))
    kids = set(m.wait_ready(2))
    ids = [job_id for job_id, _ in queue.enqueue_many([brooq.Job("t.ok") for _ in range(300)])]
    wait_for(lambda: states(db) == {"done": 300}, what="all done")
    m.signal(signal.SIGTERM)
    assert m.wait() == 0
    lines = [line for line in m.log().splitlines() if "job_done" in line]
    if fmt == "json":
        records = [json.loads(line) for line in lines]
    else:
        records = [dict(pair.split("=", 1) for pair in line.split(" ")) for line in lines]
    assert sorted(r["job"] for r in records) == sorted(str(i) for i in ids)
    for r in records:
        assert r["event"] == "job_done" and r["level"] == "info"
        assert r["logger"] == "brooq.child" and int(r["pid"]) in kids
        assert r["topic"] == "t.ok" and r["attempt"] == "1"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", r["time"])


def test_systemd_units_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    unit = (ROOT / "systemd" / "brooq.service").read_text()
    for directive in (
        "Type=notify",
        "KillMode=mixed",
        "LoadCredential=database-url:",
        "RuntimeDirectory=",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes",
        "RestrictNamespaces=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
        "CapabilityBoundingSet=",
        "SystemCallFilter=@system-service",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "UMask=0077",
    ):
        assert directive in unit, directive
    stop = int(re.search(r"TimeoutStopSec=(\d+)", unit).group(1))  # type: ignore[union-attr]
    assert stop > 30  # above the default drain budget
    env_example = (ROOT / "systemd" / "brooq.env.example").read_text()
    assert "DATABASE_URL" not in env_example.replace("# ", "")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed: directive checks only")
    binary = Path(sys.executable).parent / "brooq-master"
    assert binary.exists()
    for name in ("brooq.service", "brooq-migrate.service"):
        text = (ROOT / "systemd" / name).read_text()
        text = text.replace("/opt/brooq/venv/bin/", f"{binary.parent}/")
        text = text.replace("/etc/brooq/database-url", "/etc/hostname")
        text = text.replace("WorkingDirectory=/opt/brooq/app", f"WorkingDirectory={tmp_path}")
        text = text.replace("User=brooq", "User=root").replace("Group=brooq", "Group=root")
        (tmp_path / name).write_text(text)
        out = subprocess.run(
            [analyze, "verify", str(tmp_path / name)], capture_output=True, text=True
        )
        assert out.returncode == 0 and out.stderr.strip() == "", out.stderr


def test_dead_childrens_live_gauges_are_dropped_and_the_dir_wiped(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster, tmp_path: Path
) -> None:
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    (metrics_dir / "counter_99999.db").write_bytes(b"stale from an earlier run")
    m = start_master(workers=1, args=("--metrics-dir", str(metrics_dir)))
    addr = ops_addr(m)
    assert not (metrics_dir / "counter_99999.db").exists()  # wiped at start
    queue.enqueue(brooq.Job("t.ok"))
    wait_for(lambda: states(db) == {"done": 1}, what="done")
    victim = m.children()[0]
    wait_for(lambda: list(metrics_dir.glob(f"gauge_live*_{victim}.db")), what="live gauge")
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: m.children() and m.children() != [victim], what="replaced")
    wait_for(
        lambda: not list(metrics_dir.glob(f"gauge_live*_{victim}.db")),
        what="mark_process_dead removed the dead child's live gauges",
    )
    assert list(metrics_dir.glob(f"counter_{victim}.db"))  # counters stay: never go back
    _, text = get(addr, "/metrics")
    assert sample(text, "brooq_outcomes_total", topic="t.ok", outcome="done") == 1
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_ops_surface_binds_loopback_by_default() -> None:
    from brooq.settings import Settings

    assert Settings().ops_addr == "127.0.0.1:8090"


def test_the_master_vacuums_the_job_table_past_its_dead_tuple_threshold(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    """With autovacuum out of the way (off for the table, as a server may have it off
    altogether), 300 jobs' claims and outcomes leave over 600 dead tuples; past the
    threshold of 200 the master sends its own VACUUM and reads the answer in its loop."""
    db.execute("ALTER TABLE job SET (autovacuum_enabled = false)")
    m = start_master(
        workers=2, env={"QUEUE_VACUUM_DEAD_TUPLES": "200", "QUEUE_VACUUM_PERIOD": "200ms"}
    )
    addr = ops_addr(m)

    def vacuums() -> int:
        row = db.execute(
            "SELECT vacuum_count FROM pg_stat_all_tables WHERE relid = 'job'::regclass"
        ).fetchone()
        return int(row[0]) if row else 0

    before = vacuums()
    queue.enqueue_many([brooq.Job("t.ok") for _ in range(300)])
    wait_for(lambda: states(db) == {"done": 300}, what="all done")
    wait_for(lambda: "event=vacuum_done" in m.log(), timeout=30, what="the master's vacuum")
    assert "event=vacuum_started dead_tuples=" in m.log()
    wait_for(lambda: vacuums() > before, what="the vacuum counted by PostgreSQL")
    assert get(addr, "/healthz")[0] == 200
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_stats_count_never_holds_the_loop(dsn: str, db: Any, queue: brooq.Queue) -> None:
    """The stats duty's count goes off the loop (brooq.supervisor.offloop): with the job
    table locked, run_once returns while the count waits on the lock in the server, the
    loop's select does not find its answer, and once the lock is gone the answer sets
    the gauges. (In the loop, run_once would wait here for the lock.)"""
    import select

    from brooq.settings import Settings
    from brooq.sql import queries
    from brooq.supervisor.duties.stats import Stats
    from tests.unit.supervisor.duties.test_scheduler_and_duties import FakeMetrics
    from tests.unit.supervisor.duties.test_scheduler_and_duties import ready as count_of

    for _ in range(3):
        queue.enqueue(brooq.Job("t.counted"))

    class InLoop:  # the master's connection, for the health read (a catalog read)
        q = queries(None)

        def with_db(self, what: str, fn: Any) -> Any:
            return fn(db)

    metrics = FakeMetrics()
    duty = Stats(InLoop(), {}, Settings(), metrics, dsn=dsn)  # type: ignore[arg-type]
    assert duty.line is not None
    duty.line.session["lock_timeout"] = "0"  # wait on the lock as long as the test holds it
    with psycopg.connect(dsn) as holder:
        holder.execute("LOCK TABLE job IN ACCESS EXCLUSIVE MODE")
        assert duty.run_once(0.0) == {"sent": 1}
        assert duty.line.busy and count_of(metrics, "default", "t.counted") is None
        wait_for(
            lambda: (
                db.execute(
                    "SELECT wait_event_type FROM pg_stat_activity "
                    "WHERE application_name = 'brooq-master-stats' AND datname = current_database()"
                ).fetchone()
                == ("Lock",)
            ),
            what="the count waiting on the lock, in the server",
        )
        ready, _, _ = select.select(duty.read_fds(), [], [], 0.2)
        duty.service(set(ready))
        assert duty.line.busy and count_of(metrics, "default", "t.counted") is None
        assert duty.run_once(5.0) == {}  # one count at a time
        holder.rollback()
    while duty.line.busy:
        ready, _, _ = select.select(duty.read_fds(), [], [], 5.0)
        assert ready, "no answer within 5 s of the lock's release"
        duty.service(set(ready))
    assert count_of(metrics, "default", "t.counted") == 3
    duty.close()


def _listening_ports(pid: int) -> set[int]:
    """TCP ports that process ``pid`` listens on (its sockets found in /proc/net/tcp*)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_a_master_with_empty_ops_addr_binds_nothing(
    start_master: StartMaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    off_by_env = start_master(workers=1, env={"QUEUE_OPS_ADDR": ""})
    off_by_flag = start_master(workers=1, args=("--ops-addr", ""))
    on = start_master(workers=1)  # FAST: 127.0.0.1:0, a free port
    monkeypatch.setattr(
        harness, "FAST", {k: v for k, v in harness.FAST.items() if k != "QUEUE_OPS_ADDR"}
    )
    default = start_master(workers=1)  # QUEUE_OPS_ADDR unset
    for m in (off_by_env, off_by_flag, on, default):
        m.wait_ready(1)
    # The ops server is started before the first fork: with children up, it is decided.
    assert "event=ops_listening" in on.log() and _listening_ports(on.pid)
    # The default address is tried (another process on the host may hold 8090 already).
    assert "event=ops_listening addr=127.0.0.1:8090" in default.log() or (
        "event=ops_bind_failed addr=127.0.0.1:8090" in default.log()
    ), default.log()
    for m in (off_by_env, off_by_flag):
        assert "event=ops_" not in m.log(), m.log()
        assert _listening_ports(m.pid) == set()
