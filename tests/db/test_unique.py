"""unique_key against a real PostgreSQL: at most one pending, failed or processing job per
(topic, key), through every producer path and racing producers on their own
connections; the key free again once its job is done, dead or canceled; no transition of
the worker's, the master's or the operator's SQL breaking the index; a retry refused
while another job holds the key, naming it (one job, in bulk, by the CLI).

The transitions are the real statements (brooq/sql's claim, outcomes, reaper, release),
run on connections of the test's own."""

from __future__ import annotations

import asyncio
import random
import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import brooq
from brooq.sql import Q
from tests.db.test_cli import refused, run

Conn = psycopg.Connection[Any]
ACTIVE = ("pending", "failed", "processing")


def claim(db: Conn, topic: str = "t", limit: int = 10, worker: str = "w") -> list[uuid.UUID]:
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
    return [row["id"] for row in rows if row["claimed"]]


def finish(db: Conn, ids: list[uuid.UUID], worker: str = "w") -> None:
    """The child's `done` of ``ids`` (the same statement, claiming nothing)."""
    db.execute(
        Q.job_finish_and_claim,
        {
            "done": ids,
            "worker": worker,
            "queue": "default",
            "topics": ["t"],
            "limit": 0,
            "children": 1,
            "lease": 30.0,
        },
    ).fetchall()


def fail(db: Conn, job_id: uuid.UUID, *, max_attempts: int = 5, worker: str = "w") -> str | None:
    """The child's failed attempt: failed, or dead past ``max_attempts``; None when the job
    is not ``worker``'s (the guard)."""
    row = db.execute(
        Q.job_set_failed,
        {
            "id": job_id,
            "worker": worker,
            "refund": False,
            "max_attempts": max_attempts,
            "delay": 0.0,
            "error": "boom",
            "history_error": "boom",
            "kind": "raised",
            "traceback": None,
        },
    ).fetchone()
    return None if row is None else str(row["state"])


def active(db: Conn, key: str, topic: str = "t") -> list[uuid.UUID]:
    rows = db.execute(
        "SELECT id FROM job_all WHERE topic = %s AND unique_key = %s AND state = ANY(%s) "
        "ORDER BY created_at, id",
        (topic, key, list(ACTIVE)),
    ).fetchall()
    return [row["id"] for row in rows]


def state(db: Conn, job_id: uuid.UUID) -> str:
    row = db.execute("SELECT state FROM job_all WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row["state"])


@pytest.fixture
def conn(connect: Callable[..., Conn]) -> Conn:
    return connect()


def test_enqueue_returns_the_active_job_of_the_key(queue: brooq.Queue, conn: Conn) -> None:
    first, created = queue.enqueue(brooq.Job("t", 1, unique_key="k"))
    assert created
    assert queue.enqueue(brooq.Job("t", 2, unique_key="k")) == (first, False)
    # the caller's transaction, sync and async, and a batch
    with queue.transaction() as tx:
        assert brooq.enqueue(tx, brooq.Job("t", 3, unique_key="k")) == (first, False)

    async def in_async() -> tuple[uuid.UUID, bool]:
        try:
            return await queue.enqueue_async(brooq.Job("t", 4, unique_key="k"))
        finally:
            await queue.close_async()

    assert asyncio.run(in_async()) == (first, False)
    batch = queue.enqueue_many(
        [
            brooq.Job("t", 5, unique_key="k"),
            brooq.Job("t", 6, unique_key="new"),
            brooq.Job("t", 7, unique_key="new"),  # the same key earlier in the batch
            brooq.Job("other", 8, unique_key="k"),  # another topic: another key
            brooq.Job("t", 9),
        ]
    )
    assert batch[0] == (first, False)
    assert batch[1][1] and batch[2] == (batch[1][0], False)
    assert batch[3][1] and batch[4][1]
    assert active(conn, "k") == [first]
    record = queue.get(first)
    assert record is not None and record.payload == 1 and record.unique_key == "k"
    assert record.start_after is None and record.tags == []


def test_a_key_and_an_idempotency_key_together(queue: brooq.Queue, conn: Conn) -> None:
    """Either index may answer "already there"; an idempotency key keeps its meaning: one
    job for the key's whole life, however its unique key fares."""
    job_id, _ = queue.enqueue(brooq.Job("t", 1, unique_key="k", idempotency_key="i"))
    assert queue.enqueue(brooq.Job("t", 2, unique_key="k", idempotency_key="j"))[1] is False
    queue.cancel(job_id)
    assert queue.enqueue(brooq.Job("t", 3, unique_key="k", idempotency_key="i")) == (
        job_id,
        False,
    )
    assert queue.enqueue_many([brooq.Job("t", 4, unique_key="x", idempotency_key="i")]) == [
        (job_id, False)
    ]
    again, created = queue.enqueue(brooq.Job("t", 5, unique_key="k"))
    assert created and again != job_id


@pytest.mark.parametrize("end", ["done", "dead", "canceled"])
def test_the_key_is_free_again_once_its_job_ends(queue: brooq.Queue, conn: Conn, end: str) -> None:
    first, _ = queue.enqueue(brooq.Job("t", 1, unique_key="k"))
    assert claim(conn) == [first]
    assert queue.enqueue(brooq.Job("t", 2, unique_key="k")) == (first, False)  # processing
    if end == "done":
        finish(conn, [first])
    elif end == "dead":
        assert fail(conn, first, max_attempts=1) == "dead"
    else:
        assert queue.cancel(first)
    assert state(conn, first) == end
    second, created = queue.enqueue(brooq.Job("t", 3, unique_key="k"))
    assert created and second != first
    assert active(conn, "k") == [second]


def test_no_transition_of_the_sql_breaks_the_index(queue: brooq.Queue, conn: Conn) -> None:
    """A key's job through failed, reaped, released and claimed again keeps the key; each
    enqueue meanwhile answers that job."""
    job_id, _ = queue.enqueue(brooq.Job("t", 1, unique_key="k"))

    def still_the_key() -> None:
        assert queue.enqueue(brooq.Job("t", 0, unique_key="k")) == (job_id, False)
        assert active(conn, "k") == [job_id]

    assert claim(conn) == [job_id]
    still_the_key()
    assert fail(conn, job_id) == "failed"
    still_the_key()
    assert claim(conn) == [job_id]
    conn.execute("UPDATE job SET locked_until = now() - interval '1 s' WHERE id = %s", (job_id,))
    assert [r["id"] for r in conn.execute(Q.job_reap_expired, {"max_expiries": 5})] == [job_id]
    assert state(conn, job_id) == "pending"
    still_the_key()
    assert claim(conn) == [job_id]
    released = conn.execute(Q.job_release_ids, {"ids": [job_id], "worker": "w"}).fetchall()
    assert [r["id"] for r in released] == [job_id]
    still_the_key()
    assert claim(conn) == [job_id]
    finish(conn, [job_id])
    assert state(conn, job_id) == "done" and active(conn, "k") == []


def test_racing_producers_never_make_two_active_jobs(
    connect: Callable[..., Conn], conn: Conn
) -> None:
    """8 producers on connections of their own enqueue the same key at the same moment,
    round after round (the key's job canceled between rounds, or left to the next one):
    each round one job is created, and every producer is answered its id."""
    producers = 8
    rounds = 40
    conns = [connect() for _ in range(producers)]
    barrier = threading.Barrier(producers)
    answers: list[list[tuple[uuid.UUID, bool]]] = [[] for _ in range(rounds)]
    errors: list[BaseException] = []
    lock = threading.Lock()

    def produce(n: int) -> None:
        try:
            for r in range(rounds):
                barrier.wait(10)
                got = brooq.enqueue(conns[n], brooq.Job("t", {"p": n}, unique_key=f"k{r % 2}"))
                with lock:
                    answers[r].append(got)
                barrier.wait(10)
                if n == 0 and r % 3 != 2:  # free the key between most rounds
                    conn.execute(Q.job_cancel, {"id": got[0], "from_states": list(ACTIVE)})
                barrier.wait(10)
        except BaseException as exc:  # reported below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for r, got in enumerate(answers):
        ids = {job_id for job_id, _ in got}
        created = [job_id for job_id, made in got if made]
        assert len(got) == producers and len(ids) == 1, (r, got)
        # a round after one that left its key's job active creates nothing
        assert len(created) == (0 if r >= 2 and (r - 2) % 3 == 2 else 1), (r, got)
    assert all(len(active(conn, key)) <= 1 for key in ("k0", "k1"))
    duplicates = conn.execute(
        "SELECT topic, unique_key FROM job_all WHERE unique_key IS NOT NULL AND state = ANY(%s) "
        "GROUP BY 1, 2 HAVING count(*) > 1",
        (list(ACTIVE),),
    ).fetchall()
    assert duplicates == []


def test_random_transitions_keep_one_active_job_per_key(
    queue: brooq.Queue, connect: Callable[..., Conn]
) -> None:
    """A seeded random walk over producers (plain and debounced), claims, outcomes, the
    reaper, releases, operator cancels and retries, on three keys: no statement fails on
    the unique indexes (but a refused retry), and after each step a key has at most one
    active job, at most one waiting one, and a waiting one only behind an active job."""
    conn = connect()
    rng = random.Random(20261203)
    keys = ("a", "b", "c")
    with_waiting = refused_retries = 0
    was_waiting: set[uuid.UUID] = set()
    promoted: set[uuid.UUID] = set()
    for step in range(400):
        key = rng.choice(keys)
        move = rng.choice(
            [
                "enqueue",
                "debounce",
                "claim",
                "done",
                "fail",
                "reap",
                "release",
                "cancel",
                "retry",
            ]
        )
        ids = [
            r["id"] for r in conn.execute("SELECT id FROM job_all WHERE unique_key = %s", (key,))
        ]
        pick = rng.choice(ids) if ids else None
        if move == "enqueue":
            queue.enqueue(brooq.Job("t", step, unique_key=key))
        elif move == "debounce":
            queue.enqueue(brooq.Job("t", step, unique_key=key, debounce=0.001))
        elif move == "claim":
            conn.execute("UPDATE job SET available_at = now() WHERE available_at < '9000-01-01'")
            claim(conn, limit=rng.randint(1, 3))
        elif move == "done":
            running = conn.execute("SELECT id FROM job_all WHERE state = 'processing'").fetchall()
            finish(conn, [r["id"] for r in running][: rng.randint(1, 3)])
        elif move == "fail" and pick is not None:
            fail(conn, pick, max_attempts=rng.choice([1, 5]))
        elif move == "reap":
            conn.execute(
                "UPDATE job SET locked_until = now() - interval '1 s' WHERE state = 'processing'"
            )
            conn.execute(Q.job_reap_expired, {"max_expiries": rng.choice([1, 5])}).fetchall()
        elif move == "release" and pick is not None:
            conn.execute(Q.job_release_ids, {"ids": [pick], "worker": "w"}).fetchall()
        elif move == "cancel" and pick is not None:
            queue.cancel(pick)
        elif move == "retry" and pick is not None and not queue.retry(pick):
            refusal = str(queue.explain_refusal(pick, "retry"))
            assert "cannot retry" in refusal, refusal
            refused_retries += "unique_key" in refusal
        for k in keys:
            rows = conn.execute(
                "SELECT id, state, start_after, available_at FROM job_all "
                "WHERE unique_key = %s AND state = ANY(%s)",
                (k, list(ACTIVE)),
            ).fetchall()
            heads = [r for r in rows if r["start_after"] is None]
            waiting = [r for r in rows if r["start_after"] is not None]
            assert len(heads) <= 1 and len(waiting) <= 1, (step, move, rows)
            assert all(r["state"] == "pending" and r["available_at"].year == 9999 for r in waiting)
            assert not waiting or heads, (step, move, rows)  # never left behind nobody
            with_waiting += bool(waiting)
            was_waiting.update(r["id"] for r in waiting)
            promoted.update(r["id"] for r in heads if r["id"] in was_waiting)
    # the walk went where the rules matter (a seed that did not would prove little)
    assert with_waiting > 20 and refused_retries > 0 and len(promoted) > 3, (
        with_waiting,
        refused_retries,
        len(promoted),
    )


def test_a_retry_is_refused_while_another_job_holds_the_key(
    queue: brooq.Queue, conn: Conn, dsn: str
) -> None:
    old, _ = queue.enqueue(brooq.Job("t", 1, unique_key="k"))
    assert queue.cancel(old)
    new, created = queue.enqueue(brooq.Job("t", 2, unique_key="k"))
    assert created
    assert queue.retry(old) is False
    refusal = queue.explain_refusal(old, "retry")
    assert isinstance(refusal, brooq.InvalidTransition)
    assert str(refusal) == (
        f"cannot retry job {old}: its unique_key 'k' is taken by job {new} (pending); "
        "retry it once that job is done, dead or canceled"
    )
    assert state(conn, old) == "canceled"
    line = refused(dsn, "retry", str(old), code=1)
    assert f"taken by job {new}" in line
    # inside the caller's transaction the refusal leaves it usable
    with queue.transaction() as tx:
        from brooq.operator import changes

        assert changes.retry(tx, old) is False
        assert tx.execute("SELECT 1").fetchone() == (1,)
    # once the key is free, the retry goes through
    assert queue.cancel(new)
    assert queue.retry(old)
    assert active(conn, "k") == [old]


def test_a_bulk_retry_leaves_the_jobs_whose_key_is_taken_and_names_the_holder(
    queue: brooq.Queue, conn: Conn, dsn: str
) -> None:
    """Two dead jobs of one free key: the first comes back, the second is named with it;
    a dead job whose key an active job holds is named with that job; keyless ones and a
    free key come back."""
    ids = {}
    for name, key in (("a1", "ka"), ("a2", "ka"), ("b", "kb"), ("c", "kc"), ("plain", None)):
        ids[name], _ = queue.enqueue(brooq.Job("t", name, unique_key=key))
        assert claim(conn) == [ids[name]]
        assert fail(conn, ids[name], max_attempts=1) == "dead"
    holder, _ = queue.enqueue(brooq.Job("t", "holder", unique_key="kb"))
    result = queue.retry_many(topic="t", state="dead")
    assert (result.matched, result.changed, result.key_taken) == (5, 3, 2)
    assert dict(result.taken) == {ids["a2"]: ids["a1"], ids["b"]: holder}
    assert result.to_dict()["taken"] == [
        {"job": str(j), "held_by": str(h)} for j, h in sorted(result.taken)
    ]
    states = [state(conn, ids[n]) for n in ("a1", "a2", "b", "c", "plain")]
    assert states == ["pending", "dead", "dead", "pending", "pending"]
    # the command names them too
    assert queue.cancel(ids["a1"])
    out = run("--database", dsn, "retry", "--topic", "t", "--state", "dead", "--yes")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1] == "retried 1 of 2: pending now, attempts reset", out.stdout
    assert lines[2].startswith("1 not retried: another active job holds their unique_key")
    assert lines[3] == f"  {ids['b']}: its key is held by job {holder}"
    assert state(conn, ids["a2"]) == "pending"


def test_a_retried_waiting_job_comes_back_as_its_keys_job(queue: brooq.Queue, conn: Conn) -> None:
    head, _ = queue.enqueue(brooq.Job("t", 1, unique_key="k", debounce=0.001))
    conn.execute("UPDATE job SET available_at = now() WHERE id = %s", (head,))
    assert claim(conn) == [head]
    waiting, created = queue.enqueue(brooq.Job("t", 2, unique_key="k", debounce=0.001))
    assert created
    assert queue.cancel(waiting)
    finish(conn, [head])
    assert queue.retry(waiting)
    row = conn.execute(
        "SELECT state, start_after FROM job_all WHERE id = %s", (waiting,)
    ).fetchone()
    assert row == {"state": "pending", "start_after": None}
    assert claim(conn) == [waiting]


def test_brooq_enqueue_takes_the_options(dsn: str, conn: Conn) -> None:
    from tests.db.test_cli import ok

    first = ok(dsn, "enqueue", "t", "--unique-key", "k", "--tag", "a", "--tag", "b:1").split()
    assert first[0] == "enqueued"
    again = ok(dsn, "enqueue", "t", "--unique-key", "k", "--payload", "2").split()
    assert again == ["exists", first[1]]
    folded = ok(dsn, "enqueue", "t", "--unique-key", "d", "--debounce", "2s", "--payload", "1")
    assert ok(dsn, "enqueue", "t", "--unique-key", "d", "--debounce", "2s", "--payload", "2") == (
        folded.replace("enqueued", "exists")
    )
    rows = conn.execute(
        "SELECT unique_key, tags, payload FROM job_all ORDER BY unique_key"
    ).fetchall()
    assert [tuple(r.values()) for r in rows] == [("d", None, 2), ("k", ["a", "b:1"], None)]
    for args, option in (
        (["--debounce", "2s"], "--debounce"),
        (["--unique-key", "k", "--debounce", "2"], "--debounce"),
        (["--unique-key", "k", "--debounce", "2s", "--key", "i"], "--debounce"),
        (["--tag", "a b"], "--tag"),
        (["--unique-key", "k" * 1025], "--unique-key"),
    ):
        line = refused(dsn, "enqueue", "t", *args, code=2)
        assert f"'{option}'" in line or option in line, line
