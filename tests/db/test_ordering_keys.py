"""Ordered keys (Job(ordering_key=...)): the jobs of one (topic, key) start one at a time in
enqueue order, through every door a producer has (one, many, sync and async, the caller's
connection, the SQL contract); a job waiting for a retry blocks its key, a dead one until
it is retried or its key unblocked; canceled jobs hand the key on; other keys and jobs
without a key are never held back. The claims here are the children's own statement."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import brooq
from brooq.errors import BrooqError, InvalidOrderingKey
from brooq.sql import Q
from tests.harness import ENQUEUE_DOORS, covering, enqueue_through

LEASE = 30.0
TOPIC = "t.o"


def claim(dsn: str, done: list[uuid.UUID] | None = None, limit: int = 50) -> list[uuid.UUID]:
    """A child's round trips: ``done`` written done (the round trip that writes them claims
    what its snapshot saw: not the key's next job, made pending as the done is written),
    then what the next round trip claims of TOPIC (left processing), in claim order."""
    if done:
        assert _round_trip(dsn, done, 0) == []
    return _round_trip(dsn, [], limit)


def _round_trip(dsn: str, done: list[uuid.UUID], limit: int) -> list[uuid.UUID]:
    params = {
        "done": done or [],
        "topics": [TOPIC, "t.plain"],
        "limit": limit,
        "children": 1,
        "worker": "w",
        "lease": LEASE,
        "queue": "default",
    }
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        rows = conn.execute(Q.job_finish_and_claim, params).fetchall()
    return [r["id"] for r in rows if r["claimed"]]


def fail(db: psycopg.Connection[Any], job_id: uuid.UUID, *, dead: bool, delay: float = 0.0) -> str:
    """The child's failed outcome: dead when ``dead`` (its attempts used up), else failed
    until ``delay`` has passed."""
    row = db.execute(
        Q.job_set_failed,
        {
            "id": job_id,
            "worker": "w",
            "refund": False,
            "max_attempts": 1 if dead else 100,
            "delay": delay,
            "error": "boom",
            "history_error": "boom",
            "kind": "raised",
            "traceback": None,
        },
    ).fetchone()
    assert row is not None
    return str(row[0])


def states(db: psycopg.Connection[Any], ids: list[uuid.UUID]) -> list[str]:
    found = dict(db.execute("SELECT id, state FROM job_all WHERE id = ANY(%s)", (ids,)).fetchall())
    return [found[i] for i in ids]


def keyed(n: int, key: str = "cust-1", **options: Any) -> list[brooq.Job]:
    return [brooq.Job(TOPIC, {"n": i}, ordering_key=key, **options) for i in range(n)]


DOORS = ENQUEUE_DOORS
# What an ordered job may carry besides: each takes another statement (the options'
# INSERT, COPY's wide form, the INSERT of keyed batches).
CASES: tuple[dict[str, Any], ...] = (
    {},
    {"tags": ["vip"], "group": "acme", "priority": 3},
    {"idempotency_key": "k"},
)


@pytest.mark.parametrize(("door", "case"), covering(DOORS, CASES))
def test_one_job_of_a_key_at_a_time_in_enqueue_order(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str, door: str, case: dict[str, Any]
) -> None:
    jobs = [brooq.Job(TOPIC, {"n": i}, ordering_key="cust-1", **_unique(case, i)) for i in range(3)]
    other = brooq.Job(TOPIC, {"n": 9}, ordering_key="cust-2")
    ids = enqueue_through(door, queue, dsn, [*jobs, other])
    first, second, third, alone = ids
    assert states(db, ids) == ["pending", "waiting", "waiting", "pending"]
    record = queue.get(second)
    assert record is not None and record.ordering_key == "cust-1"
    assert set(claim(dsn)) == {first, alone}  # one per key
    assert claim(dsn) == []
    assert claim(dsn, done=[first]) == [second]
    assert states(db, [third]) == ["waiting"]
    assert claim(dsn, done=[second, alone]) == [third]
    assert claim(dsn, done=[third]) == []
    assert states(db, ids) == ["done"] * 4


def _unique(case: dict[str, Any], i: int) -> dict[str, Any]:
    """``case`` with its idempotency key made the i-th job's own."""
    if "idempotency_key" in case:
        return {**case, "idempotency_key": f"{case['idempotency_key']}-{i}"}
    return case


def test_a_key_waits_for_its_job_retry_and_a_dead_job_until_retried(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str
) -> None:
    first, second, third = (i for i, _ in queue.enqueue_many(keyed(3)))
    assert claim(dsn) == [first]
    assert fail(db, first, dead=False, delay=3600) == "failed"
    assert claim(dsn) == []  # its retry is an hour away: the key waits
    [blocked] = queue.blocked_keys()
    assert (blocked.topic, blocked.ordering_key, blocked.reason, blocked.job_id) == (
        TOPIC,
        "cust-1",
        "retrying",
        first,
    )
    assert blocked.waiting == 2 and blocked.retry_at is not None
    db.execute("UPDATE job SET available_at = now() WHERE id = %s", (first,))
    assert claim(dsn) == [first]  # the retry comes first
    assert fail(db, first, dead=True) == "dead"
    assert claim(dsn) == []  # dead: the key stays blocked
    [blocked] = queue.blocked_keys(TOPIC)
    assert (blocked.reason, blocked.job_id, blocked.waiting) == ("dead", first, 2)
    assert queue.blocked_keys("t.other") == []
    queue.retry(first)
    assert states(db, [first, second, third]) == ["pending", "waiting", "waiting"]
    assert queue.blocked_keys() == []
    assert claim(dsn) == [first]
    assert claim(dsn, done=[first]) == [second]
    assert claim(dsn, done=[second]) == [third]


def test_unblock_hands_a_dead_key_on_and_the_dead_job_stays_dead(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str
) -> None:
    first, second, third = (i for i, _ in queue.enqueue_many(keyed(3)))
    assert claim(dsn) == [first] and fail(db, first, dead=True) == "dead"
    with pytest.raises(BrooqError, match="no dead job blocks key 'other'"):
        queue.unblock_key(TOPIC, "other")
    assert queue.unblock_key(TOPIC, "cust-1") == second
    assert states(db, [first, second, third]) == ["dead", "pending", "waiting"]
    assert queue.blocked_keys() == []
    with pytest.raises(BrooqError, match="no dead job blocks"):
        queue.unblock_key(TOPIC, "cust-1")
    # Retried after all, the dead job takes its turn after the key's running job.
    assert claim(dsn) == [second]
    queue.retry(first)
    assert states(db, [first, third]) == ["waiting", "waiting"]
    assert claim(dsn, done=[second]) == [first]  # the smaller id first
    assert claim(dsn, done=[first]) == [third]


def test_a_canceled_job_hands_its_key_on_wherever_it_stood(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str
) -> None:
    ids = [i for i, _ in queue.enqueue_many(keyed(4))]
    assert queue.cancel(ids[1]) is True  # a waiting one: the order goes on without it
    assert states(db, ids) == ["pending", "canceled", "waiting", "waiting"]
    assert queue.cancel(ids[0]) is True  # the key's pending job: the next one goes
    assert states(db, ids[2:]) == ["pending", "waiting"]
    assert claim(dsn) == [ids[2]]
    assert queue.cancel(ids[2]) is True  # processing: canceled, the key handed on
    assert states(db, [ids[3]]) == ["pending"]


def test_keys_and_jobs_without_a_key_never_wait_for_each_other(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str
) -> None:
    jobs = [*keyed(2, "a"), *keyed(2, "b"), brooq.Job(TOPIC), brooq.Job("t.plain")]
    a1, a2, b1, b2, plain, other = (i for i, _ in queue.enqueue_many(jobs))
    assert set(claim(dsn)) == {a1, b1, plain, other}
    assert states(db, [a2, b2]) == ["waiting", "waiting"]
    # The same key in another topic is another key.
    [c1] = [i for i, _ in queue.enqueue_many([brooq.Job("t.plain", ordering_key="a")])]
    assert states(db, [c1]) == ["pending"]


def test_a_scheduled_job_of_a_key_holds_its_key_until_it_has_run(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str
) -> None:
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    first = queue.enqueue(brooq.Job(TOPIC, ordering_key="k", available_at=later))[0]
    second = queue.enqueue(brooq.Job(TOPIC, ordering_key="k"))[0]
    assert states(db, [first, second]) == ["pending", "waiting"]
    assert claim(dsn) == []
    db.execute("UPDATE job SET available_at = now() WHERE id = %s", (first,))
    assert claim(dsn) == [first]
    assert claim(dsn, done=[first]) == [second]


def test_the_caller_transaction_decides_and_a_rollback_leaves_the_key_free(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str
) -> None:
    with psycopg.connect(dsn) as conn:
        brooq.enqueue_many(conn, keyed(2))
        conn.rollback()
    first = queue.enqueue(keyed(1)[0])[0]
    assert states(db, [first]) == ["pending"]


def test_the_sql_contract_orders_a_key_as_any_door(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str
) -> None:
    """What psql runs: brooq_enqueue with ordering_key (and held, which it refuses beside
    it), and a plain INSERT naming the column."""
    first = db.execute("SELECT brooq_enqueue('t.o', '{}', ordering_key => 'p')").fetchone()[0]  # type: ignore[index]
    second = db.execute("SELECT brooq_enqueue('t.o', ordering_key => 'p')").fetchone()[0]  # type: ignore[index]
    db.execute(
        "INSERT INTO job (id, topic, payload, ordering_key) VALUES (brooq_uuid7(), 't.o', '1', 'p')"
    )
    held = db.execute("SELECT brooq_enqueue('t.o', held => true)").fetchone()[0]  # type: ignore[index]
    assert states(db, [first, second, held]) == ["pending", "waiting", "on_hold"]
    assert db.execute("SELECT count(*) FROM job WHERE state = 'waiting'").fetchone() == (2,)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="held cannot be combined"):
        db.execute("SELECT brooq_enqueue('t.o', ordering_key => 'p', held => true)")
    assert claim(dsn) == [first]
    assert claim(dsn, done=[first]) == [second]


def test_a_hand_over_the_end_could_not_make_is_made_by_the_sweep(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str
) -> None:
    """The job ends while a producer's transaction holds the key's lock (its next job not
    committed): the worker never waits for it, the masters' sweep hands the key on."""
    first = queue.enqueue(keyed(1)[0])[0]
    assert claim(dsn) == [first]
    with psycopg.connect(dsn) as producer:
        [(second, _)] = brooq.enqueue_many(producer, keyed(1))  # holds the key's lock
        assert _round_trip(dsn, [first], 0) == []  # ended without waiting for the producer
        producer.commit()
    assert states(db, [first, second]) == ["done", "waiting"]
    rows = db.execute(Q.key_sweep, {"after_topic": "", "after_key": "", "batch": 10}).fetchall()
    assert rows == [(TOPIC, "cust-1", second)]
    assert states(db, [second]) == ["pending"]
    # Nothing left to hand on: the sweep changes nothing.
    assert (
        db.execute(Q.key_sweep, {"after_topic": "", "after_key": "", "batch": 10}).fetchall() == []
    )


def test_the_sweep_never_starts_a_second_job_of_a_busy_key(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str
) -> None:
    first, second = (i for i, _ in queue.enqueue_many(keyed(2)))
    assert claim(dsn) == [first]
    assert fail(db, first, dead=False, delay=3600) == "failed"
    rows = db.execute(Q.key_sweep, {"after_topic": "", "after_key": "", "batch": 10}).fetchall()
    assert rows == [(TOPIC, "cust-1", None)]
    assert fail_then_dead(db, dsn, first) == "dead"
    rows = db.execute(Q.key_sweep, {"after_topic": "", "after_key": "", "batch": 10}).fetchall()
    assert rows == [(TOPIC, "cust-1", None)] and states(db, [second]) == ["waiting"]
    # A dead job of a skipping topic: the keys duty's statements hand the key on.
    gone = db.execute(Q.key_skip_dead, {"topics": [TOPIC]}).fetchall()
    assert gone == [(TOPIC, "cust-1")]
    rows = db.execute(Q.key_sweep, {"after_topic": "", "after_key": "", "batch": 10}).fetchall()
    assert rows == [(TOPIC, "cust-1", second)]


def fail_then_dead(db: psycopg.Connection[Any], dsn: str, job_id: uuid.UUID) -> str:
    db.execute("UPDATE job SET available_at = now() WHERE id = %s", (job_id,))
    assert claim(dsn) == [job_id]
    return fail(db, job_id, dead=True)


def test_the_sweep_walks_every_waiting_key_from_its_cursor(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str
) -> None:
    for key in ("a", "b", "c"):
        queue.enqueue_many(keyed(2, key))
    page = db.execute(Q.key_sweep, {"after_topic": TOPIC, "after_key": "a", "batch": 1}).fetchall()
    assert [(t, k) for t, k, _ in page] == [(TOPIC, "b")]
    assert page[0][2] is None  # b's first job is pending: nothing to hand on


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ordering_key": 5}, "ordering_key must be a string or None, not int"),
        ({"ordering_key": "x" * 257}, "ordering_key is 257 characters long; the limit is 256"),
        ({"ordering_key": "a\nb"}, "holds a control character"),
        ({"ordering_key": "k", "unique_key": "u"}, "cannot be combined with unique_key"),
        ({"ordering_key": "k", "held": True}, "cannot be combined with held"),
        (
            {"ordering_key": "k", "after": [uuid.UUID(int=1)]},
            "cannot be combined with after",
        ),
    ],
)
def test_a_bad_ordering_key_is_refused_before_any_write(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidOrderingKey, match=message):
        brooq.Job(TOPIC, **options)


def test_an_empty_ordering_key_is_none() -> None:
    assert brooq.Job(TOPIC, ordering_key="").ordering_key is None
