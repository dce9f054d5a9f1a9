"""The producer's promises once finished jobs leave ``job`` for ``job_history`` (migration
0020), through every door a job comes in by.

- An idempotency key is its job's for the job's life: a key whose job ended (done by the
  claim statement, dead by a failure, canceled, or a finished row from before the
  migration still in job) gives that job's id back, created False, and writes nothing;
  so does a key whose job was enqueued and ended while the enqueue's statement ran (the
  key's trigger refuses it: nothing written, the key looked up again), and a caller's
  transaction that missed such a key is told to roll back and run again.
- A job with ``after`` naming a job in job_history: done leaves it pending (the edge
  ended), dead or canceled cancels it or lets it run per its policy. A graph is carried
  on by the claim statement's done (the move) and by a failure, and claim.upstream reads
  the upstream's result from job_history.
- An enqueue with ``after=[A]`` racing A's done by the claim statement (either one's
  transaction held open) never lets the downstream job start early and never loses
  the edge.
- A debounced job waiting behind its key's job moves up when that job ends by the claim
  statement; a durable handler's steps survive the job's end; a parent reads the records
  of children that ended (in job_history).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import brooq
import brooq.testing
from brooq.operator import reads
from brooq.producer.insert import KeyRace, _insert_many, _insert_one, drive
from brooq.sql import Q
from tests.db.test_cli import run
from tests.db.test_workflow_atomic import DOORS, Call, blocked_in_after
from tests.db.test_workflows import claim, fail
from tests.harness import covering, wait_for

Conn = psycopg.Connection[Any]
KeyDoor = Callable[[str, brooq.Queue, str, str], tuple[uuid.UUID, bool]]
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


# -- helpers -------------------------------------------------------------------------------


def finish(db: Conn, ids: list[uuid.UUID], worker: str = "w", results: bool = False) -> None:
    """The child's claim statement writing ``done`` for ``ids`` (their move to
    job_history), claiming nothing."""
    params: dict[str, Any] = {
        "done": ids,
        "worker": worker,
        "queue": "default",
        "topics": ["nothing.here"],
        "limit": 0,
        "children": 1,
        "lease": 30.0,
    }
    statement = Q.job_finish_and_claim
    if results:
        statement = Q.job_finish_and_claim_results
        params |= {
            "results": ['{"answer": 42}'] * len(ids),
            "reported": [],
            "fractions": [],
            "messages": [],
        }
    db.execute(statement, params)


def where(db: Conn, job_id: uuid.UUID) -> tuple[str, str] | None:
    """(the table holding the job, its state)."""
    row = db.execute(
        "SELECT 'job', state FROM job WHERE id = %s "
        "UNION ALL SELECT 'job_history', state FROM job_history WHERE id = %s",
        (job_id, job_id),
    ).fetchall()
    assert len(row) <= 1, row  # never in both
    return (str(row[0][0]), str(row[0][1])) if row else None


def ended_in(
    queue: brooq.Queue, db: Conn, how: str, topic: str, key: str | None = None
) -> uuid.UUID:
    """A job of ``topic`` (with idempotency key ``key``) ended ``how``: done by the claim
    statement, dead by a failure, canceled, or done before migration 0020 (a terminal
    row inserted straight into job, where the move trigger never saw it)."""
    if how == "legacy":
        job_id = uuid.uuid4()
        db.execute(
            "INSERT INTO job (id, topic, idempotency_key, state) VALUES (%s, %s, %s, 'done')",
            (job_id, topic, key),
        )
        assert where(db, job_id) == ("job", "done")
        return job_id
    job_id, created = queue.enqueue(brooq.Job(topic, idempotency_key=key))
    assert created
    if how == "canceled":
        assert queue.cancel(job_id) is True
    else:
        assert claim(db, topic) == [job_id]
        if how == "done":
            finish(db, [job_id])
        else:
            assert fail(db, job_id, final=True) == "dead"
    assert where(db, job_id) == ("job_history", how)
    return job_id


def keyed(db: Conn, topic: str, key: str) -> list[uuid.UUID]:
    rows = db.execute(
        "SELECT id FROM job_all WHERE topic = %s AND idempotency_key = %s", (topic, key)
    ).fetchall()
    return [r[0] for r in rows]


# -- the doors of a keyed job --------------------------------------------------------------


def _queue_enqueue(dsn: str, queue: brooq.Queue, topic: str, key: str) -> tuple[uuid.UUID, bool]:
    return queue.enqueue(brooq.Job(topic, idempotency_key=key))


def _queue_enqueue_tags(
    dsn: str, queue: brooq.Queue, topic: str, key: str
) -> tuple[uuid.UUID, bool]:
    return queue.enqueue(brooq.Job(topic, idempotency_key=key, tags=["x"]))


def _queue_enqueue_many(
    dsn: str, queue: brooq.Queue, topic: str, key: str
) -> tuple[uuid.UUID, bool]:
    fresh = f"fresh-{uuid.uuid4().hex}"
    got = queue.enqueue_many(
        [brooq.Job(topic, idempotency_key=fresh), brooq.Job(topic, idempotency_key=key)]
    )
    assert got[0][1] is True
    return got[1]


def _queue_enqueue_many_tags(
    dsn: str, queue: brooq.Queue, topic: str, key: str
) -> tuple[uuid.UUID, bool]:
    got = queue.enqueue_many([brooq.Job(topic), brooq.Job(topic, idempotency_key=key, tags=["x"])])
    return got[1]


def _queue_enqueue_async(
    dsn: str, queue: brooq.Queue, topic: str, key: str
) -> tuple[uuid.UUID, bool]:
    async def go() -> tuple[uuid.UUID, bool]:
        try:
            return await queue.enqueue_async(brooq.Job(topic, idempotency_key=key))
        finally:
            await queue.close_async()

    return asyncio.run(go())


def _queue_enqueue_many_async(
    dsn: str, queue: brooq.Queue, topic: str, key: str
) -> tuple[uuid.UUID, bool]:
    async def go() -> tuple[uuid.UUID, bool]:
        try:
            return (await queue.enqueue_many_async([brooq.Job(topic, idempotency_key=key)]))[0]
        finally:
            await queue.close_async()

    return asyncio.run(go())


def _enqueue_transaction(
    dsn: str, queue: brooq.Queue, topic: str, key: str
) -> tuple[uuid.UUID, bool]:
    with psycopg.connect(dsn) as conn:  # the caller's transaction, committed on exit
        return brooq.enqueue(conn, brooq.Job(topic, idempotency_key=key))


def _enqueue_autocommit(
    dsn: str, queue: brooq.Queue, topic: str, key: str
) -> tuple[uuid.UUID, bool]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return brooq.enqueue(conn, brooq.Job(topic, idempotency_key=key))


def _enqueue_many_transaction(
    dsn: str, queue: brooq.Queue, topic: str, key: str
) -> tuple[uuid.UUID, bool]:
    with psycopg.connect(dsn) as conn:
        return brooq.enqueue_many(conn, [brooq.Job(topic, idempotency_key=key)])[0]


def _enqueue_async_transaction(
    dsn: str, queue: brooq.Queue, topic: str, key: str
) -> tuple[uuid.UUID, bool]:
    async def go() -> tuple[uuid.UUID, bool]:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            return await brooq.enqueue_async(conn, brooq.Job(topic, idempotency_key=key))

    return asyncio.run(go())


def _enqueue_many_async_autocommit(
    dsn: str, queue: brooq.Queue, topic: str, key: str
) -> tuple[uuid.UUID, bool]:
    async def go() -> tuple[uuid.UUID, bool]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            job = brooq.Job(topic, idempotency_key=key)
            return (await brooq.enqueue_many_async(conn, [job]))[0]

    return asyncio.run(go())


def _traced_one(dsn: str, queue: brooq.Queue, topic: str, key: str) -> tuple[uuid.UUID, bool]:
    """The insert a producer span takes (job_insert_options_traced), driven without a
    global tracer provider."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return drive(conn, _insert_one(brooq.Job(topic, idempotency_key=key), {}, Q, PARENT))


def _traced_many(dsn: str, queue: brooq.Queue, topic: str, key: str) -> tuple[uuid.UUID, bool]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        batch = [brooq.Job(topic), brooq.Job(topic, idempotency_key=key)]
        return drive(conn, _insert_many(batch, {}, Q, PARENT))[1]


def _sqlalchemy_session(
    dsn: str, queue: brooq.Queue, topic: str, key: str
) -> tuple[uuid.UUID, bool]:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    orm = pytest.importorskip("sqlalchemy.orm")
    engine = sqlalchemy.create_engine(
        "postgresql+psycopg://",
        creator=lambda: psycopg.connect(dsn),
        poolclass=sqlalchemy.pool.NullPool,
    )
    try:
        with orm.Session(engine) as session, session.begin():
            return brooq.enqueue(session, brooq.Job(topic, idempotency_key=key))
    finally:
        engine.dispose()


_DJANGO = """
import sys
import django
from django.conf import settings
from psycopg.conninfo import conninfo_to_dict
import brooq

info = conninfo_to_dict(sys.argv[1])
settings.configure(DATABASES={"default": {
    "ENGINE": "django.db.backends.postgresql", "NAME": info["dbname"],
    "USER": info.get("user", ""), "HOST": info.get("host", ""),
    "PORT": str(info.get("port", "")),
}})
django.setup()
from django.db import connection, transaction

with transaction.atomic():
    job_id, created = brooq.enqueue(connection, brooq.Job(sys.argv[2], idempotency_key=sys.argv[3]))
print(job_id, created)
"""


def _django_atomic(dsn: str, queue: brooq.Queue, topic: str, key: str) -> tuple[uuid.UUID, bool]:
    pytest.importorskip("django")
    out = subprocess.run(
        [sys.executable, "-c", _DJANGO, dsn, topic, key], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    job_id, created = out.stdout.split()
    return uuid.UUID(job_id), created == "True"


def _cli(dsn: str, queue: brooq.Queue, topic: str, key: str) -> tuple[uuid.UUID, bool]:
    out = run("--database", dsn, "enqueue", topic, f"--key={key}")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    word, job_id = out.stdout.split()
    assert word in ("enqueued", "exists")
    return uuid.UUID(job_id), word == "enqueued"


KEY_DOORS: dict[str, KeyDoor] = {
    "Queue.enqueue": _queue_enqueue,
    "Queue.enqueue(tags)": _queue_enqueue_tags,
    "Queue.enqueue_many": _queue_enqueue_many,
    "Queue.enqueue_many(tags)": _queue_enqueue_many_tags,
    "Queue.enqueue_async": _queue_enqueue_async,
    "Queue.enqueue_many_async": _queue_enqueue_many_async,
    "brooq.enqueue(transaction)": _enqueue_transaction,
    "brooq.enqueue(autocommit)": _enqueue_autocommit,
    "brooq.enqueue_many(transaction)": _enqueue_many_transaction,
    "brooq.enqueue_async(transaction)": _enqueue_async_transaction,
    "brooq.enqueue_many_async(autocommit)": _enqueue_many_async_autocommit,
    "traced one": _traced_one,
    "traced many": _traced_many,
    "SQLAlchemy Session": _sqlalchemy_session,
    "django atomic()": _django_atomic,
    "brooq enqueue --key": _cli,
}
# The doors whose statement runs outside the caller's transaction: on a connection in
# autocommit a key taken meanwhile is looked up again (nothing was written);
# Queue.enqueue_many's batch runs in a transaction of brooq's own (brooq.queue), which the
# refusal aborts and brooq runs again.
AUTOCOMMIT_DOORS = [
    "Queue.enqueue",
    "Queue.enqueue(tags)",
    "Queue.enqueue_many",
    "Queue.enqueue_many(tags)",
    "Queue.enqueue_async",
    "Queue.enqueue_many_async",
    "brooq.enqueue(autocommit)",
    "brooq.enqueue_many_async(autocommit)",
    "traced one",
    "traced many",
    "brooq enqueue --key",
]


# -- idempotency keys ----------------------------------------------------------------------


# Every door meets every way a job ends, not each pair: the doors share the key's lookup,
# the ends share where the key is kept (brooq_job_key).
@pytest.mark.parametrize(
    ("door", "how"), covering(list(KEY_DOORS), ["done", "dead", "canceled", "legacy"])
)
def test_a_key_whose_job_ended_gives_that_job_back(
    door: str, how: str, dsn: str, queue: brooq.Queue, db: Conn
) -> None:
    key = f"order-{uuid.uuid4().hex[:8]}"
    first = ended_in(queue, db, how, "t", key)
    assert KEY_DOORS[door](dsn, queue, "t", key) == (first, False)
    assert keyed(db, "t", key) == [first]  # nothing written
    assert where(db, first) == (("job", "done") if how == "legacy" else ("job_history", how))
    # Once more, the key's row untouched by the refusals.
    assert KEY_DOORS[door](dsn, queue, "t", key) == (first, False)
    assert db.execute(
        "SELECT job_id FROM brooq_job_key WHERE topic = 't' AND idempotency_key = %s", (key,)
    ).fetchall() == [(first,)]


def test_a_batch_of_keys_half_of_them_ended(queue: brooq.Queue, db: Conn) -> None:
    ended = {f"k{i}": ended_in(queue, db, ("done", "dead")[i % 2], "b", f"k{i}") for i in range(6)}
    active = {f"a{i}": queue.enqueue(brooq.Job("b", idempotency_key=f"a{i}"))[0] for i in range(3)}
    jobs = [brooq.Job("b", idempotency_key=f"k{i}") for i in range(6)]
    jobs += [brooq.Job("b", idempotency_key=f"a{i}") for i in range(3)]
    jobs += [brooq.Job("b", idempotency_key=f"new{i}") for i in range(500)]
    jobs += [brooq.Job("b") for _ in range(500)]
    got = queue.enqueue_many(jobs)
    assert got[:9] == [(ended[f"k{i}"], False) for i in range(6)] + [
        (active[f"a{i}"], False) for i in range(3)
    ]
    assert all(created for _, created in got[9:])
    assert db.execute("SELECT count(*) FROM job_all WHERE topic = 'b'").fetchone() == (1009,)


def _hold_a_key_ended(holder: Conn, topic: str, key: str) -> uuid.UUID:
    """In ``holder``'s open transaction: a job with ``key`` inserted and ended (moved to
    job_history), neither committed: another statement's snapshot cannot see the key."""
    job_id = uuid.uuid4()
    holder.execute(
        "INSERT INTO job (id, topic, idempotency_key) VALUES (%s, %s, %s)", (job_id, topic, key)
    )
    holder.execute("UPDATE job SET state = 'done' WHERE id = %s", (job_id,))
    return job_id


def _blocked_on_the_holder(db: Conn, holder: Conn) -> bool:
    row = db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND %s = ANY(pg_blocking_pids(pid))",
        (holder.info.backend_pid,),
    ).fetchone()
    return row is not None and row[0] > 0


@pytest.mark.parametrize("door", AUTOCOMMIT_DOORS)
def test_a_key_enqueued_and_ended_while_the_statement_ran_is_looked_up(
    door: str, dsn: str, queue: brooq.Queue, db: Conn, connect: Callable[..., Conn]
) -> None:
    """The statement's NOT EXISTS cannot see a key committed after it began; the key's
    trigger then refuses the insert (unique_violation on brooq_job_key_pkey). On a
    connection in autocommit nothing was written: the door looks the key up."""
    key = f"race-{uuid.uuid4().hex[:8]}"
    holder = connect(autocommit=False)
    theirs = _hold_a_key_ended(holder, "t", key)
    call = Call(lambda: KEY_DOORS[door](dsn, queue, "t", key))
    wait_for(lambda: _blocked_on_the_holder(db, holder) or not call.running, what="a wait")
    holder.commit()
    assert call.result() == (theirs, False)
    assert keyed(db, "t", key) == [theirs]


def test_a_key_the_callers_transaction_missed_is_a_brooq_error(
    dsn: str, queue: brooq.Queue, db: Conn, connect: Callable[..., Conn]
) -> None:
    """In the caller's transaction the refusal aborts it: KeyRace, saying to roll back and
    run again (which then gives the key's job back)."""
    holder = connect(autocommit=False)
    theirs = _hold_a_key_ended(holder, "t", "k")
    with psycopg.connect(dsn) as conn:
        call = Call(lambda: brooq.enqueue(conn, brooq.Job("t", idempotency_key="k")))
        wait_for(lambda: _blocked_on_the_holder(db, holder), what="the enqueue to wait")
        holder.commit()
        with pytest.raises(KeyRace, match=f"belongs to job {theirs}.*roll it back"):
            call.result()
        conn.rollback()
        assert brooq.enqueue(conn, brooq.Job("t", idempotency_key="k")) == (theirs, False)
    assert keyed(db, "t", "k") == [theirs]


def test_a_repeatable_read_transaction_that_missed_a_key_is_refused(
    dsn: str, queue: brooq.Queue, db: Conn
) -> None:
    """PostgreSQL's own refusal: the key's trigger meets a row its snapshot cannot see."""
    with psycopg.connect(dsn) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.execute("SELECT 1")  # the snapshot
        theirs = ended_in(queue, db, "done", "t", "rr")
        with pytest.raises(psycopg.errors.SerializationFailure):
            brooq.enqueue(conn, brooq.Job("t", idempotency_key="rr"))
        conn.rollback()
        assert brooq.enqueue(conn, brooq.Job("t", idempotency_key="rr")) == (theirs, False)


def test_a_graph_in_brooqs_transaction_retries_a_key_taken_meanwhile(
    queue: brooq.Queue, db: Conn, connect: Callable[..., Conn]
) -> None:
    """A batch with after inserts in brooq's own transaction: the key's refusal aborts it,
    and the graph is written again, the key's job given back."""
    up, _ = queue.enqueue(brooq.Job("up"))
    holder = connect(autocommit=False)
    theirs = _hold_a_key_ended(holder, "t", "g")
    jobs = [brooq.Job("t", idempotency_key="g"), brooq.Job("down", after=[up])]
    call = Call(lambda: queue.enqueue_many(jobs))
    wait_for(lambda: _blocked_on_the_holder(db, holder), what="the enqueue to wait")
    holder.commit()
    (keyed_job, down) = call.result()
    assert keyed_job == (theirs, False) and down[1] is True
    assert where(db, down[0]) == ("job", "waiting")


def test_a_key_released_with_its_partition_is_free_again(queue: brooq.Queue, db: Conn) -> None:
    """The key is its job's for the job's life: once the job's partition is released
    (its keys deleted), the key makes a new job."""
    first = ended_in(queue, db, "done", "t", "gone")
    db.execute("DELETE FROM brooq_job_key WHERE job_id = %s", (first,))
    db.execute("DELETE FROM job_history WHERE id = %s", (first,))
    again, created = queue.enqueue(brooq.Job("t", idempotency_key="gone"))
    assert created and again != first


# -- workflows -----------------------------------------------------------------------------


AFTER_ENDED = [
    ("done", "cancel", "pending"),
    ("legacy", "cancel", "pending"),
    ("dead", "cancel", "canceled"),
    ("canceled", "cancel", "canceled"),
    ("canceled", "run", "pending"),
]


@pytest.mark.parametrize(
    ("door", "how", "policy", "expected"),
    [(door, *case) for door, case in covering(list(DOORS), AFTER_ENDED)],
)
def test_after_names_a_job_in_history(
    door: str, how: str, policy: str, expected: str, dsn: str, queue: brooq.Queue, db: Conn
) -> None:
    up = ended_in(queue, db, how, f"up.{uuid.uuid4().hex[:8]}")
    job = brooq.Job("sink", after=[up], on_upstream_failure=policy)  # type: ignore[arg-type]
    job_id = DOORS[door](dsn, queue, job)
    table = "job_history" if expected == "canceled" else "job"
    assert where(db, job_id) == (table, expected)
    edge = db.execute(
        "SELECT upstream_id, ended FROM brooq_job_edge WHERE downstream_id = %s", (job_id,)
    ).fetchall()
    assert edge == [(up, True)]
    row = db.execute(
        "SELECT d.upstream_open, d.available_at < now() + interval '1 hour', u.has_downstream "
        "FROM job_all AS d, job_all AS u WHERE d.id = %s AND u.id = %s",
        (job_id, up),
    ).fetchone()
    # open 0 (canceled: its failure counted instead); its own available_at; the upstream
    # flagged (kept while a job reads it).
    assert row == (0, True, True)
    if expected == "pending":
        assert claim(db, "sink") == [job_id]


@pytest.mark.parametrize("policy", ["cancel", "run"])
@pytest.mark.parametrize("end", ["done", "dead"])
def test_a_graph_goes_on_when_its_upstream_moves_to_history(
    end: str, policy: str, queue: brooq.Queue, db: Conn
) -> None:
    """Done by the claim statement (the move: job_history_ended carries the graph on) or
    dead by a failure (the UPDATE's triggers, then job_zz_history's move)."""
    topic = f"up.{uuid.uuid4().hex[:8]}"
    [(up, _), (down, _), (below, _)] = queue.enqueue_many(
        [
            a := brooq.Job(topic),
            b := brooq.Job("down", after=[a], on_upstream_failure=policy),  # type: ignore[arg-type]
            brooq.Job("below", after=[b]),
        ]
    )
    assert where(db, down) == ("job", "waiting")
    assert claim(db, topic) == [up]
    if end == "done":
        finish(db, [up], results=True)
    else:
        assert fail(db, up, final=True) == "dead"
    assert where(db, up) == ("job_history", end)
    if end == "dead" and policy == "cancel":
        assert where(db, down) == ("job_history", "canceled")
        assert where(db, below) == ("job_history", "canceled")
        return
    assert where(db, down) == ("job", "pending")
    assert where(db, below) == ("job", "waiting")
    # claim.upstream (and brooq jobs show) read the upstream's record in job_history.
    (record,) = reads.upstream(db, down)
    assert (record.id, record.state) == (up, end)
    if end == "done":
        assert record.result == {"answer": 42}
    assert claim(db, "down") == [down]
    finish(db, [down])
    assert where(db, below) == ("job", "pending")


@pytest.mark.parametrize(("door", "outcome"), covering(list(DOORS), ["commit", "rollback"]))
def test_an_enqueue_racing_its_upstreams_done(
    door: str, outcome: str, dsn: str, queue: brooq.Queue, db: Conn, connect: Callable[..., Conn]
) -> None:
    """The claim statement's done of A held open in its transaction; an enqueue naming A
    waits for it (brooq_job_after locks A's row), then reads A where that left it."""
    topic = f"up.{uuid.uuid4().hex[:8]}"
    up, _ = queue.enqueue(brooq.Job(topic))
    assert claim(db, topic) == [up]
    worker = connect(autocommit=False)
    finish(worker, [up])  # not committed: A deleted from job, in job_history, unseen
    job = brooq.Job("sink", after=[up])
    call = Call(lambda: DOORS[door](dsn, queue, job))
    wait_for(lambda: blocked_in_after(db) or not call.running, what="the enqueue to block")
    assert call.running
    assert db.execute("SELECT count(*) FROM job_all WHERE topic = 'sink'").fetchone() == (0,)
    assert claim(db, "sink") == []
    if outcome == "commit":
        worker.commit()
    else:
        worker.rollback()
    job_id = call.result()
    edge = db.execute(
        "SELECT ended FROM brooq_job_edge WHERE downstream_id = %s AND upstream_id = %s",
        (job_id, up),
    ).fetchall()
    if outcome == "commit":
        assert where(db, up) == ("job_history", "done")
        assert where(db, job_id) == ("job", "pending") and edge == [(True,)]
        assert claim(db, "sink") == [job_id]
        return
    # A still runs: the job waits for it, and goes on when A's done is written again.
    assert where(db, up) == ("job", "processing")
    assert where(db, job_id) == ("job", "waiting") and edge == [(False,)]
    assert claim(db, "sink") == []
    finish(db, [up])
    assert where(db, job_id) == ("job", "pending")
    assert claim(db, "sink") == [job_id]


def test_a_done_racing_an_enqueue_held_in_the_callers_transaction(
    dsn: str, queue: brooq.Queue, db: Conn, connect: Callable[..., Conn]
) -> None:
    """The other order: the enqueue's transaction holds A's row (its edge written, A
    flagged has_downstream); the claim statement's done waits for it, then moves the row
    as the enqueue left it, and job_history_ended carries the graph on."""
    topic = f"up.{uuid.uuid4().hex[:8]}"
    up, _ = queue.enqueue(brooq.Job(topic))
    assert claim(db, topic) == [up]
    worker = connect(autocommit=True)
    with psycopg.connect(dsn) as conn:
        job_id, _ = brooq.enqueue(conn, brooq.Job("sink", after=[up]))
        done = Call(lambda: finish(worker, [up]))
        wait_for(lambda: _blocked_on_the_holder(db, conn), what="the done to wait")
        assert where(db, up) == ("job", "processing")
    done.result()  # the enqueue committed on leaving the block
    assert where(db, up) == ("job_history", "done")
    assert where(db, job_id) == ("job", "pending")
    assert db.execute(
        "SELECT ended FROM brooq_job_edge WHERE downstream_id = %s", (job_id,)
    ).fetchall() == [(True,)]
    assert claim(db, "sink") == [job_id]


def test_after_names_an_unknown_id_still_refused(queue: brooq.Queue, db: Conn) -> None:
    missing = uuid.uuid4()
    with pytest.raises(brooq.InvalidAfter, match=f"after names job {missing}"):
        queue.enqueue(brooq.Job("sink", after=[missing]))
    assert db.execute("SELECT count(*) FROM job_all").fetchone() == (0,)


# -- unique keys and debounce --------------------------------------------------------------


@pytest.mark.parametrize("end", ["done", "dead"])
def test_a_debounced_job_moves_up_when_its_keys_job_moves_to_history(
    end: str, queue: brooq.Queue, db: Conn
) -> None:
    head, _ = queue.enqueue(brooq.Job("deb", unique_key="u", debounce=0.001))
    db.execute("UPDATE job SET available_at = now() WHERE id = %s", (head,))
    assert claim(db, "deb") == [head]
    waiting, created = queue.enqueue(brooq.Job("deb", {"n": 2}, unique_key="u", debounce=0.001))
    assert created and waiting != head
    row = db.execute("SELECT start_after IS NOT NULL FROM job WHERE id = %s", (waiting,))
    assert row.fetchone() == (True,)
    if end == "done":
        finish(db, [head])
    else:
        assert fail(db, head, final=True) == "dead"
    assert where(db, head) == ("job_history", end)
    row = db.execute(
        "SELECT state, start_after, available_at < now() + interval '1 minute' FROM job "
        "WHERE id = %s",
        (waiting,),
    )
    assert row.fetchone() == ("pending", None, True)
    # The key is free of its ended job: the next enqueue joins the one now ahead.
    assert queue.enqueue(brooq.Job("deb", {"n": 3}, unique_key="u", debounce=0.001)) == (
        waiting,
        False,
    )


def test_a_unique_key_whose_job_ended_makes_a_new_job(queue: brooq.Queue, db: Conn) -> None:
    first, _ = queue.enqueue(brooq.Job("uk", unique_key="u"))
    assert queue.enqueue(brooq.Job("uk", unique_key="u")) == (first, False)
    assert claim(db, "uk") == [first]
    finish(db, [first])
    second, created = queue.enqueue(brooq.Job("uk", unique_key="u"))
    assert created and second != first
    assert queue.enqueue_many([brooq.Job("uk", unique_key="u")]) == [(second, False)]


# -- durable handlers ----------------------------------------------------------------------


def test_steps_and_children_survive_their_jobs_end(queue: brooq.Queue, db: Conn) -> None:
    @queue.handler("h.parent")
    def parent(claim: brooq.Claim[Any]) -> Any:
        first = claim.step("first", lambda: 1)
        kids = [claim.spawn(brooq.Job("h.child", {"i": i})) for i in range(2)]
        records = claim.wait_jobs(kids)
        return [first, *[r.result for r in records], *[r.state for r in records]]

    @queue.handler("h.child")
    def child(claim: brooq.Claim[Any]) -> Any:
        return claim.payload["i"] * 10

    parent_id, _ = queue.enqueue(brooq.Job("h.parent"))
    for _ in range(10):
        brooq.testing.drain(queue)
        if where(db, parent_id) == ("job_history", "done"):
            break
    assert where(db, parent_id) == ("job_history", "done")
    row = db.execute("SELECT result FROM job_history WHERE id = %s", (parent_id,)).fetchone()
    assert row == ([1, 0, 10, "done", "done"],)
    names = db.execute(
        "SELECT name FROM brooq_job_step WHERE job_id = %s ORDER BY created_at, name",
        (parent_id,),
    ).fetchall()
    assert [n[0] for n in names] == ["first", "__spawn:0", "__spawn:1", "__wait_jobs:0"]
    durable = reads.durable(db, parent_id)
    assert durable is not None and "first" in [step["name"] for step in durable["steps"]]
    children = reads.children(db, parent_id)
    assert [c.state for c in children] == ["done", "done"]


def test_a_parent_waiting_for_children_that_already_ended(queue: brooq.Queue, db: Conn) -> None:
    """wait_jobs naming children in job_history: no park, their records read there."""
    kids = [ended_in(queue, db, how, "h.kid") for how in ("done", "dead", "canceled")]

    @queue.handler("h.late")
    def late(claim: brooq.Claim[Any]) -> Any:
        return [r.state for r in claim.wait_jobs(kids)]

    parent_id, _ = queue.enqueue(brooq.Job("h.late"))
    brooq.testing.drain(queue)
    assert where(db, parent_id) == ("job_history", "done")
    row = db.execute("SELECT result FROM job_history WHERE id = %s", (parent_id,)).fetchone()
    assert row == (["done", "dead", "canceled"],)
