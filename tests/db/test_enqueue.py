"""The producer side against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

import brooq
from brooq.errors import DatabaseUnavailable, InvalidDsn
from brooq.producer import insert


def count(db: psycopg.Connection[tuple[object, ...]]) -> int:
    row = db.execute("SELECT count(*) FROM job_all").fetchone()
    assert row is not None
    return int(row[0])  # type: ignore[call-overload]


def test_queue_opens_nothing_until_first_use() -> None:
    q = brooq.Queue("postgresql://nobody@127.0.0.1:1/nothing")
    q.handler("a")(lambda claim: None)
    assert q._pools._pool is None and q._line is None


def test_enqueue_creates_a_pending_row(queue: brooq.Queue, db: psycopg.Connection) -> None:
    job_id, created = queue.enqueue(brooq.Job("email.send", {"to": "a@example.org"}))
    assert created is True and isinstance(job_id, uuid.UUID)
    record = queue.get(job_id)
    assert record is not None
    assert (record.topic, record.payload, record.state, record.attempts) == (
        "email.send",
        {"to": "a@example.org"},
        "pending",
        0,
    )
    assert record.locked_by is None and record.locked_until is None
    assert record.available_at <= datetime.now(timezone.utc)


def test_get_unknown_returns_none_and_bad_id_raises(queue: brooq.Queue) -> None:
    assert queue.get(uuid.uuid4()) is None
    assert queue.get(str(uuid.uuid4())) is None
    with pytest.raises(brooq.InvalidJobId, match="not a UUID"):
        queue.get("42")


def test_available_at_in_the_future(queue: brooq.Queue) -> None:
    when = datetime.now(timezone.utc) + timedelta(hours=1)
    job_id, _ = queue.enqueue(brooq.Job("later", available_at=when))
    record = queue.get(job_id)
    assert record is not None and abs((record.available_at - when).total_seconds()) < 0.001


def test_enqueue_many_in_one_statement(queue: brooq.Queue, db: psycopg.Connection) -> None:
    jobs = [brooq.Job("bulk", {"n": i}) for i in range(500)]
    result = queue.enqueue_many(jobs)
    assert len(result) == 500 and all(created for _, created in result)
    assert len({job_id for job_id, _ in result}) == 500
    payloads = dict(db.execute("SELECT id, payload FROM job_all").fetchall())
    assert [payloads[job_id]["n"] for job_id, _ in result] == list(range(500))
    assert queue.enqueue_many([]) == []


def test_a_batch_over_many_copy_blocks_keeps_every_job_in_order(
    queue: brooq.Queue, db: psycopg.Connection
) -> None:
    """A batch larger than a COPY block is written a block at a time, sync and async and
    in the caller's transaction: every job once, each with its own payload and id, the
    last block a part one."""
    from brooq.producer.insert import COPY_BLOCK

    n = 2 * COPY_BLOCK + 7
    jobs = [brooq.Job("bulk", {"n": i, "s": "\\" * (i % 3)}) for i in range(n)]

    async def enqueue_async() -> list[tuple[uuid.UUID, bool]]:
        try:
            return await queue.enqueue_many_async(jobs)
        finally:
            await queue.close_async()

    with db.transaction():
        own = brooq.enqueue_many(db, jobs)
    for result in (queue.enqueue_many(jobs), asyncio.run(enqueue_async()), own):
        assert len(result) == n and all(created for _, created in result)
        ids = [job_id for job_id, _ in result]
        payloads = dict(
            db.execute("SELECT id, payload FROM job WHERE id = ANY(%s)", (ids,)).fetchall()
        )
        assert [payloads[job_id] for job_id in ids] == [
            {"n": i, "s": "\\" * (i % 3)} for i in range(n)
        ]


def test_a_ready_batch_keeps_text_that_copy_must_escape(
    queue: brooq.Queue, db: psycopg.Connection
) -> None:
    # A batch of ready jobs without keys or options goes to COPY as text brooq writes
    # itself, sync and async: what COPY reads as special (backslash, \N, \., tab, new
    # line) must come back as it went in, in each of the columns it writes.
    awkward = {"s": "tab\there\nnew line \\ backslash \\N \\. é ✓ 'q' \"dq\"", "\\": [1.5]}
    jobs = [brooq.Job("mixed", {"i": i, **awkward}, priority=i - 2) for i in range(5)]
    jobs.append(brooq.Job("mixed", "\\", queue="other-queue"))

    async def enqueue_async() -> list[tuple[uuid.UUID, bool]]:
        try:
            return await queue.enqueue_many_async(jobs)
        finally:
            await queue.close_async()

    result = queue.enqueue_many(jobs) + asyncio.run(enqueue_async())
    assert all(created for _, created in result)
    stored = {
        r[0]: r[1:]
        for r in db.execute("SELECT id, payload, topic, queue, priority, state FROM job_all")
    }
    assert len(stored) == 12
    for n, (job_id, _) in enumerate(result):
        i = n % 6
        if i < 5:
            assert stored[job_id] == ({"i": i, **awkward}, "mixed", "default", i - 2, "pending")
        else:
            assert stored[job_id] == ("\\", "mixed", "other-queue", 0, "pending")


def test_enqueue_many_without_keys_keeps_every_field(
    queue: brooq.Queue, db: psycopg.Connection, dsn: str
) -> None:
    # Unkeyed batches go through COPY: text that COPY must escape, scheduled and ready
    # jobs mixed, the order of the ids as given, one wake-up for the whole batch.
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    awkward = {"s": "tab\there\nnew line \\ backslash \\N é ✓ 'q' \"dq\"", "n": [1.5, None]}
    jobs = [
        brooq.Job("mixed", {"i": i, **awkward}, available_at=later if i % 3 == 0 else None)
        for i in range(30)
    ]
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN brooq_job")
        result = queue.enqueue_many(jobs)
        notes = list(listener.notifies(timeout=0.5))
    assert len(notes) == 1
    assert all(created for _, created in result)
    rows = {
        r[0]: r[1:]
        for r in db.execute(
            "SELECT id, payload, available_at, available_at <= now() FROM job_all"
        ).fetchall()
    }
    for i, (job_id, _) in enumerate(result):
        payload, available_at, ready = rows[job_id]
        assert payload == {"i": i, **awkward}
        if i % 3 == 0:
            assert available_at == later and not ready
        else:
            assert ready
    assert [job_id for job_id, _ in result] == sorted(job_id for job_id, _ in result)


def test_enqueue_many_with_keys_inside_and_outside_the_batch(queue: brooq.Queue) -> None:
    existing, _ = queue.enqueue(brooq.Job("bulk", idempotency_key="k1"))
    result = queue.enqueue_many(
        [
            brooq.Job("bulk", idempotency_key="k1"),
            brooq.Job("bulk", idempotency_key="k2"),
            brooq.Job("bulk", idempotency_key="k2"),
            brooq.Job("other", idempotency_key="k1"),
            brooq.Job("bulk"),
        ]
    )
    assert result[0] == (existing, False)
    assert result[1][1] is True and result[2] == (result[1][0], False)
    assert result[3][1] is True and result[3][0] != existing
    assert result[4][1] is True


def test_idempotency_rules(queue: brooq.Queue, db: psycopg.Connection) -> None:
    a = queue.enqueue(brooq.Job("t", idempotency_key="order-42"))
    b = queue.enqueue(brooq.Job("t", {"different": True}, idempotency_key="order-42"))
    assert a[1] is True and b == (a[0], False)
    # The same key in another topic is another job.
    assert queue.enqueue(brooq.Job("u", idempotency_key="order-42"))[1] is True
    # "" means no key: never deduplicated.
    assert queue.enqueue(brooq.Job("t", idempotency_key=""))[1] is True
    assert queue.enqueue(brooq.Job("t", idempotency_key=""))[1] is True
    # " " is a real key.
    space = queue.enqueue(brooq.Job("t", idempotency_key=" "))
    assert space[1] is True and queue.enqueue(brooq.Job("t", idempotency_key=" ")) == (
        space[0],
        False,
    )
    # Terminal rows keep their key.
    assert queue.cancel(a[0]) is True
    assert queue.enqueue(brooq.Job("t", idempotency_key="order-42")) == (a[0], False)
    assert count(db) == 5


def test_idempotency_race_many_connections(dsn: str, db: psycopg.Connection) -> None:
    workers = 12
    barrier = threading.Barrier(workers)
    results: list[tuple[uuid.UUID, bool]] = []
    lock = threading.Lock()

    def produce() -> None:
        with psycopg.connect(dsn) as conn:
            barrier.wait()
            with conn.transaction():
                result = brooq.enqueue(conn, brooq.Job("race", idempotency_key="same"))
            with lock:
                results.append(result)

    threads = [threading.Thread(target=produce) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == workers
    assert sum(created for _, created in results) == 1
    assert len({job_id for job_id, _ in results}) == 1
    assert count(db) == 1


def test_enqueue_in_callers_transaction_commit_and_rollback(
    dsn: str, db: psycopg.Connection
) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE account (id int PRIMARY KEY, notified bool)")
        conn.commit()
        with conn.transaction():
            conn.execute("INSERT INTO account VALUES (1, true)")
            _job_id, created = brooq.enqueue(conn, brooq.Job("welcome", {"account": 1}))
            assert created
            assert count(db) == 0  # not visible before commit
        assert count(db) == 1

        with pytest.raises(RuntimeError), conn.transaction():
            conn.execute("INSERT INTO account VALUES (2, true)")
            with conn.cursor() as cur:  # a Cursor works as well as a Connection
                brooq.enqueue(cur, brooq.Job("welcome", {"account": 2}))
            raise RuntimeError("the caller's transaction fails")
        assert count(db) == 1
        row = db.execute("SELECT count(*) FROM account").fetchone()
        assert row is not None and row[0] == 1


def test_queue_transaction_commits_writes_and_jobs_together(
    queue: brooq.Queue, db: psycopg.Connection
) -> None:
    db.execute("CREATE TABLE note (body text)")
    with queue.transaction() as conn:
        conn.execute("INSERT INTO note VALUES ('x')")
        brooq.enqueue(conn, brooq.Job("note.added"))
    assert count(db) == 1
    with pytest.raises(ZeroDivisionError), queue.transaction() as conn:
        conn.execute("INSERT INTO note VALUES ('y')")
        brooq.enqueue(conn, brooq.Job("note.added"))
        1 / 0  # noqa: B018
    assert count(db) == 1
    row = db.execute("SELECT count(*) FROM note").fetchone()
    assert row is not None and row[0] == 1


def test_enqueue_async(dsn: str, db: psycopg.Connection) -> None:
    async def produce() -> tuple[uuid.UUID, bool]:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            async with aconn.transaction():
                first = await brooq.enqueue_async(aconn, brooq.Job("a", idempotency_key="k"))
            async with aconn.transaction():
                second = await brooq.enqueue_async(aconn, brooq.Job("a", idempotency_key="k"))
            assert second == (first[0], False)
            async with aconn.cursor() as cur:
                await brooq.enqueue_async(cur, brooq.Job("a"))
            await aconn.rollback()
            return first

    _job_id, created = asyncio.run(produce())
    assert created and count(db) == 1


def test_notify_once_per_transaction_and_only_for_ready_jobs(queue: brooq.Queue, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN brooq_job")
        queue.enqueue_many([brooq.Job("n") for _ in range(50)])
        with queue.transaction() as conn:
            for _ in range(5):
                brooq.enqueue(conn, brooq.Job("n"))
        later = datetime.now(timezone.utc) + timedelta(hours=1)
        queue.enqueue(brooq.Job("n", available_at=later))
        notes = list(listener.notifies(timeout=0.5))
    assert [n.channel for n in notes] == ["brooq_job", "brooq_job"]


def test_cancel_transitions(queue: brooq.Queue, db: psycopg.Connection) -> None:
    ids = {}
    for state in ("pending", "failed", "processing", "done", "dead", "canceled"):
        job_id, _ = queue.enqueue(brooq.Job("c"))
        db.execute(
            "UPDATE job SET state = %s, locked_by = 'w', locked_until = now() WHERE id = %s",
            (state, job_id),
        )
        ids[state] = job_id
    before = {s: queue.get(i) for s, i in ids.items()}
    for state in ("pending", "failed", "processing"):
        assert queue.cancel(ids[state]) is True
        record = queue.get(ids[state])
        assert record is not None and record.state == "canceled"
    for state in ("done", "dead", "canceled"):
        assert queue.cancel(ids[state]) is False
        assert queue.get(ids[state]) == before[state]  # terminal rows untouched
    assert queue.cancel(uuid.uuid4()) is False


def test_retry_transitions(queue: brooq.Queue, db: psycopg.Connection) -> None:
    job_id, _ = queue.enqueue(brooq.Job("r"))
    assert queue.retry(job_id) is False  # pending: nothing to retry
    db.execute("UPDATE job SET state='dead', attempts=5, last_error='boom' WHERE id=%s", (job_id,))
    assert queue.retry(job_id) is True
    record = queue.get(job_id)
    assert record is not None
    assert (record.state, record.attempts, record.last_error) == ("pending", 0, "boom")


BAD_JOBS = [
    (lambda: brooq.Job("Bad Topic"), brooq.InvalidTopic, "topic 'Bad Topic' does not match"),
    (lambda: brooq.Job("a" * 129), brooq.InvalidTopic, "limit is 128"),
    (lambda: brooq.Job("x;drop table job"), brooq.InvalidTopic, "does not match"),
    (lambda: brooq.Job(""), brooq.InvalidTopic, "does not match"),
    (lambda: brooq.Job(42), brooq.InvalidTopic, "must be a string"),  # type: ignore[arg-type]
    (lambda: brooq.Job("t", object()), brooq.InvalidPayload, "not JSON-serialisable"),
    (lambda: brooq.Job("t", {1j}), brooq.InvalidPayload, "not JSON-serialisable"),
    (lambda: brooq.Job("t", float("nan")), brooq.InvalidPayload, "not JSON-serialisable"),
    (lambda: brooq.Job("t", "a\u0000b"), brooq.InvalidPayload, r"\\u0000"),
    (lambda: brooq.Job("t", {"k\u0000": 1}), brooq.InvalidPayload, r"\\u0000"),
    (lambda: brooq.Job("t", "\ud800"), brooq.InvalidPayload, "unpaired surrogate"),
    (lambda: brooq.Job("t", b"bytes"), brooq.InvalidPayload, "not JSON-serialisable"),
    (
        lambda: brooq.Job("t", available_at=datetime(2030, 1, 1)),
        brooq.NaiveDatetime,
        "naive datetime",
    ),
    (lambda: brooq.Job("t", idempotency_key=5), brooq.InvalidIdempotencyKey, "string"),  # type: ignore[arg-type]
    (lambda: brooq.Job("t", idempotency_key="a\x00"), brooq.InvalidIdempotencyKey, "x00"),
]


@pytest.mark.parametrize(("make", "error", "message"), BAD_JOBS)
def test_bad_jobs_are_refused_with_the_reason(make, error, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=message) as info:
        make()
    assert isinstance(info.value, brooq.BrooqError)


def test_deep_nesting_is_refused() -> None:
    payload: list[object] = []
    for _ in range(10_000):
        payload = [payload]
    # Refused by the encoder at the recursion limit, or by the depth check after it when
    # the process's recursion limit lets the encoder go deeper (it failed so in a run of
    # tests/unit and tests/db under xdist, the limit left raised by an earlier test).
    with pytest.raises(brooq.InvalidPayload, match=r"nested (too deeply|more than 256 levels)"):
        brooq.Job("t", payload)


def test_literal_backslash_u0000_text_is_fine(queue: brooq.Queue) -> None:
    job_id, _ = queue.enqueue(brooq.Job("t", "\\u0000"))
    record = queue.get(job_id)
    assert record is not None and record.payload == "\\u0000"


def test_payload_size_limit_writes_nothing(dsn: str, db: psycopg.Connection) -> None:
    small = brooq.Queue(dsn, max_payload_bytes=1000)
    try:
        with pytest.raises(brooq.InvalidPayload, match="limit is 1000"):
            small.enqueue(brooq.Job("t", "x" * 1000))
        with pytest.raises(brooq.InvalidPayload, match="limit is 1000"):
            small.enqueue_many([brooq.Job("t", "ok"), brooq.Job("t", "x" * 1000)])
        with pytest.raises(brooq.InvalidPayload, match="limit is 1048576"):
            brooq.Queue(dsn).enqueue(brooq.Job("t", "x" * (1024 * 1024)))
        with psycopg.connect(dsn) as conn, pytest.raises(brooq.InvalidPayload):
            brooq.enqueue(conn, brooq.Job("t", "é" * 600), max_payload_bytes=1000)
        assert count(db) == 0
        small.enqueue(brooq.Job("t", "x" * 900))
        assert count(db) == 1
    finally:
        small.close()


def test_unreachable_database_error_hides_the_password() -> None:
    q = brooq.Queue("postgresql://brooq:s3cr3t-pw@127.0.0.1:1/brooq")
    with pytest.raises(DatabaseUnavailable) as info:
        q.enqueue(brooq.Job("t"))
    assert "s3cr3t-pw" not in str(info.value)
    assert "brooq@127.0.0.1:1/brooq" in str(info.value)


def test_bad_dsn_error_hides_the_dsn() -> None:
    with pytest.raises(InvalidDsn) as info:
        brooq.Queue("host=x password=s3cr3t-pw =broken").enqueue(brooq.Job("t"))
    assert "s3cr3t-pw" not in str(info.value)


def test_missing_schema_says_to_migrate(empty_dsn: str) -> None:
    q = brooq.Queue(empty_dsn)
    try:
        with pytest.raises(brooq.SchemaMissing, match="brooq migrate up"):
            q.enqueue(brooq.Job("t"))
    finally:
        q.close()


def test_pool_is_not_used_across_fork(queue: brooq.Queue) -> None:
    import os

    job_id, _ = queue.enqueue(brooq.Job("before.fork"))  # the enqueue line opens
    assert queue.get(job_id) is not None  # and the pool
    parent_pool = queue._pools._pool
    assert queue._line is not None and queue._line._conn is not None
    parent_backend = queue._line._conn.info.backend_pid
    pid = os.fork()
    if pid == 0:  # child: must open its own connections, not touch the parent's sockets
        code = 1
        try:
            child_id, _ = queue.enqueue(brooq.Job("in.child"))
            found = queue.get(child_id) is not None
            line = queue._line._conn if queue._line is not None else None
            if line is None or line.info.backend_pid == parent_backend:
                code = 4
            elif queue._pools._pool is parent_pool or not found:
                code = 3
            else:
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's connections still work, and are the same ones.
    after, created = queue.enqueue(brooq.Job("after.fork"))
    assert created and queue.get(after) is not None
    assert queue._line._conn.info.backend_pid == parent_backend
    assert queue._pools._pool is parent_pool


@pytest.mark.parametrize("factory", ["dict_row", "namedtuple_row", "server_cursor"])
def test_enqueue_whatever_the_callers_row_factory(
    dsn: str, db: psycopg.Connection, factory: str
) -> None:
    """Regression: brooq read its answers as row[0] on the caller's cursor, so a caller
    using dict_row got KeyError: 0 (and enqueue_many mis-unpacked dict keys)."""
    from psycopg.rows import dict_row, namedtuple_row

    row_factory = namedtuple_row if factory == "namedtuple_row" else dict_row
    with psycopg.connect(dsn, row_factory=row_factory) as conn:  # type: ignore[call-overload]
        with conn.transaction():
            one = brooq.enqueue(conn, brooq.Job("rf", idempotency_key="a"))
            again = brooq.enqueue(conn, brooq.Job("rf", idempotency_key="a"))
            many = insert.enqueue_many(
                conn, [brooq.Job("rf", idempotency_key="a"), brooq.Job("rf", idempotency_key="b")]
            )
        assert one[1] is True and again == (one[0], False)
        assert many[0] == (one[0], False) and many[1][1] is True
        # A cursor of the caller's (even a server-side one) keeps its own results.
        name = "mine" if factory == "server_cursor" else None
        with conn.transaction(), conn.cursor(name=name) as cur:  # type: ignore[call-overload]
            cur.execute("SELECT 42 AS answer")
            _job_id, created = brooq.enqueue(cur, brooq.Job("rf"))
            assert created and insert.enqueue_many(cur, [brooq.Job("rf")])[0][1] is True
            row = cur.fetchone()
            assert (
                row is not None and (row[0] if factory == "namedtuple_row" else row["answer"]) == 42
            )
    assert count(db) == 4


def test_enqueue_async_with_dict_rows(dsn: str, db: psycopg.Connection) -> None:
    from psycopg.rows import dict_row

    async def produce() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, row_factory=dict_row) as aconn:
            async with aconn.transaction():
                first = await brooq.enqueue_async(aconn, brooq.Job("a", idempotency_key="k"))
                second = await brooq.enqueue_async(aconn, brooq.Job("a", idempotency_key="k"))
            assert first[1] is True and second == (first[0], False)

    asyncio.run(produce())
    assert count(db) == 1


def test_an_answer_from_a_live_server_is_not_reported_as_unreachable(queue: brooq.Queue) -> None:
    """Regression: every OperationalError became "cannot reach the database", including a
    statement timeout or a too-large index row (SQLSTATE classes 54, 55, 57014)."""
    with pytest.raises(psycopg.errors.QueryCanceled), queue.transaction() as conn:
        conn.execute("SET LOCAL statement_timeout = '10ms'")
        conn.execute("SELECT pg_sleep(1)")
    assert queue.enqueue(brooq.Job("t"))[1] is True


def test_a_lost_session_is_reported_as_unreachable(queue: brooq.Queue) -> None:
    unreachable = pytest.raises(DatabaseUnavailable, match="cannot reach the database")
    with unreachable, queue.connection() as conn:
        conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    assert queue.enqueue(brooq.Job("t"))[1] is True  # the pool replaces the connection


def test_a_payload_that_holds_itself_is_refused() -> None:
    looped: dict[str, object] = {"a": 1}
    looped["self"] = looped
    with pytest.raises(brooq.InvalidPayload, match="holds itself"):
        brooq.Job("t", looped)
    shared = {"k": 1}  # the same dict twice is not a cycle
    assert brooq.Job("t", [shared, shared]).payload_json == '[{"k":1},{"k":1}]'


def test_enqueue_many_names_the_refused_job(dsn: str, db: psycopg.Connection[Any]) -> None:
    small = brooq.Queue(dsn, max_payload_bytes=100)
    fine = brooq.Job("t", "ok")
    too_big = brooq.Job("t", "x" * 200)
    try:
        with pytest.raises(brooq.InvalidPayload, match=r"^job 2: payload is 202 bytes .* 100$"):
            small.enqueue_many([fine, fine, too_big, fine])
        with pytest.raises(TypeError, match=r"^job 1: expected a brooq.Job, not dict$"):
            small.enqueue_many([fine, {"topic": "t"}])  # type: ignore[list-item]
        with psycopg.connect(dsn) as conn:
            with pytest.raises(brooq.InvalidPayload, match=r"^job 0: payload is 202 bytes"):
                insert.enqueue_many(conn, [too_big], max_payload_bytes=100)
            with pytest.raises(TypeError, match=r"^job 3: expected a brooq.Job, not str$"):
                insert.enqueue_many(conn, [fine, fine, fine, "t"])  # type: ignore[list-item]
        assert count(db) == 0
    finally:
        small.close()


def test_a_big_batch_pauses_the_collector_and_gives_it_back(
    dsn: str, db: psycopg.Connection
) -> None:
    """A batch of 1,000 jobs or more runs with the cyclic collector paused (it would walk
    every object of the program, several times a batch, for cycles a batch never makes)
    and on again afterwards, after an error too; a smaller batch leaves it alone, and a
    caller that turned it off keeps it off."""
    import gc

    seen: list[bool] = []

    def rows(n: int) -> list[brooq.Job]:
        return [brooq.Job("t", {"i": i}) for i in range(n)]

    real_copy_rows = insert.copy_rows

    def noting(checked: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(gc.isenabled())
        return real_copy_rows(checked, *args, **kwargs)

    with psycopg.connect(dsn, autocommit=True) as conn:
        insert.copy_rows = noting  # type: ignore[assignment]
        try:
            brooq.enqueue_many(conn, rows(1_000))
            assert gc.isenabled()
            brooq.enqueue_many(conn, rows(999))
            with pytest.raises(psycopg.Error), conn.transaction():
                with pytest.raises(psycopg.errors.DivisionByZero):
                    conn.execute("SELECT 1 / 0")
                brooq.enqueue_many(conn, rows(1_000))  # an aborted transaction
            assert gc.isenabled()
            gc.disable()
            brooq.enqueue_many(conn, rows(1_000))
            assert not gc.isenabled()
        finally:
            gc.enable()
            insert.copy_rows = real_copy_rows  # type: ignore[assignment]
    assert seen == [False, True, False, False]
    assert count(db) == 2_999
