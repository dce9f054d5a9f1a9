"""The claim and the outcome writes while another session holds a snapshot open: no
VACUUM can remove the entries claimed jobs leave in the indexes, so what a statement
walks past is what it pays. The plans are the generic ones the children run (PREPARE,
force_generic_plan, neither bitmap nor sequential scans), read with EXPLAIN."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from brooq.schema.plans import CHILD_OPTIONS, prepare
from brooq.sql import Q
from brooq.worker.floors import SLACK, Floors

Conn = psycopg.Connection[Any]


@pytest.fixture
def db(connect: Callable[..., Conn]) -> Conn:
    """An autocommit connection for setting up and checking (dict rows)."""
    return connect()


@pytest.fixture
def child(dsn: str) -> Iterator[Conn]:
    """A connection with a child's planner settings."""
    with psycopg.connect(dsn, autocommit=True, options=CHILD_OPTIONS) as conn:
        yield conn


def prepare_as_child(conn: Conn, statement: str) -> tuple[str, list[str]]:
    """``statement`` PREPAREd with the child's types: its name and its parameters."""
    name = f"p_{uuid.uuid4().hex[:8]}"
    return name, prepare(conn, name, statement)


def explain_prepared(
    conn: Conn, prepared: tuple[str, list[str]], values: dict[str, Any], analyze: bool = False
) -> str:
    """EXPLAIN of a prepared statement's generic plan, run and rolled back when
    ``analyze``."""
    name, names = prepared
    args = sql.SQL(", ").join(sql.Literal(values[n]) for n in names)
    options = "ANALYZE, BUFFERS" if analyze else "COSTS OFF"
    with conn.transaction(force_rollback=True):
        rows = conn.execute(
            sql.SQL("EXPLAIN ({}) EXECUTE {}({})").format(
                sql.SQL(options),
                sql.Identifier(name),
                args,
            )
        ).fetchall()
    return "\n".join(str(r[0]) for r in rows)


def explain(conn: Conn, statement: str, values: dict[str, Any], analyze: bool = False) -> str:
    """EXPLAIN of ``statement``'s generic plan (PREPAREd with the child's types), run and
    rolled back when ``analyze``."""
    return explain_prepared(conn, prepare_as_child(conn, statement), values, analyze)


def claim_values(limit: int = 1) -> dict[str, Any]:
    """The one-queue claim's values: the plain statement, reading the index whole."""
    return {
        "done": [],
        "topics": ["t"],
        "limit": limit,
        "children": 2,
        "worker": "w1",
        "lease": 30.0,
        "queue": "default",
    }


def floored_values(floor: datetime, limit: int = 1) -> dict[str, Any]:
    """The floored claim's values for queue default with jobs of priority 0 seen: its
    ranges as brooq.worker.floors makes them, the priority's floor at ``floor`` (a claim
    that started SLACK after it returned a job from after it)."""
    floors = Floors()
    floors.end([("default", 0, floor + SLACK, uuid.uuid4())], floor + SLACK, 0.0, 0.0)
    ranges = floors.ranges("default")
    return {
        **claim_values(limit),
        "queues": [r[0] for r in ranges],
        "lows": [r[1] for r in ranges],
        "highs": [r[2] for r in ranges],
        "floors": [r[3] for r in ranges],
        "floor_ids": [r[4] for r in ranges],
    }


def shared_hits(plan: str) -> int:
    """The statement's buffers (its first Buffers line is the top node's, the total)."""
    found = re.search(r"Buffers: shared hit=(\d+)", plan)
    assert found is not None, plan
    return int(found.group(1))


@pytest.fixture
def held(connect: Callable[..., Conn]) -> Iterator[Conn]:
    """A session idle in a REPEATABLE READ transaction whose snapshot is taken."""
    holder = connect()
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT 1")
    yield holder
    holder.execute("ROLLBACK")


def test_the_outcome_writes_find_their_row_by_key(db: Conn, child: Conn) -> None:
    """With few jobs processing, a generic plan would rather read the whole (small)
    processing index than look ten ids up by key; under a held snapshot that index keeps
    an entry for every job that ever ran. Each guarded write goes through the key."""
    db.execute("INSERT INTO job (topic, state) SELECT 't', 'done' FROM generate_series(1, 5000)")
    db.execute("ANALYZE job")
    one = uuid.uuid4()
    cases = {
        "claim": (Q.job_finish_and_claim, {**claim_values(), "done": [one]}),
        "claim with results": (
            Q.job_finish_and_claim_results,
            {
                **claim_values(),
                "done": [one],
                "results": [None],
                "reported": [],
                "fractions": [],
                "messages": [],
            },
        ),
        "done": (Q.job_set_done, {"id": one, "worker": "w1", "result": None}),
        "canceled": (
            Q.job_set_canceled,
            {
                "id": one,
                "worker": "w1",
                "error": "x",
                "history_error": "x",
                "kind": "canceled",
                "traceback": None,
            },
        ),
        "release": (Q.job_release_ids, {"ids": [one], "worker": "w1"}),
        "failed": (
            Q.job_set_failed,
            {
                "id": one,
                "worker": "w1",
                "refund": False,
                "max_attempts": 3,
                "delay": 1.0,
                "error": "x",
                "history_error": "x",
                "kind": "raised",
                "traceback": None,
            },
        ),
    }
    for what, (statement, values) in cases.items():
        plan = explain(child, statement, values)
        assert "job_processing_lease_idx" not in plan, f"{what}:\n{plan}"
        assert "Index Scan using job_pkey on job" in plan, f"{what}:\n{plan}"


def test_a_claim_with_a_floor_passes_the_claimed_entries_without_visiting_them(
    db: Conn, child: Conn, held: Conn
) -> None:
    """3,000 jobs claimed and done while a snapshot is held (their heap rows in an order
    unlike the index's, as concurrent producers leave them), then a fresh one: a whole
    read visits a row for each claimed entry; the floored claim (entering at the fresh
    job's available_at less the slack) reads none of them. Both claim the fresh job."""
    db.execute(
        "INSERT INTO job (topic, available_at) "
        "SELECT 't', now() - interval '1 hour' + g * interval '1 ms' "
        "FROM generate_series(1, 3000) AS g ORDER BY random()"
    )
    db.execute("ANALYZE job")
    db.execute(
        "UPDATE job SET state = 'processing', locked_by = 'w0', locked_until = now(), "
        "attempts = 1 WHERE state = 'pending'"
    )
    db.execute("UPDATE job SET state = 'done' WHERE state = 'processing'")
    fresh = db.execute("INSERT INTO job (topic) VALUES ('t') RETURNING id, available_at")
    row = fresh.fetchone()
    assert row is not None
    fresh_id, fresh_at = row["id"], row["available_at"]

    whole = explain(child, Q.job_finish_and_claim, claim_values(), analyze=True)
    floored = explain(
        child, Q.job_finish_and_claim_floored, floored_values(fresh_at - SLACK), analyze=True
    )
    one_row = re.compile(r"actual time=\S+ rows=1(\.00)? loops=1")  # PostgreSQL 18: 1.00
    assert one_row.search(whole.splitlines()[0]) and one_row.search(floored.splitlines()[0])
    assert shared_hits(whole) > 1000, whole
    assert shared_hits(floored) < 100, floored

    # And the claims themselves: the fresh job either way.
    for statement, values in (
        (Q.job_finish_and_claim, claim_values()),
        (Q.job_finish_and_claim_floored, floored_values(fresh_at - SLACK)),
    ):
        with child.transaction(force_rollback=True):
            got = child.execute(statement, values).fetchall()
        assert [r[1] for r in got] == [fresh_id]


def test_a_floor_passes_the_claimed_jobs_of_one_enqueue_by_their_ids(
    db: Conn, child: Conn, held: Conn
) -> None:
    """3,001 jobs of one transaction share their available_at; the first 3,000 claimed
    and done: entered at (available_at, the last claimed id), the claim reads none of
    their entries and takes the 3,001st. An available_at floor alone would read them all."""
    db.execute(
        "INSERT INTO job (id, topic) SELECT gen_random_uuid(), 't' FROM generate_series(1, 3001)"
    )
    db.execute("ANALYZE job")
    rows = db.execute("SELECT id, available_at FROM job ORDER BY id").fetchall()
    last_claimed, fresh = rows[-2], rows[-1]
    db.execute(
        "UPDATE job SET state = 'processing', locked_by = 'w0', locked_until = now(), "
        "attempts = 1 WHERE id <= %s",
        (last_claimed["id"],),
    )
    db.execute("DELETE FROM job WHERE state = 'processing'")  # done: gone to the history
    floors = Floors()
    at = last_claimed["available_at"]
    floors.end([("default", 0, at, last_claimed["id"])], at + 10 * SLACK, 0.0, 0.0)
    ranges = floors.ranges("default")
    assert ranges[1][3:] == (at, last_claimed["id"])
    values = {
        **claim_values(),
        "queues": [r[0] for r in ranges],
        "lows": [r[1] for r in ranges],
        "highs": [r[2] for r in ranges],
        "floors": [r[3] for r in ranges],
        "floor_ids": [r[4] for r in ranges],
    }
    whole = explain(child, Q.job_finish_and_claim, claim_values(), analyze=True)
    floored = explain(child, Q.job_finish_and_claim_floored, values, analyze=True)
    assert shared_hits(whole) > 1000, whole
    assert shared_hits(floored) < 100, floored
    with child.transaction(force_rollback=True):
        got = child.execute(Q.job_finish_and_claim_floored, values).fetchall()
    assert [r[1] for r in got] == [fresh["id"]]


def test_a_job_below_the_floor_waits_for_a_whole_read(db: Conn, child: Conn) -> None:
    """A job that became ready with an old available_at (an enqueue that committed late,
    a release) is not seen from a later floor; a whole read claims it. A job of a
    priority no claim has seen yet is read whole, floor or not."""
    late = db.execute(
        "INSERT INTO job (topic, available_at) VALUES ('t', now() - interval '10 s') "
        "RETURNING id, available_at"
    ).fetchone()
    assert late is not None
    values = floored_values(late["available_at"] + timedelta(seconds=5), limit=4)
    assert child.execute(Q.job_finish_and_claim_floored, values).fetchall() == []
    urgent = db.execute(
        "INSERT INTO job (topic, priority, available_at) "
        "VALUES ('t', 7, now() - interval '10 s') RETURNING id"
    ).fetchone()
    assert urgent is not None
    got = child.execute(Q.job_finish_and_claim_floored, values).fetchall()
    assert [r[1] for r in got] == [urgent["id"]]
    got = child.execute(Q.job_finish_and_claim, claim_values()).fetchall()
    assert [r[1] for r in got] == [late["id"]]


def test_the_claims_read_the_ready_index_in_order_on_a_table_analyzed_nearly_empty(
    db: Conn, child: Conn, held: Conn
) -> None:
    """Statistics taken when the table held a few finished jobs (a fresh deployment), the
    plans made while it is still small, then a held snapshot's worth of claimed jobs: with
    sorts allowed, those generic plans read job_ready_idx (available_at, id) and sorted by
    priority, so each range of the floored claim read whole walked every claimed job, and
    so did every plain claim. The children's settings leave them the ready index, in its
    order."""
    db.execute("INSERT INTO job (topic, state) SELECT 't', 'done' FROM generate_series(1, 5)")
    db.execute("ANALYZE job")

    def claimed_jobs(n: int) -> None:
        db.execute(
            "INSERT INTO job (topic, available_at) "
            "SELECT 't', now() - interval '1 hour' + g * interval '1 ms' "
            "FROM generate_series(1, %s) AS g ORDER BY g %% 4, g",
            (n,),
        )
        db.execute(
            "UPDATE job SET state = 'processing', locked_by = 'w0', locked_until = now(), "
            "attempts = 1 WHERE state = 'pending'"
        )
        db.execute("UPDATE job SET state = 'done' WHERE state = 'processing'")

    claimed_jobs(200)
    now = db.execute("SELECT now() AS t").fetchone()
    assert now is not None
    plain = prepare_as_child(child, Q.job_finish_and_claim)
    floored = prepare_as_child(child, Q.job_finish_and_claim_floored)
    for limit in (1, 8):  # the generic plans are made now, and kept (no ANALYZE comes)
        explain_prepared(child, plain, claim_values(limit))
        explain_prepared(child, floored, floored_values(now["t"], limit))
    claimed_jobs(20_000)
    fresh = db.execute("INSERT INTO job (topic) VALUES ('t') RETURNING available_at").fetchone()
    assert fresh is not None
    for limit in (1, 8):
        for prepared, values in (
            (plain, claim_values(limit)),
            (floored, floored_values(fresh["available_at"], limit)),
        ):
            plan = explain_prepared(child, prepared, values, analyze=True)
            assert "job_ready_idx" not in plan and "Sort" not in plan, plan
            assert "job_ready_queue_idx" in plan, plan
            if prepared is floored:
                assert shared_hits(plan) < 100, plan
