"""Queues, priorities, pause and global_limit in the claim statements, against a real
PostgreSQL with several connections; and the plans of the claims on a 100,000-row table.
The pure rules are unit tests: tests/unit/worker/test_weights.py, tests/unit/test_settings.py,
tests/unit/test_job.py.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import brooq
from brooq.sql import Q
from brooq.worker.floors import WHOLE

Conn = psycopg.Connection[Any]
LEASE = 30.0


@pytest.fixture
def db(connect: Callable[..., Conn]) -> Conn:
    return connect()


def add(
    db: Conn, topic: str = "t", *, queue: str = "default", priority: int = 0, offset: float = -1
) -> uuid.UUID:
    row = db.execute(
        "INSERT INTO job (id, topic, queue, priority, available_at) VALUES "
        "(%s, %s, %s, %s, now() + make_interval(secs => %s)) RETURNING id",
        (uuid.uuid4(), topic, queue, priority, offset),
    ).fetchone()
    assert row is not None
    return uuid.UUID(str(row["id"]))


def params(
    worker: str = "w",
    *,
    topics: tuple[str, ...] = ("t",),
    limit: int = 1,
    done: list[uuid.UUID] | None = None,
    children: int = 1,
) -> dict[str, Any]:
    return {
        "done": done or [],
        "topics": list(topics),
        "limit": limit,
        "children": children,
        "worker": worker,
        "lease": LEASE,
    }


def claimed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["claimed"]]


def claim_one_queue(db: Conn, queue: str = "default", **kw: Any) -> list[dict[str, Any]]:
    rows = db.execute(Q.job_finish_and_claim, {**params(**kw), "queue": queue}).fetchall()
    return claimed(rows)


def claim_queues(db: Conn, queues: list[str], **kw: Any) -> list[dict[str, Any]]:
    rows = db.execute(Q.job_finish_and_claim_queues, {**params(**kw), "queues": queues})
    return claimed(rows.fetchall())


def claim_limited(
    db: Conn, queues: list[str], limited: str, cap: int, **kw: Any
) -> list[dict[str, Any]]:
    p = {**params(**kw), "queues": queues, "limited": limited, "cap": cap}
    return claimed(db.execute(Q.job_finish_and_claim_limited, p).fetchall())


# -- priority and queues in the claim ----------------------------------------------------


def test_higher_priority_first_then_fifo(db: Conn) -> None:
    old_low = add(db, priority=0, offset=-30)
    new_high = add(db, priority=5, offset=-1)
    old_high = add(db, priority=5, offset=-10)
    negative = add(db, priority=-3, offset=-60)
    got = [r["id"] for r in claim_one_queue(db, limit=4)]
    assert set(got) == {old_low, new_high, old_high, negative}
    for job_id in got:  # back to ready, then one at a time: the claim's own order
        db.execute("UPDATE job SET state = 'pending' WHERE id = %s", [job_id])
    one_by_one = [claim_one_queue(db)[0]["id"] for _ in range(4)]
    assert one_by_one == [old_high, new_high, old_low, negative]


def test_the_one_queue_claim_takes_only_its_queue(db: Conn) -> None:
    mine = add(db, queue="default", offset=-1)
    add(db, queue="bulk", offset=-100, priority=100)  # older and more urgent, elsewhere
    assert [r["id"] for r in claim_one_queue(db, limit=5)] == [mine]
    rows = claim_one_queue(db, "bulk", limit=5)
    assert [(r["queue"], r["priority"]) for r in rows] == [("bulk", 100)]


def test_queues_are_tried_in_the_order_given_and_spill(db: Conn) -> None:
    for i in range(3):
        add(db, queue="tiny", offset=-i - 1)
    for i in range(10):
        add(db, queue="bulk", offset=-i - 100)  # older: FIFO alone would take these first
    rows = claim_queues(db, ["tiny", "bulk"], limit=5)
    assert [r["queue"] for r in rows].count("tiny") == 3
    assert [r["queue"] for r in rows].count("bulk") == 2
    rows = claim_queues(db, ["nosuch", "bulk", "tiny"], limit=20)
    assert {r["queue"] for r in rows} == {"bulk"} and len(rows) == 8


def test_pauses_are_read_by_name_and_do_not_stop_producers(db: Conn, dsn: str) -> None:
    """What a child reads before claiming (queue_paused_names): the paused ones among its
    queues; pausing a queue nobody used yet is allowed; producers go on."""
    queue = brooq.Queue(dsn)

    def paused(names: list[str]) -> set[str]:
        rows = db.execute(Q.queue_paused_names, {"queues": names}).fetchall()
        return {r["name"] for r in rows}

    try:
        assert paused(["urgent", "default"]) == set()
        queue.pause("urgent")  # before any job of it
        queue.pause("other")
        assert paused(["urgent", "default"]) == {"urgent"}
        queue.enqueue(brooq.Job("t", queue="urgent"))  # producers are not stopped
        assert len(claim_queues(db, ["urgent"], limit=5)) == 1  # the statement itself does not look
        queue.resume("urgent")
        assert paused(["urgent", "default", "other"]) == {"other"}
    finally:
        queue.close()


def test_scheduled_and_processing_rows_are_not_claimed(db: Conn) -> None:
    add(db, offset=+60, priority=50)  # later, whatever its priority
    ready = add(db, offset=-1)
    assert [r["id"] for r in claim_one_queue(db, limit=5)] == [ready]
    assert claim_one_queue(db, limit=5) == []


# -- global_limit -----------------------------------------------------------------------


def test_the_limited_claim_stops_at_the_cap_and_counts_its_own_done(db: Conn) -> None:
    for _ in range(10):
        add(db, "lim")
    held = [claim_limited(db, ["default"], "lim", 3, topics=(), worker=f"w{i}") for i in range(5)]
    assert [len(h) for h in held] == [1, 1, 1, 0, 0]
    # w0 writes its done and claims again in the same statement: its finished row does not
    # count against the cap, the others' do.
    again = claim_limited(
        db, ["default"], "lim", 3, topics=(), worker="w0", done=[held[0][0]["id"]]
    )
    assert len(again) == 1
    assert db.execute("SELECT count(*) AS n FROM job WHERE state = 'processing'").fetchone() == {
        "n": 3
    }
    # A limit of 0 writes and claims nothing of the limited topic.
    assert claim_limited(db, ["default"], "lim", 3, topics=(), worker="w1", limit=0) == []


def test_the_limited_claim_fills_the_rest_with_unlimited_topics(db: Conn) -> None:
    add(db, "lim")
    for _ in range(5):
        add(db, "free")
    rows = claim_limited(db, ["default"], "lim", 1, topics=("free",), limit=3)
    assert sorted(r["topic"] for r in rows) == ["free", "free", "lim"]


def test_racing_claimers_never_exceed_the_cap(dsn: str) -> None:
    """Eight connections loop claim -> hold -> done+claim on a capped topic; a sampler in
    its own connection counts processing rows of the topic. With the cap at 3, more than
    3 at any sample is a broken limit."""
    cap, jobs = 3, 300
    with psycopg.connect(dsn, autocommit=True) as setup:
        setup.execute("INSERT INTO job (topic) SELECT 'lim' FROM generate_series(1, %s)", [jobs])
    stop = threading.Event()
    errors: list[BaseException] = []
    peaks: list[int] = []

    def claimer(n: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
                done: list[uuid.UUID] = []
                while not stop.is_set():
                    rows = claim_limited(
                        conn, ["default"], "lim", cap, topics=(), worker=f"c{n}", done=done
                    )
                    done = [r["id"] for r in rows]
                    time.sleep(0.003 if done else 0.001)
        except BaseException as exc:
            errors.append(exc)

    def sampler() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM job WHERE topic = 'lim' AND state = 'processing'"
                ).fetchone()
                assert row is not None
                peaks.append(int(row[0]))

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)]
    threads.append(threading.Thread(target=sampler))
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute("SELECT count(*) FROM job_all WHERE state = 'done'").fetchone()
            if row is not None and row[0] >= jobs - cap:
                break
            time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(10)
    assert errors == []
    assert peaks and max(peaks) <= cap, max(peaks)
    assert max(peaks) == cap  # the harness did reach the cap: the check is not vacuous


# -- the plans on a big table -------------------------------------------------------------


def _nodes(plan: Any) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "Node Type" in node:
                found.append(
                    (node["Node Type"], node.get("Relation Name", node.get("Index Name", "")))
                )
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(plan)
    return found


def _indexes(plan: Any) -> set[str]:
    text = json.dumps(plan)
    return {name for name in ("job_ready_queue_idx", "job_ready_idx", "job_pkey") if name in text}


def _check(plan: Any, what: str) -> None:
    nodes = _nodes(plan)
    shown = " > ".join(f"{n}({rel})" if rel else n for n, rel in nodes)
    assert ("Seq Scan", "job") not in nodes, f"{what}: {shown}"
    # A bitmap scan of the ready rows reads them all before the LIMIT (the update by
    # primary key may use one: it reads only the claimed ids).
    ready = ("job_ready_queue_idx", "job_ready_idx")
    assert not [n for n in nodes if n[0] == "Bitmap Index Scan" and n[1] in ready], (
        f"{what}: {shown}"
    )
    assert not any(n in ("Sort", "Incremental Sort") for n, _ in nodes), f"{what}: {shown}"
    assert "job_ready_queue_idx" in _indexes(plan), f"{what}: {shown}"


@pytest.fixture
def big(db: Conn) -> Conn:
    """100,000 jobs: 95,000 done, the rest ready in three queues at three priorities."""
    db.execute(
        "INSERT INTO job (topic, state, queue, priority, available_at, updated_at) "
        "SELECT 'topic-' || (g % 5), CASE WHEN g % 19 = 0 THEN 'pending' ELSE 'done' END, "
        "       (ARRAY['default', 'bulk', 'urgent'])[1 + g % 3], (g % 3) * 10, "
        "       now() - make_interval(secs => g), now() "
        "FROM generate_series(1, 100000) AS g"
    )
    db.execute("ANALYZE job")
    return db


AN_HOUR_AGO = datetime.now(timezone.utc) - timedelta(hours=1)


def _explain(db: Conn, name: str, statement: str, values: dict[str, Any]) -> list[Any]:
    """The plans of ``statement`` as the child runs it (prepared: a generic plan after a few
    executions), forced generic and custom, with bitmap scans on and off."""
    plans = []
    for mode in ("force_generic_plan", "force_custom_plan"):
        for bitmap in ("on", "off"):
            db.execute(f"SET plan_cache_mode = {mode}")
            db.execute(f"SET enable_bitmapscan = {bitmap}")
            with db.transaction():  # the claim must not stay applied
                row = db.execute(
                    "EXPLAIN (ANALYZE, FORMAT JSON) " + statement, values, prepare=True
                ).fetchone()
                assert row is not None
                plans.append((f"{name} {mode} bitmap={bitmap}", row["QUERY PLAN"]))
                raise_rollback()
    db.execute("RESET plan_cache_mode")
    db.execute("RESET enable_bitmapscan")
    return plans


def raise_rollback() -> None:
    raise psycopg.Rollback()


def test_the_claims_are_index_driven_on_a_big_table(big: Conn) -> None:
    topics = ["topic-1", "topic-3"]
    cases = [
        ("plain", Q.job_finish_and_claim, {"queue": "default"}),
        ("prioritised", Q.job_finish_and_claim, {"queue": "urgent"}),
        ("queues", Q.job_finish_and_claim_queues, {"queues": ["urgent", "default", "bulk"]}),
        (
            # The claim from floors (brooq.worker.floors): urgent's priorities 20 and 0
            # seen, each from a floor an hour back, the ranges around them whole; default
            # read whole.
            "floored",
            Q.job_finish_and_claim_floored,
            {
                "queues": ["urgent"] * 5 + ["default"],
                "lows": [21, 20, 1, 0, -32768, -32768],
                "highs": [32767, 20, 19, 0, -1, 32767],
                "floors": [WHOLE[0], AN_HOUR_AGO, WHOLE[0], AN_HOUR_AGO, WHOLE[0], WHOLE[0]],
                "floor_ids": [WHOLE[1]] * 6,
            },
        ),
        (
            "limited",
            Q.job_finish_and_claim_limited,
            {"queues": ["bulk", "default"], "limited": "topic-2", "cap": 4},
        ),
    ]
    for name, statement, extra in cases:
        for limit in (1, 32):
            values = {**params(topics=tuple(topics), limit=limit, children=2), **extra}
            for what, plan in _explain(big, f"{name} limit={limit}", statement, values):
                _check(plan, what)


def test_the_limited_claim_inside_its_function_is_index_driven(big: Conn) -> None:
    """brooq_claim_limited's own statements, seen through auto_explain (nested statements
    logged to the client as notices): its claim too walks the ready index."""
    plans: list[Any] = []
    big.add_notice_handler(
        lambda diag: (
            plans.append(json.loads(diag.message_primary.split("\n", 1)[1]))
            if diag.message_primary and diag.message_primary.startswith("duration:")
            else None
        )
    )
    big.execute("LOAD 'auto_explain'")
    for name, value in (
        ("log_min_duration", "0"),
        ("log_nested_statements", "on"),
        ("log_format", "json"),
        ("log_level", "notice"),
    ):
        big.execute(f"SET auto_explain.{name} = {value}")
    values = {
        **params(topics=("topic-1",), limit=8, children=2),
        "queues": ["bulk", "default"],
        "limited": "topic-2",
        "cap": 4,
    }
    big.execute("SET plan_cache_mode = force_generic_plan")
    with big.transaction():
        rows = big.execute(Q.job_finish_and_claim_limited, values).fetchall()
        raise_rollback()
    assert [r["topic"] for r in rows if r["claimed"]].count("topic-2") == 1
    inner = [p for p in plans if "unnest(p_queues)" in p.get("Query Text", "")]
    assert inner, plans
    for plan in inner:
        _check(plan, "brooq_claim_limited's claim")


def test_a_job_naming_no_queue_goes_to_its_handlers_queue(dsn: str, db: Conn) -> None:
    queue = brooq.Queue(dsn)
    try:
        queue.handler("to.bulk", queue="bulk")(print)
        one, _ = queue.enqueue(brooq.Job("to.bulk"))
        many = [i for i, _ in queue.enqueue_many([brooq.Job("to.bulk"), brooq.Job("other")])]
        keyed = [
            i
            for i, _ in queue.enqueue_many(
                [
                    brooq.Job("to.bulk", idempotency_key="k", priority=3),
                    brooq.Job("to.bulk", queue="x"),
                ]
            )
        ]
        with psycopg.connect(dsn) as conn:  # brooq.enqueue knows no handlers: default
            plain, _ = brooq.enqueue(conn, brooq.Job("to.bulk"))
        rows = {
            r["id"]: (r["queue"], r["priority"])
            for r in db.execute("SELECT id, queue, priority FROM job").fetchall()
        }
        assert rows == {
            one: ("bulk", 0),
            many[0]: ("bulk", 0),
            many[1]: ("default", 0),
            keyed[0]: ("bulk", 3),
            keyed[1]: ("x", 0),
            plain: ("default", 0),
        }
    finally:
        queue.close()
