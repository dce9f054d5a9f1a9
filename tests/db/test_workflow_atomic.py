"""A job with after commits with its edges, whatever door it goes through: nothing sees it
pending on its way to waiting (a child would claim it), an upstream deleted meanwhile
leaves no row, and a deadlock with a worker ending the jobs named is retried in brooq's
own transaction and is a brooq error in the caller's.

Each test holds the lock brooq_job_after takes on the upstream row from a connection of
its own, so that the enqueue stops between its INSERT and its edges; another connection
then looks at what is visible meanwhile."""

from __future__ import annotations

import asyncio
import enum
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import brooq
from brooq.errors import EnqueueDeadlock
from tests.db.test_cli import run
from tests.db.test_workflows import claim, fail
from tests.harness import wait_for

Conn = psycopg.Connection[Any]
Door = Callable[[str, brooq.Queue, brooq.Job], uuid.UUID]


# -- the doors: each enqueues one job, on a connection in autocommit where it takes one ----


def _queue_enqueue(dsn: str, queue: brooq.Queue, job: brooq.Job) -> uuid.UUID:
    return queue.enqueue(job)[0]


def _queue_enqueue_many(dsn: str, queue: brooq.Queue, job: brooq.Job) -> uuid.UUID:
    return queue.enqueue_many([job])[0][0]


def _queue_enqueue_async(dsn: str, queue: brooq.Queue, job: brooq.Job) -> uuid.UUID:
    async def go() -> uuid.UUID:
        try:
            return (await queue.enqueue_async(job))[0]
        finally:
            await queue.close_async()

    return asyncio.run(go())


def _queue_enqueue_many_async(dsn: str, queue: brooq.Queue, job: brooq.Job) -> uuid.UUID:
    async def go() -> uuid.UUID:
        try:
            return (await queue.enqueue_many_async([job]))[0][0]
        finally:
            await queue.close_async()

    return asyncio.run(go())


def _enqueue_autocommit(dsn: str, queue: brooq.Queue, job: brooq.Job) -> uuid.UUID:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return brooq.enqueue(conn, job)[0]


def _enqueue_cursor(dsn: str, queue: brooq.Queue, job: brooq.Job) -> uuid.UUID:
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        return brooq.enqueue(cur, job)[0]


def _enqueue_many_autocommit(dsn: str, queue: brooq.Queue, job: brooq.Job) -> uuid.UUID:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return brooq.enqueue_many(conn, [job])[0][0]


def _enqueue_async_autocommit(dsn: str, queue: brooq.Queue, job: brooq.Job) -> uuid.UUID:
    async def go() -> uuid.UUID:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return (await brooq.enqueue_async(conn, job))[0]

    return asyncio.run(go())


def _enqueue_many_async_autocommit(dsn: str, queue: brooq.Queue, job: brooq.Job) -> uuid.UUID:
    async def go() -> uuid.UUID:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return (await brooq.enqueue_many_async(conn, [job]))[0][0]

    return asyncio.run(go())


def _sqlalchemy_autocommit(dsn: str, queue: brooq.Queue, job: brooq.Job) -> uuid.UUID:
    """A SQLAlchemy Connection on an engine in AUTOCOMMIT (its driver connection too)."""
    sqlalchemy = pytest.importorskip("sqlalchemy")
    engine = sqlalchemy.create_engine(
        "postgresql+psycopg://",
        creator=lambda: psycopg.connect(dsn),
        isolation_level="AUTOCOMMIT",
        poolclass=sqlalchemy.pool.NullPool,
    )
    try:
        with engine.connect() as conn:
            return brooq.enqueue(conn, job)[0]
    finally:
        engine.dispose()


_DJANGO = """
import sys, uuid
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
from django.db import connection

job = brooq.Job(sys.argv[2], after=[uuid.UUID(u) for u in sys.argv[4:]],
                on_upstream_failure=sys.argv[3])
print(brooq.enqueue(connection, job)[0])  # outside atomic(): Django's autocommit
"""


def _django_autocommit(dsn: str, queue: brooq.Queue, job: brooq.Job) -> uuid.UUID:
    """``django.db.connection`` outside ``atomic()``, in a process of its own."""
    pytest.importorskip("django")
    assert job.after is not None
    args = [job.topic, job.on_upstream_failure, *(str(up) for up in job.after)]
    out = subprocess.run(
        [sys.executable, "-c", _DJANGO, dsn, *args], capture_output=True, text=True, timeout=60
    )
    if out.returncode != 0:
        raise brooq.BrooqError(out.stderr.strip().splitlines()[-1])
    return uuid.UUID(out.stdout.strip())


def _cli(dsn: str, queue: brooq.Queue, job: brooq.Job) -> uuid.UUID:
    assert job.after is not None
    args = [f"--after={up}" for up in job.after]
    policy = f"--on-upstream-failure={job.on_upstream_failure}"
    out = run("--database", dsn, "enqueue", job.topic, *args, policy)
    if out.returncode != 0:
        raise brooq.BrooqError(out.stderr.strip())
    assert out.stderr == ""
    word, job_id = out.stdout.split()
    assert word == "enqueued"
    return uuid.UUID(job_id)


DOORS: dict[str, Door] = {
    "Queue.enqueue": _queue_enqueue,
    "Queue.enqueue_many": _queue_enqueue_many,
    "Queue.enqueue_async": _queue_enqueue_async,
    "Queue.enqueue_many_async": _queue_enqueue_many_async,
    "brooq.enqueue(autocommit)": _enqueue_autocommit,
    "brooq.enqueue(cursor)": _enqueue_cursor,
    "brooq.enqueue_many(autocommit)": _enqueue_many_autocommit,
    "brooq.enqueue_async(autocommit)": _enqueue_async_autocommit,
    "brooq.enqueue_many_async(autocommit)": _enqueue_many_async_autocommit,
    "SQLAlchemy Connection(AUTOCOMMIT)": _sqlalchemy_autocommit,
    "django.db.connection(autocommit)": _django_autocommit,
    "brooq enqueue --after": _cli,
}


# -- helpers ------------------------------------------------------------------------------


class Call:
    """``fn()`` in a thread: its answer or its exception once it returns."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.answer: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.answer = fn()
        except BaseException as exc:  # handed to the test
            self.error = exc

    def result(self, timeout: float = 30.0) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the enqueue did not return"
        if self.error is not None:
            raise self.error
        return self.answer

    @property
    def running(self) -> bool:
        return self._thread.is_alive()


def blocked_in_after(db: Conn) -> int:
    """How many sessions wait for a row lock inside brooq_job_after."""
    row = db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query LIKE '%%brooq_job_after%%'"
    ).fetchone()
    assert row is not None
    return int(row[0])


def visible(db: Conn, topic: str) -> list[str]:
    return [row[0] for row in db.execute("SELECT state FROM job_all WHERE topic = %s", (topic,))]


def lock_rows(conn: Conn, *ids: uuid.UUID) -> None:
    """Take the lock brooq_job_after takes on these rows, in ``conn``'s transaction: in
    job, or in job_history for a job that ended (brooq_job_after flags it there)."""
    conn.execute("SELECT 1 FROM job WHERE id = ANY(%s) FOR NO KEY UPDATE", (list(ids),))
    conn.execute("SELECT 1 FROM job_history WHERE id = ANY(%s) FOR NO KEY UPDATE", (list(ids),))


def upstream_in(queue: brooq.Queue, db: Conn, state: str) -> uuid.UUID:
    topic = f"up.{uuid.uuid4().hex[:8]}"  # one of its own, to claim it alone
    up, _ = queue.enqueue(brooq.Job(topic))
    if state in ("processing", "dead", "done"):
        assert claim(db, topic) == [up]
    if state == "dead":
        assert fail(db, up, final=True) == "dead"
    if state == "done":
        db.execute("UPDATE job SET state = 'done', locked_by = NULL WHERE id = %s", (up,))
    return up


def state_of(db: Conn, job_id: uuid.UUID) -> str:
    row = db.execute("SELECT state FROM job_all WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


# -- the job and its edges commit together -------------------------------------------------


@pytest.mark.parametrize(
    ("up_state", "policy", "expected"),
    [
        ("processing", "cancel", "waiting"),
        ("pending", "cancel", "waiting"),
        ("dead", "cancel", "canceled"),
        ("dead", "run", "pending"),
    ],
)
@pytest.mark.parametrize("door", list(DOORS))
def test_a_job_with_after_is_never_seen_before_its_edges(
    door: str,
    up_state: str,
    policy: str,
    expected: str,
    dsn: str,
    queue: brooq.Queue,
    db: Conn,
    connect: Callable[..., Conn],
) -> None:
    up = upstream_in(queue, db, up_state)
    holder = connect(autocommit=False)
    lock_rows(holder, up)
    job = brooq.Job("sink", after=[up], on_upstream_failure=policy)  # type: ignore[arg-type]
    call = Call(lambda: DOORS[door](dsn, queue, job))
    wait_for(lambda: blocked_in_after(db) or not call.running, what="the enqueue to block")
    # Stopped between its INSERT and its edges: nothing of it may be visible (a child
    # would claim a pending row; one that names a dead job would run).
    assert visible(db, "sink") == []
    holder.commit()
    job_id = call.result()
    # The moment the call returns, the job is in its final place.
    assert state_of(db, job_id) == expected
    assert visible(db, "sink") == [expected]


@pytest.mark.parametrize("door", list(DOORS))
def test_an_upstream_deleted_meanwhile_leaves_no_job(
    door: str, dsn: str, queue: brooq.Queue, db: Conn, connect: Callable[..., Conn]
) -> None:
    up = upstream_in(queue, db, "pending")
    deleter = connect(autocommit=False)
    deleter.execute("DELETE FROM job WHERE id = %s", (up,))  # seen by the enqueue's check
    job = brooq.Job("sink", after=[up])
    call = Call(lambda: DOORS[door](dsn, queue, job))
    wait_for(lambda: blocked_in_after(db) or not call.running, what="the enqueue to block")
    deleter.commit()
    with pytest.raises(brooq.BrooqError, match=f"after names job {up}"):
        call.result()
    assert visible(db, "sink") == []


def test_an_upstream_deleted_in_the_callers_transaction_is_invalid_after(
    dsn: str, queue: brooq.Queue, db: Conn, connect: Callable[..., Conn]
) -> None:
    up = upstream_in(queue, db, "pending")
    deleter = connect(autocommit=False)
    deleter.execute("DELETE FROM job WHERE id = %s", (up,))
    with psycopg.connect(dsn) as conn:  # the caller's transaction
        call = Call(lambda: brooq.enqueue(conn, brooq.Job("sink", after=[up])))
        wait_for(lambda: blocked_in_after(db), what="the enqueue to block")
        deleter.commit()
        with pytest.raises(brooq.InvalidAfter, match="roll it back") as refused:
            call.result()
        assert isinstance(refused.value.__cause__, psycopg.errors.ForeignKeyViolation)
        conn.rollback()
    assert visible(db, "sink") == []


def test_a_callers_transaction_keeps_the_job_until_it_commits(
    dsn: str, queue: brooq.Queue, db: Conn
) -> None:
    """On a connection in a transaction, brooq neither commits nor opens one."""
    up = upstream_in(queue, db, "pending")
    with psycopg.connect(dsn) as conn:
        job_id, _ = brooq.enqueue(conn, brooq.Job("sink", after=[up]))
        assert visible(db, "sink") == []
        conn.rollback()
    assert visible(db, "sink") == []
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        job_id, _ = brooq.enqueue(conn, brooq.Job("sink", after=[up]))
        assert visible(db, "sink") == []
    assert state_of(db, job_id) == "waiting"


# -- no wake-up for a job that waits ------------------------------------------------------


def notifications_before_marker(listener: Conn, db: Conn) -> list[str]:
    """The brooq_job notifications that reached ``listener`` before a marker the test
    sends now (notifications arrive in commit order)."""
    db.execute("NOTIFY brooq_job, 'marker'")
    seen: list[str] = []
    gen = listener.notifies(timeout=10)
    for note in gen:
        if note.payload == "marker":
            gen.close()
            return seen
        seen.append(note.payload)
    raise AssertionError(f"the marker never came; saw {seen}")


def test_a_job_that_waits_wakes_no_child(queue: brooq.Queue, db: Conn, dsn: str) -> None:
    up = upstream_in(queue, db, "pending")
    done = upstream_in(queue, db, "done")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN brooq_job")
        notifications_before_marker(listener, db)  # the upstream jobs' own
        queue.enqueue(brooq.Job("sink", after=[up]))
        queue.enqueue_many([brooq.Job("sink", after=[up]) for _ in range(3)])
        assert notifications_before_marker(listener, db) == []
        # One that is ready at once (it names a done job) wakes them, as any job does.
        queue.enqueue(brooq.Job("sink", after=[done]))
        assert notifications_before_marker(listener, db) == ["public"]
        # A batch holding a ready job wakes them once.
        queue.enqueue_many([brooq.Job("sink"), brooq.Job("sink", after=[up])])
        assert notifications_before_marker(listener, db) == ["public"]


def test_a_graph_job_keeps_its_available_at(queue: brooq.Queue, db: Conn) -> None:
    from datetime import datetime, timedelta, timezone

    done = upstream_in(queue, db, "done")
    up = upstream_in(queue, db, "pending")
    at = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(hours=1)
    later, _ = queue.enqueue(brooq.Job("sink", after=[done], available_at=at))
    waits, _ = queue.enqueue(brooq.Job("sink", after=[up], available_at=at))
    now_id, _ = queue.enqueue(brooq.Job("sink", after=[up]))
    rows = dict(
        db.execute(
            "SELECT id, available_at FROM job_all WHERE id = ANY(%s)", ([later, waits, now_id],)
        ).fetchall()
    )
    assert rows[later] == at and rows[waits] == at
    assert rows[now_id] < at  # the enqueue's now()


# -- deadlocks with the workers ending the jobs named ---------------------------------------


def test_a_deadlock_in_brooqs_transaction_is_retried(
    queue: brooq.Queue, db: Conn, connect: Callable[..., Conn]
) -> None:
    """A worker's batched done locks the upstream jobs in another order than
    brooq_job_after (the later id first): the enqueue waits for it, then it waits for the
    enqueue. The worker's session waits 30 s before it looks for a deadlock, the
    enqueue's 1 s (PostgreSQL's default): the enqueue's statement is the one broken."""
    first, _ = queue.enqueue(brooq.Job("up"))
    second, _ = queue.enqueue(brooq.Job("up"))
    assert first < second  # brooq_job_after locks first, then second
    worker = connect(autocommit=False)
    worker.execute("SET deadlock_timeout = '30s'")
    worker.execute("SET lock_timeout = 0")
    lock_rows(worker, second)
    call = Call(lambda: queue.enqueue_many([brooq.Job("sink", after=[first, second])]))
    wait_for(lambda: blocked_in_after(db), what="the enqueue to wait for the worker")
    lock_rows(worker, first)  # waits until the deadlock is broken on the enqueue's side
    # The enqueue's first try was broken (the worker got its lock); the second waits.
    wait_for(lambda: blocked_in_after(db), what="the enqueue's second try")
    worker.rollback()
    ((job_id, created),) = call.result()
    assert created and state_of(db, job_id) == "waiting"
    assert visible(db, "sink") == ["waiting"]


def test_a_deadlock_in_the_callers_transaction_is_a_brooq_error(
    dsn: str, queue: brooq.Queue, db: Conn, connect: Callable[..., Conn]
) -> None:
    first, _ = queue.enqueue(brooq.Job("up"))
    second, _ = queue.enqueue(brooq.Job("up"))
    worker = connect(autocommit=False)
    worker.execute("SET deadlock_timeout = '30s'")
    worker.execute("SET lock_timeout = 0")
    lock_rows(worker, second)
    with psycopg.connect(dsn) as conn:
        call = Call(lambda: brooq.enqueue(conn, brooq.Job("sink", after=[first, second])))
        wait_for(lambda: blocked_in_after(db), what="the enqueue to wait for the worker")
        lock_rows(worker, first)
        with pytest.raises(EnqueueDeadlock, match="roll it back") as refused:
            call.result()
        assert isinstance(refused.value.__cause__, psycopg.errors.DeadlockDetected)
        conn.rollback()
    worker.rollback()
    assert visible(db, "sink") == []


# -- what a batch may name -----------------------------------------------------------------


def test_a_cycle_made_by_assigning_after_is_refused(queue: brooq.Queue, db: Conn) -> None:
    a = brooq.Job("sink")
    b = brooq.Job("sink", after=[a])
    c = brooq.Job("sink", after=[b])
    a.after = (c,)
    with pytest.raises(brooq.InvalidAfter, match=r"cycle.*job 0 waits for job 2"):
        queue.enqueue_many([a, b, c])
    alone = brooq.Job("sink")
    alone.after = (alone,)
    with pytest.raises(brooq.InvalidAfter, match="cycle"):
        queue.enqueue(alone)
    with pytest.raises(brooq.InvalidAfter, match="cycle"):
        queue.enqueue_many([brooq.Job("x"), alone])
    assert visible(db, "sink") == []
    # Assigned after construction, ``after`` is checked as the constructor checks it.
    odd = brooq.Job("sink")
    odd.after = ["not an id"]  # type: ignore[assignment]
    with pytest.raises(brooq.InvalidAfter, match="job 0: after names 'not an id'"):
        queue.enqueue_many([odd])
    # A graph without a cycle still goes through.
    a.after = None
    assert [c for _, c in queue.enqueue_many([a, b, c])] == [True, True, True]


class Priority(int, enum.Enum):
    HIGH = 5


class Level(enum.IntEnum):
    LOW = -3


@pytest.mark.parametrize("priority", [Priority.HIGH, Level.LOW])
def test_an_int_enum_priority_is_stored_as_its_value_by_every_door(
    priority: int, dsn: str, queue: brooq.Queue, db: Conn
) -> None:
    job = brooq.Job("t", priority=priority)
    assert type(job.priority) is int and job.priority == int(priority)
    one, _ = queue.enqueue(job)
    (copied, _), (keyed, _) = queue.enqueue_many(
        [job, brooq.Job("t", priority=priority, idempotency_key="k")]
    )
    with psycopg.connect(dsn) as conn:
        ((plain, _),) = brooq.enqueue_many(conn, [job])
    ids = [one, copied, keyed, plain]
    rows = db.execute("SELECT priority FROM job_all WHERE id = ANY(%s)", (ids,)).fetchall()
    assert [r[0] for r in rows] == [int(priority)] * 4


def test_a_negative_zero_in_a_payload_comes_back_zero_from_every_door(
    queue: brooq.Queue,
) -> None:
    """jsonb keeps numbers as numeric, which has no negative zero: -0.0 is stored 0.0
    (and the JSON 0.0 reads back as the float 0.0), whichever door wrote it."""
    one, _ = queue.enqueue(brooq.Job("t", {"x": -0.0}))
    ((many, _),) = queue.enqueue_many([brooq.Job("t", {"x": -0.0})])
    for job_id in (one, many):
        record = queue.get(job_id)
        assert record is not None
        assert record.payload == {"x": 0.0}
        assert str(record.payload["x"]) == "0.0"
