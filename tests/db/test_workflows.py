"""Workflows against a real PostgreSQL: jobs created with after=[...] wait, and the
transaction that writes the last upstream outcome releases them (or cancels them, down
the graph), exactly once, through the real statements of the child (the batched done,
failed, canceled), the master (the reaper, retention) and the operator (cancel, retry),
racing writers and backends killed mid-transaction.

The transitions run on connections of the test's own, with brooq/sql's statements."""

from __future__ import annotations

import asyncio
import random
import threading
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import brooq
from brooq.page import reads as page_reads
from brooq.sql import Q
from brooq.testing import drain
from tests.db.test_cli import as_json, ok, refused
from tests.db.test_page import get, text
from tests.db.test_unique import finish
from tests.harness import terminate_backend, wait_for

Conn = psycopg.Connection[Any]


def claim(db: Conn, topic: str, limit: int = 100, worker: str = "w") -> list[uuid.UUID]:
    """The child's claim round trip: ready jobs of ``topic`` become ``worker``'s."""
    rows = db.execute(
        Q.job_finish_and_claim,
        {
            "done": [],
            "worker": worker,
            "queue": "default",
            "topics": [topic],
            "limit": limit,
            "children": 1,
            "lease": 30.0,
        },
    ).fetchall()
    return [row[1] for row in rows if row[0]]


def fail(db: Conn, job_id: uuid.UUID, *, final: bool, worker: str = "w") -> str:
    row = db.execute(
        Q.job_set_failed,
        {
            "id": job_id,
            "worker": worker,
            "refund": False,
            "max_attempts": 0 if final else 5,
            "delay": 0.0,
            "error": "boom",
            "history_error": "boom",
            "kind": "raised",
            "traceback": None,
        },
    ).fetchone()
    assert row is not None
    return str(row[0])


def state(db: Conn, job_id: uuid.UUID) -> tuple[str, int | None, str | None]:
    row = db.execute(
        "SELECT state, upstream_open, last_error FROM job_all WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def run_all(db: Conn, topic: str) -> list[uuid.UUID]:
    """Claim every ready job of ``topic`` and write done for them."""
    ids = claim(db, topic)
    finish(db, ids)
    return ids


def test_a_graph_is_created_in_one_call_and_waits(queue: brooq.Queue, db: Conn) -> None:
    fetch = [brooq.Job("fetch", n) for n in range(3)]
    merge = brooq.Job("merge", after=fetch)
    report = brooq.Job("report", after=[merge, fetch[0]], on_upstream_failure="run")
    ids = [i for i, created in queue.enqueue_many([*fetch, merge, report]) if created]
    assert len(ids) == 5
    assert [state(db, i)[:2] for i in ids] == [
        ("pending", None),
        ("pending", None),
        ("pending", None),
        ("waiting", 3),
        ("waiting", 2),
    ]
    # The order named is kept; the flags mark the rows that have downstream jobs.
    edges = db.execute(
        "SELECT downstream_id, position, upstream_id FROM brooq_job_edge "
        "ORDER BY downstream_id, position"
    ).fetchall()
    assert edges == [
        (ids[3], 1, ids[0]),
        (ids[3], 2, ids[1]),
        (ids[3], 3, ids[2]),
        (ids[4], 1, ids[3]),
        (ids[4], 2, ids[0]),
    ]
    flagged = db.execute("SELECT id FROM job_all WHERE has_downstream ORDER BY id").fetchall()
    assert [r[0] for r in flagged] == sorted(ids[:4])
    # No claim reaches a waiting job.
    assert claim(db, "merge") == [] and claim(db, "report") == []
    # Ids of existing jobs, in a later call, one job at a time (Queue.enqueue).
    later, created = queue.enqueue(brooq.Job("late", after=[ids[4], str(ids[0])]))
    assert created and state(db, later)[:2] == ("waiting", 2)


def test_names_that_are_no_job_are_refused_with_nothing_written(
    queue: brooq.Queue, db: Conn
) -> None:
    stranger = brooq.Job("fetch")
    with pytest.raises(brooq.InvalidAfter, match=r"job 1: after names a Job \('fetch'\)"):
        queue.enqueue_many([brooq.Job("a"), brooq.Job("merge", after=[stranger])])
    missing = uuid.uuid4()
    with pytest.raises(brooq.InvalidAfter, match=f"after names job {missing}, which does not"):
        queue.enqueue_many([brooq.Job("a"), brooq.Job("merge", after=[missing])])
    with pytest.raises(brooq.InvalidAfter, match=f"after names job {missing}"):
        queue.enqueue(brooq.Job("merge", after=[missing]))
    assert db.execute("SELECT count(*) FROM job_all").fetchone() == (0,)
    for bad, words in (
        ([], "after is empty"),
        ("abc", "after must be a list"),
        ([42], "after names a int"),
        (["nope"], "after names 'nope', which is not a job id"),
    ):
        with pytest.raises(brooq.InvalidAfter, match=words):
            brooq.Job("x", after=bad)
    with pytest.raises(brooq.InvalidAfter, match="on_upstream_failure must be"):
        brooq.Job("x", after=[missing], on_upstream_failure="skip")  # type: ignore[arg-type]
    with pytest.raises(brooq.InvalidAfter, match="without after"):
        brooq.Job("x", on_upstream_failure="run")
    with pytest.raises(brooq.InvalidAfter, match="cannot be combined with unique_key"):
        queue.enqueue(brooq.Job("x", after=[missing], unique_key="k"))


def test_the_last_upstream_done_releases_in_its_own_transaction(
    queue: brooq.Queue, db: Conn
) -> None:
    ups = [brooq.Job("t", n) for n in range(3)]
    down = brooq.Job("merge", after=ups)
    ids = [i for i, _ in queue.enqueue_many([*ups, down])]
    claimed = claim(db, "t")
    assert sorted(claimed) == sorted(ids[:3])
    finish(db, claimed[:2])
    assert state(db, ids[3])[:2] == ("waiting", 1)
    with psycopg.connect(db.info.dsn) as writer:  # a transaction of its own
        writer.execute("BEGIN")
        finish(writer, claimed[2:])
        assert state(writer, ids[3])[:2] == ("pending", 0)
        assert state(db, ids[3])[:2] == ("waiting", 1)  # not before the commit
        writer.commit()
    assert state(db, ids[3])[:2] == ("pending", 0)
    assert claim(db, "merge") == [ids[3]]


def test_a_failed_upstream_cancels_down_the_graph_and_run_jobs_run(
    queue: brooq.Queue, db: Conn
) -> None:
    a, b = brooq.Job("t", 1), brooq.Job("t", 2)
    mid = brooq.Job("mid", after=[a, b])
    leaf = brooq.Job("leaf", after=[mid])
    callback = brooq.Job("callback", after=[a, b, mid], on_upstream_failure="run")
    ids = [i for i, _ in queue.enqueue_many([a, b, mid, leaf, callback])]
    claimed = claim(db, "t")
    # A failed attempt with attempts left ends nothing.
    assert fail(db, ids[0], final=False) == "failed"
    assert state(db, ids[2])[:2] == ("waiting", 2)
    claim(db, "t")
    assert fail(db, ids[0], final=True) == "dead"
    words = f"upstream job {ids[0]} ended dead"
    assert state(db, ids[2]) == ("canceled", 1, words)
    assert state(db, ids[3]) == ("canceled", 0, f"upstream job {ids[2]} ended canceled")
    # The "run" job still waits for b, then runs whatever the ends.
    assert state(db, ids[4])[:2] == ("waiting", 1)
    finish(db, [c for c in claimed if c == ids[1]])
    assert state(db, ids[4])[:2] == ("pending", 0)


def test_an_operator_cancel_and_retry_count_once(queue: brooq.Queue, db: Conn) -> None:
    """Canceling an upstream job cancels what waits on it; a retried upstream job that
    ends again counts nothing a second time (its edges are ended once)."""
    up1, up2 = brooq.Job("t", 1), brooq.Job("t", 2)
    waits = brooq.Job("merge", after=[up1, up2], on_upstream_failure="run")
    strict = brooq.Job("strict", after=[up2])
    ids = [i for i, _ in queue.enqueue_many([up1, up2, waits, strict])]
    assert queue.cancel(ids[1]) is True
    assert state(db, ids[3]) == ("canceled", 0, f"upstream job {ids[1]} ended canceled")
    assert state(db, ids[2])[:2] == ("waiting", 1)
    queue.retry(ids[1])
    claimed = claim(db, "t")
    finish(db, [ids[1]])  # ends again: nothing more counted
    assert state(db, ids[2])[:2] == ("waiting", 1)
    finish(db, [c for c in claimed if c == ids[0]])
    assert state(db, ids[2])[:2] == ("pending", 0)
    # A waiting job can be canceled by the operator; its own downstream jobs follow.
    x = brooq.Job("t")
    y = brooq.Job("y", after=[x])
    z = brooq.Job("z", after=[y])
    xid, yid, zid = (i for i, _ in queue.enqueue_many([x, y, z]))
    assert queue.cancel(yid) is True
    assert state(db, zid) == ("canceled", 0, f"upstream job {yid} ended canceled")
    assert state(db, xid)[0] == "pending"


def test_after_names_jobs_that_already_ended(queue: brooq.Queue, db: Conn) -> None:
    (done_id, _), (dead_id, _) = queue.enqueue_many([brooq.Job("t"), brooq.Job("t")])
    claim(db, "t")
    finish(db, [done_id])
    fail(db, dead_id, final=True)
    ready, _ = queue.enqueue(brooq.Job("r", after=[done_id]))
    assert state(db, ready)[:2] == ("pending", 0)
    gone, _ = queue.enqueue(brooq.Job("g", after=[done_id, dead_id]))
    assert state(db, gone) == ("canceled", 0, f"upstream job {dead_id} ended dead")
    ran, _ = queue.enqueue(brooq.Job("g", after=[dead_id], on_upstream_failure="run"))
    assert state(db, ran)[:2] == ("pending", 0)
    # A waiting job that names a waiting one (a later call builds on a graph).
    w1, _ = queue.enqueue(brooq.Job("w", after=[queue.enqueue(brooq.Job("t"))[0]]))
    w2, _ = queue.enqueue(brooq.Job("w", after=[w1]))
    assert state(db, w2)[:2] == ("waiting", 1)


def test_the_reaper_dead_end_cancels_downstream(queue: brooq.Queue, db: Conn) -> None:
    up, _ = queue.enqueue(brooq.Job("t"))
    down, _ = queue.enqueue(brooq.Job("d", after=[up]))
    claim(db, "t")
    db.execute("UPDATE job SET locked_until = now() - interval '1 s', lease_expiries = 4")
    reaped = db.execute(Q.job_reap_expired, {"max_expiries": 5}).fetchall()
    assert [(r[0], r[2]) for r in reaped] == [(up, "dead")]
    assert state(db, down)[0] == "canceled"


def test_concurrent_last_upstream_jobs_release_exactly_once(queue: brooq.Queue, db: Conn) -> None:
    """Many upstream jobs of several shared downstream jobs, each done in a transaction
    of its own on 4 racing connections: every downstream job ends pending, its counter 0,
    and nobody deadlocks (the downstream rows are locked in id order)."""
    ups = [brooq.Job("t", n) for n in range(40)]
    downs = [brooq.Job("d", n, after=random.sample(ups, 20)) for n in range(6)]
    ids = [i for i, _ in queue.enqueue_many([*ups, *downs])]
    claimed = claim(db, "t")
    assert len(claimed) == 40
    errors: list[BaseException] = []

    def work(part: list[uuid.UUID]) -> None:
        try:
            with psycopg.connect(db.info.dsn, autocommit=True) as conn:
                for job_id in part:
                    finish(conn, [job_id])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(claimed[n::4],)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [state(db, d)[:2] for d in ids[40:]] == [("pending", 0)] * 6
    assert db.execute("SELECT count(*) FROM brooq_job_edge WHERE NOT ended").fetchone() == (0,)


@pytest.mark.parametrize(
    "rounds", [pytest.param(50, id="50"), pytest.param(500, id="500", marks=pytest.mark.slow)]
)
def test_a_backend_killed_writing_the_last_outcome_loses_and_doubles_nothing(
    queue: brooq.Queue, db: Conn, rounds: int
) -> None:
    """The transaction writing the last upstream outcome is cut by the end of its backend
    (what a SIGKILLed child leaves) at three points in turn: before its done, after it
    (the release written, not committed) or after the commit. In every round the
    downstream job is released once and only with its upstream done: waiting with a
    count of 1 while the upstream is not done, pending with 0 once it is, never 0 twice."""
    with psycopg.connect(db.info.dsn, autocommit=True) as admin:
        for n in range(rounds):
            ups = [brooq.Job("t", n), brooq.Job("t", n)]
            down = brooq.Job("d", after=ups)
            up1, up2, down_id = (i for i, _ in queue.enqueue_many([*ups, down]))
            claim(db, "t")
            finish(db, [up1])
            writer = psycopg.connect(db.info.dsn)
            pid = writer.info.backend_pid
            writer.execute("BEGIN")
            point = n % 3
            if point >= 1:
                finish(writer, [up2])
            if point == 2:
                writer.commit()
            terminate_backend(admin, pid)
            with pytest.raises(psycopg.OperationalError):
                writer.execute("SELECT 1")
            writer.close()
            up_state = state(db, up2)[0]
            if point == 2:
                assert up_state == "done" and state(db, down_id)[:2] == ("pending", 0)
            else:
                assert up_state == "processing"
                assert state(db, down_id)[:2] == ("waiting", 1)
                finish(db, [up2])  # the job is written again (its holder's next pass)
            assert state(db, down_id)[:2] == ("pending", 0)
            finish(db, [up2])  # a second write of the same outcome changes nothing
            assert state(db, down_id)[:2] == ("pending", 0)
            assert claim(db, "d") == [down_id]
            finish(db, [down_id])
    ended = db.execute("SELECT count(*) FROM brooq_job_edge WHERE ended").fetchone()
    assert ended == (2 * rounds,)


def test_retention_keeps_what_a_waiting_job_needs_and_deletes_the_edges(
    queue: brooq.Queue, db: Conn
) -> None:
    ups = [brooq.Job("t", n) for n in range(3)]
    down = brooq.Job("d", after=ups)
    plain = brooq.Job("t")
    ids = [i for i, _ in queue.enqueue_many([*ups, down, plain])]
    claimed = claim(db, "t")
    finish(db, [i for i in claimed if i != ids[2]])
    # Finished jobs are in job_history (its default partition: no partition made here),
    # ended a day ago.
    db.execute("UPDATE job_history SET updated_at = now() - interval '1 day'")

    def expire() -> list[str]:
        rows = db.execute(Q.history_expire_default, {"ttl": 3600.0, "batch": 100}).fetchall()
        return [r[0] for r in rows]

    assert expire() == ["t"]  # the plain job; the upstream jobs are still needed
    finish(db, [ids[2]])
    claim(db, "d")
    finish(db, [ids[3]])
    db.execute("UPDATE job_history SET updated_at = now() - interval '1 day'")
    assert sorted(expire()) == ["d", "t", "t", "t"]
    assert db.execute("SELECT count(*) FROM brooq_job_edge").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM job_all").fetchone() == (0,)


def test_stats_and_cancel_many_know_the_waiting_state(queue: brooq.Queue, db: Conn) -> None:
    up, _ = queue.enqueue(brooq.Job("t"))
    for _ in range(3):
        queue.enqueue(brooq.Job("d", after=[up]))
    cur = db.cursor(row_factory=dict_row)
    assert cur.execute("SELECT count(*) AS n FROM job_all WHERE state = 'waiting'").fetchone() == {
        "n": 3
    }
    changed = queue.cancel_many(topic="d", state="waiting")
    assert changed.changed == 3


def test_drain_runs_a_graph_and_claim_upstream_reads_it(queue: brooq.Queue, db: Conn) -> None:
    seen: dict[str, list[brooq.UpstreamJob]] = {}
    order: list[str] = []

    @queue.handler("fetch")
    def fetch(claim: brooq.Claim) -> Any:
        order.append(f"fetch {claim.payload}")
        assert claim.upstream == []
        return {"page": claim.payload}

    @queue.handler("bind")
    def bind(claim: brooq.Claim) -> Any:
        order.append("bind")
        seen["bind"] = claim.upstream
        return len(claim.upstream)

    pages = [brooq.Job("fetch", n) for n in (2, 0, 1)]
    (bind_id, _) = queue.enqueue_many([*pages, brooq.Job("bind", after=pages)])[-1]
    assert drain(queue) == {"done": 4}
    assert order == ["fetch 2", "fetch 0", "fetch 1", "bind"]
    assert [(u.topic, u.state, u.result) for u in seen["bind"]] == [
        ("fetch", "done", {"page": 2}),
        ("fetch", "done", {"page": 0}),
        ("fetch", "done", {"page": 1}),
    ]
    assert queue.upstream(bind_id) == seen["bind"]
    assert [d.id for d in queue.downstream(seen["bind"][0].id)] == [bind_id]
    assert state(db, bind_id)[0] == "done"


def test_jobs_show_and_the_page_list_the_graph(queue: brooq.Queue, db: Conn, dsn: str) -> None:
    ups = [brooq.Job("t", 1), brooq.Job("t", 2)]
    ids = [i for i, _ in queue.enqueue_many([*ups, brooq.Job("merge", after=ups)])]
    shown = ok(dsn, "jobs", "show", str(ids[2]))
    assert f"upstream:\n  {ids[0]}  pending    t\n  {ids[1]}  pending    t\n" in shown
    assert "downstream" not in shown
    assert f"downstream:\n  {ids[2]}  waiting    merge\n" in ok(dsn, "jobs", "show", str(ids[0]))
    record = as_json(dsn, "jobs", "show", str(ids[2]))
    assert record["state"] == "waiting"
    assert [u["id"] for u in record["upstream"]] == [str(ids[0]), str(ids[1])]
    plain, _ = queue.enqueue(brooq.Job("t"))
    assert "upstream" not in as_json(dsn, "jobs", "show", str(plain))
    # The status page: the job page lists both sides, the overview counts the waiting.
    body = text(get(db, f"/jobs/{ids[2]}"))
    assert "Waits for (upstream) (2)" in body and f"/jobs/{ids[0]}" in body
    body = text(get(db, f"/jobs/{ids[1]}"))
    assert "Waited for by (1)" in body and "waiting" in body
    by_topic = {g["topic"]: g for g in page_reads.overview(db)["groups"]}
    assert by_topic["merge"]["waiting"] == 1
    # brooq stats.
    stats = {t["topic"]: t for t in as_json(dsn, "stats")["topics"]}
    assert stats["merge"]["waiting"] == 1 and stats["t"]["waiting"] == 0


def test_an_async_producer_creates_a_graph(queue: brooq.Queue, db: Conn) -> None:
    async def produce() -> list[uuid.UUID]:
        up = brooq.Job("t")
        pairs = await queue.enqueue_many_async([up, brooq.Job("d", after=[up])])
        return [i for i, _ in pairs]

    up_id, down_id = asyncio.run(produce())
    assert state(db, down_id)[:2] == ("waiting", 1)
    assert [u.id for u in queue.upstream(down_id)] == [up_id]
    queue.close()


def test_brooq_enqueue_after(queue: brooq.Queue, db: Conn, dsn: str) -> None:
    up, _ = queue.enqueue(brooq.Job("t"))
    out = ok(dsn, "enqueue", "d", "--after", str(up), "--on-upstream-failure", "run")
    down = uuid.UUID(out.split()[1])
    assert state(db, down)[:2] == ("waiting", 1)
    row = db.execute("SELECT on_upstream_failure FROM job_all WHERE id = %s", (down,)).fetchone()
    assert row == ("run",)
    missing = uuid.UUID(int=5)
    line = refused(dsn, "enqueue", "d", "--after", str(missing), code=2)
    assert f"after names job {missing}, which does not exist" in line and "--after" in line
    line = refused(dsn, "enqueue", "d", "--after", "nope", code=2)
    assert "after names 'nope', which is not a job id" in line
    assert db.execute("SELECT count(*) FROM job_all").fetchone() == (2,)


def test_queue_wait_sees_a_waiting_job_end_down_the_graph(queue: brooq.Queue) -> None:
    up, _ = queue.enqueue(brooq.Job("t"))
    down, _ = queue.enqueue(brooq.Job("d", after=[up]))
    seen: list[brooq.JobRecord] = []
    waiter = threading.Thread(target=lambda: seen.append(queue.wait(down, timeout=30)))
    waiter.start()
    with psycopg.connect(queue.dsn, autocommit=True) as conn:
        # Registered first (the flag set), so the cancel cannot fall before the LISTEN.
        wait_for(
            lambda: (
                conn.execute("SELECT waited FROM job_all WHERE id = %s", (down,)).fetchone()
                == (True,)
            ),
            what="the waiter registered",
        )
    assert queue.cancel(up) is True
    waiter.join(30)
    assert [(r.id, r.state) for r in seen] == [(down, "canceled")]


def test_an_idempotency_key_names_the_existing_job(queue: brooq.Queue, db: Conn) -> None:
    """A Job of the batch that already exists (its idempotency key) is waited for as that
    job; a downstream job that already exists keeps its own edges (none written)."""
    first, _ = queue.enqueue(brooq.Job("t", idempotency_key="import-1"))
    claim(db, "t")
    again, other = brooq.Job("t", idempotency_key="import-1"), brooq.Job("t")
    report = brooq.Job("r", after=[again, other], idempotency_key="report-1")
    (got, created), (other_id, _), (report_id, _) = queue.enqueue_many([again, other, report])
    assert (got, created) == (first, False)
    assert [u.id for u in queue.upstream(report_id)] == [first, other_id]
    assert state(db, report_id)[:2] == ("waiting", 2)
    repeat = brooq.Job("r", after=[brooq.Job("t")], idempotency_key="report-1")
    (_, _), (same, created) = queue.enqueue_many([*repeat.after, repeat])
    assert (same, created) == (report_id, False)
    assert state(db, report_id)[:2] == ("waiting", 2)  # unchanged
    finish(db, [first])
    assert state(db, report_id)[:2] == ("waiting", 1)


def test_a_deadlock_between_two_outcomes_loses_and_doubles_nothing(
    queue: brooq.Queue, db: Conn
) -> None:
    """Two transactions each ending two upstream jobs of the same two downstream jobs, in
    opposite orders (as two children's batched `done` may): PostgreSQL aborts one; the
    other commits; the aborted one's jobs are still processing, and their outcomes
    written again count once."""
    a, b, c, d = (brooq.Job("t", n) for n in range(4))
    d1 = brooq.Job("d", 1, after=[a, d])
    d2 = brooq.Job("d", 2, after=[b, c])
    ids = [i for i, _ in queue.enqueue_many([a, b, c, d, d1, d2])]
    claim(db, "t")
    one = psycopg.connect(db.info.dsn)
    two = psycopg.connect(db.info.dsn)
    try:
        finish(one, [ids[0]])  # locks d1
        finish(two, [ids[2]])  # locks d2
        failed: list[BaseException] = []

        def second_half(conn: Conn, job_id: uuid.UUID) -> None:
            try:
                finish(conn, [job_id])
                conn.commit()
            except psycopg.errors.DeadlockDetected as exc:
                failed.append(exc)
                conn.rollback()

        t1 = threading.Thread(target=second_half, args=(one, ids[1]))  # wants d2
        t1.start()
        wait_for(
            lambda: (
                db.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                ).fetchone()
                == (1,)
            ),
            what="the first transaction waiting",
        )
        second_half(two, ids[3])  # wants d1: one of the two is aborted
        t1.join(30)
        assert len(failed) == 1
    finally:
        one.close()
        two.close()
    rows = db.execute(
        "SELECT id, state FROM job_all WHERE topic = 't' AND state = 'processing'"
    ).fetchall()
    assert len(rows) == 2  # the aborted transaction's two jobs
    finish(db, [r[0] for r in rows])  # written again, as the child's next pass does
    assert [state(db, i)[:2] for i in ids[4:]] == [("pending", 0), ("pending", 0)]
