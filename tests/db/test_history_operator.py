"""The operator's side of finished jobs in job_history (migration 0020), against a real
PostgreSQL: a job is read, listed, counted, retried and refused wherever it is (job while
active, job_history once finished, job for a row that ended before the migration), by
every door: Queue (sync and async), the caller's own connection, the CLI; and a cancel
racing an outcome reports the job finished, never an error, never a lost write."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import brooq
import brooq.testing
from brooq.errors import InvalidTransition, JobNotRunning
from brooq.operator import changes, reads
from brooq.sql import Q
from tests.db.test_cli import as_json, ok, refused, run

Conn = psycopg.Connection[Any]
WORKER = "host:1:w1"
# What a retry writes (job_retry); every other column is kept as the history row had it.
RESET = {"state", "attempts", "available_at", "locked_by", "locked_until", "waited",
         "start_after", "updated_at"}  # fmt: skip


def _claim(conn: Conn, topic: str, queue: str = "default") -> uuid.UUID:
    """One ready job of ``topic`` claimed by WORKER (the claim statement)."""
    rows = conn.execute(
        Q.job_finish_and_claim,
        {"done": [], "topics": [topic], "limit": 1, "children": 1, "worker": WORKER,
         "lease": 60.0, "queue": queue},
    ).fetchall()  # fmt: skip
    assert len(rows) == 1, rows
    return uuid.UUID(str(rows[0][1]))


def _done_by_claim(conn: Conn, job_id: uuid.UUID) -> None:
    """The claim statement's done: the row deleted from job, inserted into job_history."""
    conn.execute(
        Q.job_finish_and_claim,
        {"done": [job_id], "topics": ["none"], "limit": 0, "children": 1, "worker": WORKER,
         "lease": 60.0, "queue": "default"},
    ).fetchall()  # fmt: skip


def _done(conn: Conn, job_id: uuid.UUID, result: Any = None) -> None:
    """job_set_done: an UPDATE whose trigger (job_zz_history) moves the row."""
    row = conn.execute(
        Q.job_set_done,
        {"id": job_id, "worker": WORKER, "result": None if result is None else json.dumps(result)},
    )
    assert row.rowcount == 1


def _dead(conn: Conn, job_id: uuid.UUID, error: str = "ValueError: kaput") -> None:
    row = conn.execute(
        Q.job_set_failed,
        {"id": job_id, "worker": WORKER, "refund": False, "max_attempts": 1, "delay": 0.0,
         "error": error, "history_error": error, "kind": "raised", "traceback": None},
    ).fetchone()  # fmt: skip
    assert row is not None and row[0] == "dead"


def _job(app: brooq.Queue, db: Conn, topic: str, end: str, **options: Any) -> uuid.UUID:
    """A job of ``topic`` enqueued, claimed and ended ``end`` (done, dead, canceled): it
    is in job_history."""
    job_id, _ = app.enqueue(brooq.Job(topic, {"n": str(uuid.uuid4())}, **options))
    if end == "canceled":
        assert app.cancel(job_id)
    else:
        assert _claim(db, topic, options.get("queue", "default")) == job_id
        (_done if end == "done" else _dead)(db, job_id)
    assert _where(db, job_id) == ["job_history"]
    return job_id


def _legacy(db: Conn, topic: str, state: str, **columns: Any) -> uuid.UUID:
    """A finished row left in job, as one that ended before migration 0020 is (inserted
    in its state: no UPDATE, no move)."""
    job_id = uuid.uuid4()
    names = ["id", "topic", "state", *columns]
    db.execute(
        f"INSERT INTO job ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))})",
        [job_id, topic, state, *columns.values()],
    )
    assert _where(db, job_id) == ["job"]
    return job_id


def _where(db: Conn, job_id: uuid.UUID) -> list[str]:
    """The tables holding the job (one, always)."""
    return [
        table
        for table in ("job", "job_history")
        if db.execute(f"SELECT 1 FROM {table} WHERE id = %s", (job_id,)).fetchone()
    ]


def _row(db: Conn, job_id: uuid.UUID) -> dict[str, Any]:
    found = db.execute(
        "SELECT to_jsonb(j) AS row FROM job_all AS j WHERE j.id = %s", (job_id,)
    ).fetchone()
    assert found is not None
    return dict(found[0])


# -- reading --------------------------------------------------------------------------------


def test_a_finished_job_is_read_by_every_door_wherever_it_is(
    queue: brooq.Queue, db: Conn, dsn: str
) -> None:
    moved = _job(queue, db, "mail", "dead", tags=["eu"])
    legacy = _legacy(db, "mail", "dead", last_error="old", tags=["eu"])
    for job_id in (moved, legacy):
        record = queue.get(job_id)
        assert record is not None and record.state == "dead"
        assert asyncio.run(_get_async(dsn, job_id)) == record
        with psycopg.connect(dsn) as conn:
            assert reads.get(conn, job_id) == record
        assert as_json(dsn, "jobs", "show", str(job_id))["state"] == "dead"
        assert "state:           dead" in ok(dsn, "jobs", "show", str(job_id))
    assert queue.get(moved).last_error == "ValueError: kaput"  # type: ignore[union-attr]
    assert queue.get(moved).errors[0]["error"] == "ValueError: kaput"  # type: ignore[union-attr]
    assert queue.logs(moved) == []  # its row is found: no JobNotFound
    # Listings: both tables, newest first, by state, queue and tag; sync, async, the CLI.
    active, _ = queue.enqueue(brooq.Job("mail", tags=["eu"]))
    listed = [r.id for r in queue.list_jobs(topic="mail")]
    assert listed == [active, legacy, moved] or listed == [active, moved, legacy]
    assert {r.id for r in queue.list_jobs(state="dead")} == {moved, legacy}
    assert {r.id for r in queue.list_jobs(state="dead", tag="eu", queue="default")} == {
        moved,
        legacy,
    }
    assert queue.list_jobs(state="dead", tag="us") == []
    assert [r.id for r in asyncio.run(_list_async(dsn))] == listed
    shown = as_json(dsn, "jobs", "list", "--state", "dead", "--tag", "eu")["jobs"]
    assert {j["id"] for j in shown} == {str(moved), str(legacy)}
    assert {j.id for j in brooq.testing.jobs(queue, state="dead")} == {moved, legacy}


async def _get_async(dsn: str, job_id: uuid.UUID) -> brooq.JobRecord | None:
    q = brooq.Queue(dsn)
    try:
        return await q.get_async(job_id)
    finally:
        await q.close_async()


async def _list_async(dsn: str) -> list[brooq.JobRecord]:
    q = brooq.Queue(dsn)
    try:
        return await q.list_jobs_async(topic="mail")
    finally:
        await q.close_async()


def test_the_graph_the_stack_and_the_schedules_read_finished_jobs(
    queue: brooq.Queue, db: Conn
) -> None:
    first, _ = queue.enqueue(brooq.Job("flow.a"))
    second, _ = queue.enqueue(brooq.Job("flow.b", after=[first]))
    assert _claim(db, "flow.a") == first
    _done(db, first, {"total": 3})
    assert _where(db, first) == ["job_history"]
    [up] = queue.upstream(second)
    assert (up.id, up.state, up.result) == (first, "done", {"total": 3})
    assert [(d.id, d.state) for d in queue.downstream(first)] == [(second, "pending")]
    with pytest.raises(JobNotRunning, match="state: done"):
        queue.stack(first, timeout=0.5)
    db.execute(
        "INSERT INTO brooq_periodic (name, last_tick, last_job) VALUES ('nightly', now(), %s)",
        (first,),
    )
    rows = db.execute(Q.periodic_list, {"names": ["nightly"]}).fetchall()
    assert [(r[0], r[2], r[3]) for r in rows] == [("nightly", first, "done")]


# -- counts ---------------------------------------------------------------------------------


def test_dead_is_counted_in_history_and_in_legacy_rows_and_done_never(
    queue: brooq.Queue, db: Conn, dsn: str
) -> None:
    for _ in range(2):
        _job(queue, db, "mail", "dead")
    _job(queue, db, "mail", "done")
    _job(queue, db, "mail", "canceled")
    _legacy(db, "mail", "dead")
    _legacy(db, "mail", "done")
    queue.enqueue(brooq.Job("mail"))  # ready
    _job(queue, db, "report", "dead", queue="reports")  # a queue holding only a dead job
    stats = {(s.queue, s.topic): s for s in queue.stats()}
    assert set(stats) == {("default", "mail"), ("reports", "report")}
    assert (stats["default", "mail"].dead, stats["default", "mail"].ready) == (3, 1)
    assert (stats["reports", "report"].dead, stats["reports", "report"].ready) == (1, 0)
    queues = {q.name: q for q in queue.queues()}
    assert (queues["default"].dead, queues["default"].ready, queues["reports"].dead) == (3, 1, 1)
    # The master's gauges read the same statement.
    gauges = db.cursor(row_factory=dict_row).execute(Q.job_stats_by_topic).fetchall()
    assert [(g["queue"], g["topic"], g["dead"], g["ready"]) for g in gauges] == [
        ("default", "mail", 3, 1),
        ("reports", "report", 1, 0),
    ]
    # The CLI: stats and queues.
    cli_stats = {(r["queue"], r["topic"]): r for r in as_json(dsn, "stats")["topics"]}
    assert cli_stats["default", "mail"]["dead"] == 3
    assert cli_stats["reports", "report"]["dead"] == 1
    assert {r["name"]: r["dead"] for r in as_json(dsn, "queues")} == {"default": 3, "reports": 1}
    # Throughput: jobs finished lately, in job_history and in job (the legacy rows were
    # written just now too).
    assert queue.throughput(60) == {"mail": 6, "report": 1}


# -- retry ----------------------------------------------------------------------------------


def _retried(db: Conn, job_id: uuid.UUID, before: dict[str, Any]) -> None:
    """The job is back in job only, pending, attempts reset, every other column kept."""
    assert _where(db, job_id) == ["job"]
    after = _row(db, job_id)
    assert (after["state"], after["attempts"], after["locked_by"], after["waited"]) == (
        "pending",
        0,
        None,
        None,
    )
    kept = {k: v for k, v in before.items() if k not in RESET}
    assert {k: v for k, v in after.items() if k not in RESET} == kept
    if before["idempotency_key"] is not None:
        owner = db.execute(
            "SELECT job_id FROM brooq_job_key WHERE topic = %s AND idempotency_key = %s",
            (before["topic"], before["idempotency_key"]),
        ).fetchone()
        assert owner == (job_id,)


def _retry_by_queue(queue: brooq.Queue, dsn: str, job_id: uuid.UUID) -> None:
    assert queue.retry(job_id) is True


def _retry_fresh(queue: brooq.Queue, dsn: str, job_id: uuid.UUID) -> None:
    assert queue.retry(job_id, fresh=True) is True


def _retry_on_my_connection(queue: brooq.Queue, dsn: str, job_id: uuid.UUID) -> None:
    with psycopg.connect(dsn) as conn:
        before = _where_on(conn, job_id)
        assert changes.retry(conn, job_id) is True
        conn.rollback()  # the caller's transaction held it: nothing moved
        assert _where_on(conn, job_id) == before
        conn.commit()
        assert changes.retry(conn, job_id) is True
        conn.commit()


def _where_on(conn: Conn, job_id: uuid.UUID) -> list[str]:
    with psycopg.connect(conn.info.dsn, autocommit=True) as other:
        return _where(other, job_id)


def _retry_by_cli(queue: brooq.Queue, dsn: str, job_id: uuid.UUID) -> None:
    assert ok(dsn, "retry", str(job_id)).strip() == f"retried {job_id}: pending now, attempts reset"


def _retry_in_bulk(queue: brooq.Queue, dsn: str, job_id: uuid.UUID) -> None:
    result = queue.retry_many(topic="mail", state="dead", tag="eu")
    assert (result.matched, result.changed) == (1, 1)


@pytest.mark.parametrize(
    "door",
    [_retry_by_queue, _retry_fresh, _retry_on_my_connection, _retry_by_cli, _retry_in_bulk],
    ids=["queue", "fresh", "connection", "cli", "bulk"],
)
def test_a_dead_job_in_history_is_retried_back_into_job_with_its_columns(
    queue: brooq.Queue, db: Conn, dsn: str, door: Callable[[brooq.Queue, str, uuid.UUID], None]
) -> None:
    job_id = _job(queue, db, "mail", "dead", tags=["eu"], idempotency_key="k-1")
    # Columns a plain job leaves empty, so that each is seen kept (or reset).
    db.execute(
        "UPDATE job_history SET lease_expiries = 2, result = '{\"partial\": 1}', "
        "group_key = 'g1', priority = 7, progress = 0.5, progress_message = 'half', "
        'logs = \'[{"attempt": 1, "at": "2030-01-01T00:00:00+00:00", "text": "x"}]\', '
        "traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', "
        "waited = true, unique_key = 'u-1' WHERE id = %s",
        (job_id,),
    )
    before = _row(db, job_id)
    assert before["state"] == "dead" and before["errors"] and before["started_at"]
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN brooq_job")
        door(queue, dsn, job_id)
        woken = [n.payload for n in listener.notifies(timeout=1.0, stop_after=1)]
    assert woken == ["public"]  # the masters are woken for the job table's schema
    _retried(db, job_id, before)
    # A legacy dead row (still in job) is retried in place, by the same doors' statement.
    legacy = _legacy(db, "mail", "dead", attempts=3, last_error="old", tags=["eu"])
    before = _row(db, legacy)
    door(queue, dsn, legacy)
    _retried(db, legacy, before)


def test_the_retry_statements_write_every_column_of_job_in_its_order(db: Conn) -> None:
    """job_retry and job_retry_batch insert the history row back by position: their
    select lists name job's columns in the table's order (a column added to job and
    left out here would come back empty)."""
    columns = [
        r[0]
        for r in db.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'job'::regclass "
            "AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        ).fetchall()
    ]
    for name in ("job_retry", "job_retry_batch"):
        text = getattr(Q, name)
        found = re.search(r"INSERT INTO job\s+SELECT(.*?)\s+FROM moved AS m", text, re.S)
        assert found is not None, name
        items = [item.strip() for item in found.group(1).split(",")]
        named = [re.split(r"\s+AS\s+|^m\.", item)[-1] for item in items]
        assert named == columns, name


def test_a_retry_refused_by_a_held_unique_key_leaves_the_job_in_history(
    queue: brooq.Queue, db: Conn, dsn: str
) -> None:
    first = _job(queue, db, "mail", "dead", unique_key="report-7")
    holder, created = queue.enqueue(brooq.Job("mail", unique_key="report-7"))
    assert created and holder != first
    assert queue.retry(first) is False
    for autocommit in (False, True):  # the caller's connection, idle: usable after
        with psycopg.connect(dsn, autocommit=autocommit) as conn:
            assert changes.retry(conn, first) is False
            assert conn.execute("SELECT 1").fetchone() == (1,)
        with psycopg.connect(dsn) as conn, conn.transaction():  # in its transaction
            conn.execute("SELECT 1")
            assert changes.retry(conn, first) is False
            assert conn.execute("SELECT 1").fetchone() == (1,)
    refusal = queue.explain_refusal(first, "retry")
    assert isinstance(refusal, InvalidTransition) and str(holder) in str(refusal)
    assert str(holder) in refused(dsn, "retry", str(first), code=1)
    result = queue.retry_many(topic="mail", state="dead")
    assert (result.matched, result.changed, result.taken) == (1, 0, ((first, holder),))
    assert _where(db, first) == ["job_history"] and _row(db, first)["state"] == "dead"
    assert queue.cancel(holder)
    assert queue.retry(first) is True  # the key is free again
    assert _where(db, first) == ["job"]


def test_a_bulk_retry_walks_history_and_legacy_rows_in_batches(
    queue: brooq.Queue, db: Conn, dsn: str
) -> None:
    moved = [_job(queue, db, "mail", "canceled") for _ in range(5)]
    # Legacy rows whose ids fall between and around the moved ones' (the keyset merges both).
    ids = sorted(moved)
    legacy = [_legacy_near(db, near) for near in (ids[0], ids[2], ids[4])]
    other = _job(queue, db, "mail", "canceled", queue="elsewhere")
    assert queue.retry_many(topic="mail", state="canceled", dry_run=True).matched == 9
    assert queue.retry_many(topic="mail", state="canceled", queue="default", dry_run=True) == (
        brooq.BulkResult(matched=8, changed=0)
    )
    result = queue.retry_many(topic="mail", state="canceled", queue="default", batch_size=2)
    assert (result.matched, result.changed) == (8, 8)
    for job_id in [*moved, *legacy]:
        assert _where(db, job_id) == ["job"] and _row(db, job_id)["state"] == "pending"
    assert _where(db, other) == ["job_history"]
    out = ok(dsn, "retry", "--topic", "mail", "--state", "canceled", "--yes")
    assert out.splitlines() == ["1 job matches (topic mail, state canceled)",
                                "retried 1 of 1: pending now, attempts reset"]  # fmt: skip
    assert _where(db, other) == ["job"]


def _legacy_near(db: Conn, near: uuid.UUID) -> uuid.UUID:
    """A legacy canceled row whose id sorts right after ``near``."""
    job_id = uuid.UUID(int=near.int + 1)
    db.execute("INSERT INTO job (id, topic, state) VALUES (%s, 'mail', 'canceled')", (job_id,))
    return job_id


# -- cancel racing an outcome ---------------------------------------------------------------


def _cancel_by_queue(queue: brooq.Queue, dsn: str, job_id: uuid.UUID) -> Any:
    return queue.cancel(job_id)


def _cancel_on_my_connection(queue: brooq.Queue, dsn: str, job_id: uuid.UUID) -> Any:
    with psycopg.connect(dsn) as conn:
        moved = brooq.cancel(conn, job_id)
        conn.commit()
        return moved


def _cancel_async(queue: brooq.Queue, dsn: str, job_id: uuid.UUID) -> Any:
    async def go() -> bool:
        q = brooq.Queue(dsn)
        try:
            return await q.cancel_async(job_id)
        finally:
            await q.close_async()

    return asyncio.run(go())


def _cancel_by_cli(queue: brooq.Queue, dsn: str, job_id: uuid.UUID) -> Any:
    return run("--database", dsn, "cancel", str(job_id))


OUTCOMES: dict[str, Callable[[Conn, uuid.UUID], None]] = {
    "claim-done": _done_by_claim,
    "done": lambda conn, job_id: _done(conn, job_id, {"sent": True}),
    "dead": _dead,
}


@pytest.mark.parametrize(
    ("door", "outcome"),
    [
        (_cancel_by_queue, "claim-done"),
        (_cancel_by_queue, "done"),
        (_cancel_by_queue, "dead"),
        (_cancel_on_my_connection, "done"),
        (_cancel_async, "done"),
        (_cancel_by_cli, "done"),
    ],
    ids=["queue-claim-done", "queue-done", "queue-dead", "connection", "async", "cli"],
)
def test_a_cancel_racing_an_outcome_reports_the_job_finished(
    queue: brooq.Queue,
    db: Conn,
    dsn: str,
    door: Callable[[brooq.Queue, str, uuid.UUID], Any],
    outcome: str,
) -> None:
    """The outcome's transaction holds the row; the cancel waits for it; the outcome
    commits (the row leaves job for job_history). The cancel writes nothing, raises
    nothing, and says the job is finished; the outcome's write is whole."""
    job_id, _ = queue.enqueue(brooq.Job("mail"))
    assert _claim(db, "mail") == job_id
    worker = psycopg.connect(dsn)  # a transaction: the outcome is not committed yet
    OUTCOMES[outcome](worker, job_id)
    answer: list[Any] = []
    canceler = threading.Thread(target=lambda: answer.append(door(queue, dsn, job_id)))
    canceler.start()
    deadline = time.monotonic() + 30
    while not db.execute(
        # The only session of this database that can wait for a lock: the cancel's.
        "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database()"
    ).fetchone():
        assert canceler.is_alive() and time.monotonic() < deadline, "the cancel never waited"
        time.sleep(0.01)
    worker.commit()
    worker.close()
    canceler.join(30)
    ended = "dead" if outcome == "dead" else "done"
    refusal = (
        f"error: cannot cancel job {job_id}: it is {ended}; "
        "only pending, failed, processing, waiting or on_hold jobs can be canceled"
    )
    if door is _cancel_by_cli:
        [out] = answer
        assert (out.returncode, out.stdout, out.stderr.strip()) == (1, "", refusal), out
    else:
        assert answer == [False]
        explained = queue.explain_refusal(job_id, "cancel")
        assert isinstance(explained, InvalidTransition) and f"error: {explained}" == refusal
    assert _where(db, job_id) == ["job_history"]
    row = _row(db, job_id)
    assert (row["state"], row["locked_by"]) == (ended, WORKER)
    if outcome == "done":
        assert row["result"] == {"sent": True}
    if outcome == "dead":
        assert row["last_error"] == "ValueError: kaput" and len(row["errors"]) == 1


def test_a_cancel_of_a_finished_job_is_refused_by_every_door(
    queue: brooq.Queue, db: Conn, dsn: str
) -> None:
    for end in ("done", "dead", "canceled"):
        job_id = _job(queue, db, "mail", end)
        before = _row(db, job_id)
        assert queue.cancel(job_id) is False
        assert _cancel_on_my_connection(queue, dsn, job_id) is False
        assert _cancel_async(queue, dsn, job_id) is False
        assert refused(dsn, "cancel", str(job_id), code=1).startswith(
            f"error: cannot cancel job {job_id}: it is {end};"
        )
        assert _row(db, job_id) == before  # untouched
