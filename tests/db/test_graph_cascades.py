"""Deep and wide graphs against a real PostgreSQL: the end of a job is carried down its
graph set by set (brooq_jobs_ended, migration 0016), never one trigger inside another
per row, so a chain of thousands of jobs fails, is canceled, or is created after a
failed job in one statement of the usual kind: the child's outcome, the reaper's pass,
the producer's enqueue.

The writes run with the children's planner settings (no sequential scans, no sorts,
generic plans), as a child's outcome would."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

import brooq
from brooq.sql import Q
from tests.db.test_unique import finish
from tests.db.test_workflows import claim, fail, state

Conn = psycopg.Connection[Any]


def as_child(db: Conn) -> None:
    """The planner settings of a child's connection (brooq.worker.connection)."""
    for name, value in (
        ("enable_seqscan", "off"),
        ("enable_bitmapscan", "off"),
        ("enable_sort", "off"),
        ("plan_cache_mode", "force_generic_plan"),
    ):
        db.execute("SELECT set_config(%s, %s, false)", (name, value))


def chain(queue: brooq.Queue, length: int, head: brooq.Job | None = None) -> list[uuid.UUID]:
    """A head job and ``length`` jobs, each after the one before; their ids in order."""
    jobs = [head or brooq.Job("t", {})]
    for i in range(length):
        jobs.append(brooq.Job("sink", {"i": i}, after=[jobs[-1]]))
    return [job_id for job_id, _ in queue.enqueue_many(jobs)]


def tree(queue: brooq.Queue, fanout: int, depth: int) -> tuple[uuid.UUID, int]:
    """A root job ("t") and its ``fanout``-ary tree of ``depth`` levels below it; the
    root's id and how many jobs wait under it."""
    root = brooq.Job("t", {})
    jobs, level = [root], [root]
    for _ in range(depth):
        level = [brooq.Job("sink", after=[up]) for up in level for _ in range(fanout)]
        jobs += level
    ids = [job_id for job_id, _ in queue.enqueue_many(jobs)]
    return ids[0], len(ids) - 1


def counts(db: Conn, topic: str = "sink") -> dict[str, int]:
    rows = db.execute("SELECT state, count(*) FROM job_all WHERE topic = %s GROUP BY 1", (topic,))
    return {str(s): int(n) for s, n in rows.fetchall()}


def test_a_failed_head_of_a_2000_chain_is_dead_and_the_chain_canceled(
    queue: brooq.Queue, db: Conn
) -> None:
    ids = chain(queue, 2000)
    assert counts(db) == {"waiting": 2000}
    as_child(db)
    assert claim(db, "t") == [ids[0]]
    assert fail(db, ids[0], final=True) == "dead"
    assert counts(db) == {"canceled": 2000}
    assert state(db, ids[1]) == ("canceled", 0, f"upstream job {ids[0]} ended dead")
    assert state(db, ids[-1]) == ("canceled", 0, f"upstream job {ids[-2]} ended canceled")
    # Each edge ended once; the upstream job each names is its own.
    assert db.execute("SELECT count(*) FROM brooq_job_edge WHERE NOT ended").fetchone() == (0,)
    failed_by = db.execute(
        "SELECT count(*) FROM job_all d JOIN brooq_job_edge e ON e.downstream_id = d.id "
        "WHERE d.upstream_failed = e.upstream_id"
    ).fetchone()
    assert failed_by == (2000,)


def test_a_chain_created_after_a_failed_job_is_canceled_whole(queue: brooq.Queue, db: Conn) -> None:
    dead_id, _ = queue.enqueue(brooq.Job("t"))
    claim(db, "t")
    assert fail(db, dead_id, final=True) == "dead"
    first, _ = queue.enqueue(brooq.Job("sink", after=[dead_id]))
    assert state(db, first) == ("canceled", 0, f"upstream job {dead_id} ended dead")
    # In the enqueue's own statement: the first is canceled, which cancels the rest.
    ids = chain(queue, 2000, head=brooq.Job("sink", after=[dead_id]))
    assert state(db, ids[0])[0] == "canceled"
    assert counts(db) == {"canceled": 2002}


def test_a_tree_of_3280_jobs_is_canceled_and_run_jobs_below_it_run(
    queue: brooq.Queue, db: Conn
) -> None:
    root, below = tree(queue, 3, 7)
    assert below == 3279
    leaves = db.execute(
        "SELECT id FROM job_all d WHERE topic = 'sink' AND has_downstream IS NULL LIMIT 2"
    ).fetchall()
    # A job that runs whatever its upstream jobs' ends, after two canceled leaves, and a
    # job that cancels, after the same leaves and a job still pending.
    other, _ = queue.enqueue(brooq.Job("other"))
    (runs, _), (strict, _) = queue.enqueue_many(
        [
            brooq.Job("final", after=[r[0] for r in leaves], on_upstream_failure="run"),
            brooq.Job("final", after=[*(r[0] for r in leaves), other]),
        ]
    )
    as_child(db)
    claim(db, "t")
    assert fail(db, root, final=True) == "dead"
    assert counts(db) == {"canceled": below}
    assert state(db, runs)[:2] == ("pending", 0)
    assert state(db, strict)[:2] == ("canceled", 1)
    assert counts(db, "other") == {"pending": 1}


def test_a_diamond_counts_each_edge_once(queue: brooq.Queue, db: Conn) -> None:
    """Two canceled jobs into one: canceled once, its counter down by both; a job done
    releases what waits on it alone, and only that (one level)."""
    top = brooq.Job("t")
    left, right = brooq.Job("sink", after=[top]), brooq.Job("sink", after=[top])
    bottom = brooq.Job("sink", after=[left, right])
    runs = brooq.Job("sink", after=[bottom, left], on_upstream_failure="run")
    ids = [i for i, _ in queue.enqueue_many([top, left, right, bottom, runs])]
    claim(db, "t")
    assert fail(db, ids[0], final=True) == "dead"
    assert [state(db, i)[:2] for i in ids[1:]] == [
        ("canceled", 0),
        ("canceled", 0),
        ("canceled", 0),
        ("pending", 0),
    ]
    a = brooq.Job("t")
    b = brooq.Job("sink", after=[a])
    c = brooq.Job("sink", after=[b])
    aid, bid, cid = (i for i, _ in queue.enqueue_many([a, b, c]))
    claim(db, "t")
    finish(db, [aid])
    assert state(db, bid)[:2] == ("pending", 0)
    assert state(db, cid)[:2] == ("waiting", 1)


def test_the_reaper_writes_dead_for_the_head_of_a_2000_chain(queue: brooq.Queue, db: Conn) -> None:
    ids = chain(queue, 2000)
    claim(db, "t")
    db.execute("UPDATE job SET locked_until = now() - interval '1 s' WHERE id = %s", (ids[0],))
    reaped = db.execute(Q.job_reap_expired, {"max_expiries": 1}).fetchall()
    assert [(r[0], r[2]) for r in reaped] == [(ids[0], "dead")]
    assert counts(db) == {"canceled": 2000}


def test_an_operator_cancel_of_a_whole_chain_in_one_statement(queue: brooq.Queue, db: Conn) -> None:
    """Every row of a 2000-chain ended by one statement: each row's trigger carries its
    own end, the rows the statement ended itself are left as they are."""
    ids = chain(queue, 2000)
    db.execute("UPDATE job SET state = 'canceled' WHERE topic = 'sink' AND state = 'waiting'")
    assert counts(db) == {"canceled": 2000}
    assert db.execute(
        "SELECT count(*) FROM brooq_job_edge WHERE NOT ended AND upstream_id <> %s", (ids[0],)
    ).fetchone() == (0,)


@pytest.mark.slow
def test_a_100000_chain_and_a_30000_tree_are_canceled(queue: brooq.Queue, db: Conn) -> None:
    ids = chain(queue, 100_000)
    as_child(db)
    claim(db, "t")
    assert fail(db, ids[0], final=True) == "dead"
    assert counts(db) == {"canceled": 100_000}
    db.execute("DELETE FROM job")
    db.execute("DELETE FROM job_history")  # the chain's canceled jobs
    db.execute("DELETE FROM brooq_job_edge")
    root, below = tree(queue, 3, 9)  # 29,524 jobs below the root
    claim(db, "t")
    assert fail(db, root, final=True) == "dead"
    assert counts(db) == {"canceled": below}


def test_flat_cascades_up_and_down(empty_dsn: str) -> None:
    """0016 replaces the trigger's function and adds brooq_jobs_ended; down gives back
    exactly 0015's functions (the nested cascade), up again the same as the first time."""
    from brooq import migrate

    def functions() -> dict[str, str]:
        with psycopg.connect(empty_dsn) as conn:
            rows = conn.execute(
                "SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p "
                "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'"
            ).fetchall()
        return {str(name): str(text) for name, text in rows}

    migrate.up(empty_dsn, 15)
    before = functions()
    assert [m.name for m in migrate.up(empty_dsn, 16)] == ["flat_cascades"]
    after = functions()
    assert sorted(set(after) - set(before)) == ["brooq_jobs_ended"]
    assert after["brooq_job_upstream_ended"] != before["brooq_job_upstream_ended"]
    assert [m.name for m in migrate.down(empty_dsn)] == ["flat_cascades"]
    assert functions() == before
    migrate.up(empty_dsn, 16)
    assert functions() == after


def test_graph_after_up_and_down(empty_dsn: str) -> None:
    """0030 replaces brooq_job_after alone; down gives back exactly 0020's, up again the
    same as the first time, and a graph enqueued on either counts its edges alike."""
    from brooq import migrate

    def after() -> str:
        with psycopg.connect(empty_dsn) as conn:
            row = conn.execute("SELECT pg_get_functiondef('brooq_job_after'::regproc)").fetchone()
        assert row is not None
        return str(row[0])

    migrate.up(empty_dsn, 29)
    before = after()
    assert [m.name for m in migrate.up(empty_dsn, 30)] == ["graph_after"]
    now = after()
    assert now != before and "LATERAL" in before and "LATERAL" not in now
    assert [m.name for m in migrate.down(empty_dsn)] == ["graph_after"]
    assert after() == before
    migrate.up(empty_dsn, 30)
    assert after() == now
    q = brooq.Queue(empty_dsn)
    try:
        ids = chain(q, 3)
        with psycopg.connect(empty_dsn) as conn:
            rows = conn.execute(
                "SELECT id, state, upstream_open FROM job WHERE id = ANY(%s)", (ids,)
            ).fetchall()
    finally:
        q.close()
    by_id = {r[0]: (r[1], r[2]) for r in rows}
    assert [by_id[i] for i in ids] == [("pending", None)] + [("waiting", 1)] * 3


def test_graph_counts_up_and_down(empty_dsn: str) -> None:
    """0031 replaces brooq_job_after alone (the counts joined to the call's rows with no
    condition on job); down gives back exactly 0030's, up again the same as the first
    time, and a graph enqueued on either is written alike: waiting with its count,
    canceled with its reason, or pending."""
    from brooq import migrate

    def after() -> str:
        with psycopg.connect(empty_dsn) as conn:
            row = conn.execute("SELECT pg_get_functiondef('brooq_job_after'::regproc)").fetchone()
        assert row is not None
        return str(row[0])

    def graph() -> list[tuple[object, ...]]:
        """A dead job, a done one and a pending one, and jobs after them in each way."""
        q = brooq.Queue(empty_dsn)
        try:
            with psycopg.connect(empty_dsn, autocommit=True) as conn:
                for table in ("job", "job_history", "brooq_job_edge"):
                    conn.execute(f"DELETE FROM {table}")
                dead, done, open_ = (q.enqueue(brooq.Job("t", {"n": n}))[0] for n in range(3))
                conn.execute("UPDATE job SET state = 'dead' WHERE id = %s", (dead,))
                conn.execute("UPDATE job SET state = 'done' WHERE id = %s", (done,))
                jobs = [
                    brooq.Job("sink", {"k": "open"}, after=[open_, done]),
                    brooq.Job("sink", {"k": "done"}, after=[done]),
                    brooq.Job("sink", {"k": "dead"}, after=[done, dead]),
                    brooq.Job("sink", {"k": "run"}, after=[dead], on_upstream_failure="run"),
                ]
                jobs.append(brooq.Job("sink", {"k": "chained"}, after=[jobs[0]]))
                q.enqueue_many(jobs)
                rows = conn.execute(
                    "SELECT payload->>'k', state, upstream_open, upstream_failed = %s, "
                    "on_upstream_failure, last_error IS NOT NULL FROM job_all "
                    "WHERE topic = 'sink' ORDER BY 1",
                    (dead,),
                ).fetchall()
        finally:
            q.close()
        return rows

    migrate.up(empty_dsn, 30)
    before = after()
    on_0030 = graph()
    assert [m.name for m in migrate.up(empty_dsn, 31)] == ["graph_counts"]
    now = after()
    assert now != before and "AS MATERIALIZED" in now and "AS MATERIALIZED" not in before
    # Never compiled by JIT: in a child's session (no sorts) every plan costs 1e10.
    assert "SET jit TO 'off'" in now and "jit" not in before
    assert graph() == on_0030
    assert [m.name for m in migrate.down(empty_dsn)] == ["graph_counts"]
    assert after() == before
    migrate.up(empty_dsn, 31)
    assert after() == now
    assert on_0030 == [
        ("chained", "waiting", 1, None, "cancel", False),
        ("dead", "canceled", 0, True, "cancel", True),
        ("done", "pending", 0, None, "cancel", False),
        ("open", "waiting", 1, None, "cancel", False),
        ("run", "pending", 0, True, "run", False),
    ]


def test_the_edges_statement_names_an_upstream_id_that_is_no_job(
    queue: brooq.Queue, db: Conn
) -> None:
    """brooq_job_after itself (the producer checks the ids first; this is the check that
    holds when a job went between the two): an id named twice is counted once, a missing
    one is named, and nothing of the call is left."""
    up = queue.enqueue(brooq.Job("t"))[0]
    downs = [queue.enqueue(brooq.Job("sink", {"i": i}, held=True))[0] for i in range(2)]
    missing = uuid.UUID(int=7)
    as_child(db)

    def after(ups: list[uuid.UUID]) -> Any:
        return db.execute(
            "SELECT brooq_job_after(%s::uuid[], %s::text[], %s::uuid[], %s::uuid[])",
            (downs, ["cancel", "cancel"], downs, ups),
        ).fetchone()

    refused = pytest.raises(psycopg.errors.ForeignKeyViolation, match=f"job {missing}")
    with refused, db.transaction():
        after([up, missing])
    assert db.execute("SELECT count(*) FROM brooq_job_edge").fetchone() == (0,)
    with db.transaction():
        # The same upstream job for both: one id, named twice.
        assert after([up, up]) == (0,)  # on hold: neither was pending, so none waits
    assert db.execute("SELECT count(*) FROM brooq_job_edge").fetchone() == (2,)
    assert {state(db, d)[0] for d in downs} == {"on_hold"}  # left as they were
