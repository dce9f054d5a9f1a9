"""The groups' floors (migration 0028): a fair claim reads a deep group from past the jobs
claimed before, not through their index entries; what becomes ready below a floor is
taken by the next claim that reads whole (at least every 250 ms); a job of a higher
priority is never passed over. Against a real PostgreSQL, through the statement a child
sends (tests/db/test_rate_limits.py's helpers)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.rows import tuple_row

from brooq.operator import reads
from brooq.sql import Q
from brooq.worker.pacing import turns
from tests.db.test_rate_limits import claim, group_of, handler, jobs, publish

Conn = psycopg.Connection[Any]
TOPIC = "tenant.fair"


@pytest.fixture
def db(connect: Callable[..., Conn]) -> Conn:
    return connect()


def finish(db: Conn, rows: list[dict[str, Any]]) -> None:
    """The claimed jobs done: gone from job (to job_history, as the child's done does),
    their entries left in the ready index until a VACUUM."""
    db.execute("DELETE FROM job WHERE id = ANY(%s)", ([r["id"] for r in rows],))


def floors_fresh(db: Conn) -> None:
    """The last whole read just now: the next claim reads from the floors."""
    db.execute("UPDATE brooq_group_turn SET floors_read_at = clock_timestamp()")


def floors_due(db: Conn) -> None:
    """The last whole read over 250 ms ago: the next claim reads its groups whole."""
    db.execute("UPDATE brooq_group_turn SET floors_read_at = clock_timestamp() - interval '1 s'")


def claim_buffers(db: Conn, limit: int) -> int:
    """The buffers a fair claim of ``limit`` touches (EXPLAIN ANALYZE BUFFERS of
    brooq_claim_batch, every statement inside it counted), rolled back after."""
    h = handler(TOPIC, fair_groups=True)
    [turn] = turns({h.topic: h})
    p = turn.params
    names = ("limited", "cap", "rate", "window", "group_cap", "group_rate", "group_window")
    args = [p[k] for k in (*names, "in_turn", "allowance")]
    call = (
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM brooq_claim_batch("
        "%s, %s, %s, %s, %s, %s, %s, %s, %s, '{default}', '{}', 'probe', 30, %s)"
    )
    cur = db.cursor(row_factory=tuple_row)
    db.execute("BEGIN")
    try:
        [[plan]] = cur.execute(call, [*args, limit]).fetchall()
    finally:
        db.execute("ROLLBACK")
    node = plan[0]["Plan"]
    return int(node["Shared Hit Blocks"]) + int(node["Shared Read Blocks"])


def drain(db: Conn, h: Any, n: int, batch: int = 256) -> None:
    """Claim and finish ``n`` jobs in claims of ``batch``, the floors kept fresh."""
    left = n
    while left > 0:
        floors_fresh(db)
        rows = claim(db, h, "w", limit=min(batch, left))
        assert rows, "the group ran dry"
        finish(db, rows)
        left -= len(rows)


def test_a_deep_group_is_read_from_its_floor_not_through_the_claimed_entries(db: Conn) -> None:
    """One tenant's 30,000 jobs beside a small one: a claim after 20,000 of them were
    claimed and finished (no VACUUM since) touches about the buffers a claim after 1,000
    touches; the same claim reading whole walks the 20,000 entries and touches far more."""
    h = handler(TOPIC, fair_groups=True)
    db.execute("ALTER TABLE job SET (autovacuum_enabled = off)")
    jobs(db, TOPIC, 30_000, "big")
    jobs(db, TOPIC, 5, "small")
    db.execute("VACUUM ANALYZE job")
    drain(db, h, 1_000)
    floors_fresh(db)
    early = claim_buffers(db, 64)
    drain(db, h, 19_000)
    floors_fresh(db)
    late = claim_buffers(db, 64)
    floors_due(db)
    whole = claim_buffers(db, 64)
    print(f"a fair claim: {early} buffers after 1,000, {late} after 20,000, {whole} whole")
    assert late <= 2 * early + 64, (early, late)
    assert whole > late + 100, (late, whole)  # the floor is what spares the walk


def test_a_job_that_becomes_ready_below_a_floor_is_taken_by_the_next_whole_read(
    db: Conn,
) -> None:
    """A job of the deep group given an available_at in the past (as a claim given back
    keeps its place) sorts below the floor: claims from the floor pass it by, the next one
    that reads whole (250 ms after the last at most) takes it first, in FIFO order."""
    h = handler(TOPIC, fair_groups=True)
    jobs(db, TOPIC, 500, "big")
    drain(db, h, 300, batch=100)
    late_id = db.execute(
        "INSERT INTO job (topic, group_key, available_at) "
        "VALUES (%s, 'big', now() - interval '1 hour') RETURNING id",
        (TOPIC,),
    ).fetchone()["id"]
    floors_fresh(db)
    [passed] = claim(db, h, "w", limit=1)
    assert passed["id"] != late_id  # below the floor: not read
    floors_due(db)
    [taken] = claim(db, h, "w", limit=1)
    assert taken["id"] == late_id


def test_a_job_of_a_higher_priority_is_taken_past_a_floor(db: Conn) -> None:
    h = handler(TOPIC, fair_groups=True)
    jobs(db, TOPIC, 500, "big")
    drain(db, h, 300, batch=100)
    urgent = db.execute(
        "INSERT INTO job (topic, group_key, priority) VALUES (%s, 'big', 5) RETURNING id",
        (TOPIC,),
    ).fetchone()["id"]
    floors_fresh(db)
    [first] = claim(db, h, "w", limit=1)
    assert first["id"] == urgent


def test_the_passes_of_one_claim_take_each_job_once(db: Conn) -> None:
    """Two deep groups and five priorities mixed: the passes of one claim read each group
    from where its last pass stopped, and each claim from the floors the last one left;
    every job is taken exactly once over the drain, each claim taking the next jobs of
    each group in its order (priority, then FIFO). A claim's rows come back in no order:
    its jobs of a group are compared as a set with the next ones expected."""
    h = handler(TOPIC, fair_groups=True)
    for g in ("A", "B"):
        jobs(db, TOPIC, 400, g)
    db.execute(
        "UPDATE job SET priority = (hashtext(id::text) %% 5)::smallint WHERE topic = %s",
        (TOPIC,),
    )
    expected = {
        g: [
            r["id"]
            for r in db.execute(
                "SELECT id FROM job WHERE group_key = %s ORDER BY priority DESC, available_at, id",
                (g,),
            )
        ]
        for g in ("A", "B")
    }
    taken = {"A": 0, "B": 0}
    claims = 0
    while True:
        floors_fresh(db)
        rows = claim(db, h, "w", limit=96)
        if not rows:
            break
        claims += 1
        by_group: dict[str, set[uuid.UUID]] = {"A": set(), "B": set()}
        for r in rows:
            g = group_of(db, r["id"])
            assert g is not None
            by_group[g].add(r["id"])
        for g, ids in by_group.items():
            assert ids == set(expected[g][taken[g] : taken[g] + len(ids)]), (claims, g)
            taken[g] += len(ids)
        finish(db, rows)
    assert taken == {"A": 400, "B": 400} and claims >= 8


def test_a_fair_topics_ready_jobs_are_not_read_for_the_held_count(db: Conn) -> None:
    """A topic with fair_groups alone publishes its limits, but none can hold a job back:
    job_held_by_topic reads none of its ready jobs (it read them all, every stats period)."""
    fair, grouped = handler(TOPIC, fair_groups=True), handler("tenant.capped", group_limit=1)
    publish(db, {TOPIC: {"queue": "default", **fair.limits()}})
    publish(db, {"tenant.capped": {"queue": "default", **grouped.limits()}})
    jobs(db, TOPIC, 50, "A")
    jobs(db, "tenant.capped", 3, "A")
    assert claim(db, grouped, "w")  # A at its limit: its other 2 held
    held = reads.held_by_topic(db, Q)
    assert set(held) == {("default", "tenant.capped")}
    assert held[("default", "tenant.capped")][0] == 2
