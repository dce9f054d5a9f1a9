"""The worker and master SQL of brooq/sql against a real PostgreSQL, with two (or more)
connections and a deterministic order of events: claim, outcome guards, lease renewal,
release, the reaper and its race, retention, and the claim's query plan."""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from brooq.operator.changes import transition_params
from brooq.sql import Q

Conn = psycopg.Connection[Any]
Row = dict[str, Any]

LEASE = 30.0


@pytest.fixture
def db(connect: Callable[..., Conn]) -> Conn:
    """An autocommit connection for setting up and checking (dict rows)."""
    return connect()


def insert(
    db: Conn,
    topic: str = "t",
    *,
    at: datetime | None = None,
    offset: float = -1.0,
    job_id: uuid.UUID | None = None,
) -> uuid.UUID:
    """A pending job, ready since ``offset`` seconds from now (or at ``at``)."""
    row = db.execute(
        "INSERT INTO job (id, topic, available_at) VALUES "
        "(%(id)s, %(topic)s, coalesce(%(at)s, now() + make_interval(secs => %(offset)s))) "
        "RETURNING id",
        {"id": job_id or uuid.uuid4(), "topic": topic, "at": at, "offset": offset},
    ).fetchone()
    assert row is not None
    return uuid.UUID(str(row["id"]))


def get(db: Conn, job_id: uuid.UUID) -> Row:
    row = db.execute("SELECT * FROM job_all WHERE id = %s", [job_id]).fetchone()
    assert row is not None
    return row


def claim(
    conn: Conn,
    worker: str,
    topics: tuple[str, ...] = ("t",),
    limit: int = 1,
    lease: float = LEASE,
    children: int = 1,
) -> list[Row]:
    # The claim half of the hot-path statement, with nothing finished to write.
    rows = conn.execute(
        Q.job_finish_and_claim,
        {
            "done": [],
            "topics": list(topics),
            "limit": limit,
            "children": children,
            "worker": worker,
            "lease": lease,
            "queue": "default",
        },
    ).fetchall()
    return sorted((r for r in rows if r["claimed"]), key=lambda r: (r["available_at"], r["id"]))


def claim_one(conn: Conn, worker: str, topics: tuple[str, ...] = ("t",)) -> uuid.UUID:
    rows = claim(conn, worker, topics)
    assert len(rows) == 1, rows
    return uuid.UUID(str(rows[0]["id"]))


def set_done(conn: Conn, job_id: uuid.UUID, worker: str) -> int:
    return conn.execute(Q.job_set_done, {"id": job_id, "worker": worker, "result": None}).rowcount


def set_failed(
    conn: Conn,
    job_id: uuid.UUID,
    worker: str,
    *,
    max_attempts: int = 5,
    refund: bool = False,
    delay: float = 0.0,
    error: str = "boom",
) -> str | None:
    row = conn.execute(
        Q.job_set_failed,
        {
            "id": job_id,
            "worker": worker,
            "max_attempts": max_attempts,
            "refund": refund,
            "delay": delay,
            "error": error,
            "history_error": error,
            "kind": "raised",
            "traceback": None,
        },
    ).fetchone()
    return None if row is None else str(row["state"])


def set_canceled(conn: Conn, job_id: uuid.UUID, worker: str) -> int:
    params = {"id": job_id, "worker": worker, "error": "canceled by handler"}
    params |= {"history_error": "canceled by handler", "traceback": None}
    return conn.execute(Q.job_set_canceled, params).rowcount


def expire(db: Conn, *job_ids: uuid.UUID) -> None:
    """Push the lease of these jobs into the past (whatever their state)."""
    db.execute(
        "UPDATE job SET locked_until = now() - interval '1 second' WHERE id = ANY(%s)",
        [list(job_ids)],
    )


def reap(conn: Conn) -> set[uuid.UUID]:
    rows = conn.execute(Q.job_reap_expired, {"max_expiries": 1000}).fetchall()
    return {uuid.UUID(str(r["id"])) for r in rows}


def renew(conn: Conn, held: list[tuple[uuid.UUID, str]], lease: float = LEASE) -> set[uuid.UUID]:
    rows = conn.execute(
        Q.job_renew_leases,
        {"ids": [i for i, _ in held], "workers": [w for _, w in held], "lease": lease},
    ).fetchall()
    return {uuid.UUID(str(r["id"])) for r in rows}


def wait_until_blocked(db: Conn, pid: int, blocker: int, timeout: float = 10.0) -> None:
    """Return once backend ``pid`` waits for a lock held by backend ``blocker``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = db.execute("SELECT pg_blocking_pids(%s) AS pids", [pid]).fetchone()
        assert row is not None
        if blocker in row["pids"]:
            return
        time.sleep(0.01)
    raise AssertionError(f"backend {pid} never waited for backend {blocker}")


class Background:
    """Run one call in a thread and keep its result or exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.result = fn()
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout: float = 10.0) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the background statement never finished"
        if self.error is not None:
            raise self.error
        return self.result


# -- claim -------------------------------------------------------------------------------


def test_claim_is_fifo_by_available_at_then_id(db: Conn) -> None:
    rand = random.Random(1302)
    base = datetime.now(timezone.utc) - timedelta(hours=1)
    expected: list[tuple[datetime, uuid.UUID]] = []
    for _ in range(30):
        # Few distinct times: many ties, broken by id.
        at = base + timedelta(seconds=rand.randrange(4))
        expected.append((at, uuid.UUID(int=rand.getrandbits(128), version=4)))
    for at, job_id in rand.sample(expected, len(expected)):  # inserted out of order
        insert(db, at=at, job_id=job_id)
    insert(db, offset=3600)  # not ready yet
    insert(db, "other", offset=-7200)  # ready and older, but another topic
    order = [claim_one(db, "w") for _ in expected]
    assert order == [job_id for _, job_id in sorted(expected)]
    assert claim(db, "w") == []


def test_claim_takes_only_the_given_topics(db: Conn) -> None:
    ids = {topic: {insert(db, topic) for _ in range(3)} for topic in ("a", "b", "c")}
    got = {uuid.UUID(str(r["id"])) for r in claim(db, "w", ("a", "c", "zzz"), limit=100)}
    assert got == ids["a"] | ids["c"]
    assert claim(db, "w", (), limit=100) == []
    assert {get(db, i)["state"] for i in ids["b"]} == {"pending"}


def test_claim_limit_takes_the_oldest(db: Conn) -> None:
    ids = [insert(db, offset=-100 + i) for i in range(10)]
    got = {uuid.UUID(str(r["id"])) for r in claim(db, "w", limit=4)}
    assert got == set(ids[:4])
    row = db.execute("SELECT count(*) AS n FROM job WHERE state = 'processing'").fetchone()
    assert row is not None and row["n"] == 4


def test_a_batch_claim_takes_no_more_than_a_fair_share_of_what_is_ready(db: Conn) -> None:
    # Five ready jobs and two children: a batch of up to 32 takes three (the oldest), so
    # the sibling finds some instead of none; each claim halves what is left.
    jobs = [insert(db, offset=-10.0 + i) for i in range(5)]
    assert [r["id"] for r in claim(db, "w1", limit=32, children=2)] == jobs[:3]
    assert [r["id"] for r in claim(db, "w2", limit=32, children=2)] == jobs[3:4]
    assert [r["id"] for r in claim(db, "w1", limit=32, children=2)] == jobs[4:]
    # Alone, the child takes all that is ready.
    more = [insert(db, offset=-5.0 + i) for i in range(5)]
    assert [r["id"] for r in claim(db, "w3", limit=32, children=1)] == more
    # A deep queue fills the whole batch: the count stops at limit x children rows.
    deep = [insert(db, offset=-1.0) for _ in range(100)]
    assert len(claim(db, "w4", limit=32, children=2)) == 32
    assert len(deep) == 100


def test_claim_charges_the_attempt_and_sets_the_lease(db: Conn) -> None:
    fresh = insert(db, offset=-10)
    retried = insert(db, offset=-5)
    db.execute("UPDATE job SET state = 'failed', attempts = 2 WHERE id = %s", [retried])
    rows = {uuid.UUID(str(r["id"])): r for r in claim(db, "worker-7", limit=2, lease=42.5)}
    assert set(rows) == {fresh, retried}
    assert rows[fresh]["attempts"] == 1 and rows[retried]["attempts"] == 3
    for job_id, returned in rows.items():
        row = get(db, job_id)
        assert row["state"] == "processing"
        assert row["locked_by"] == returned["locked_by"] == "worker-7"
        assert row["locked_until"] == returned["locked_until"]
        # Lease and updated_at come from the same now().
        assert row["locked_until"] - row["updated_at"] == timedelta(seconds=42.5)
        assert row["attempts"] == returned["attempts"]
        assert returned["topic"] == "t" and returned["payload"] is None


def test_claim_ignores_processing_terminal_and_future_rows(db: Conn) -> None:
    for state in ("done", "dead", "canceled"):
        job_id = insert(db)
        db.execute("UPDATE job SET state = %s WHERE id = %s", [state, job_id])
    held = insert(db)
    claim_one(db, "a")
    insert(db, offset=60)
    later = insert(db, offset=-1)
    db.execute(
        "UPDATE job SET state = 'failed', available_at = now() + interval '1 hour' WHERE id = %s",
        [later],
    )
    assert claim(db, "b", limit=100) == []
    assert get(db, held)["locked_by"] == "a"


def test_a_locked_row_is_skipped_not_waited_for(connect: Callable[..., Conn], db: Conn) -> None:
    first = insert(db, offset=-2)
    second = insert(db, offset=-1)
    a = connect(autocommit=False)
    b = connect()
    assert claim_one(a, "a") == first  # A's transaction stays open: the row stays locked
    assert claim_one(b, "b") == second  # B skips it (with lock_timeout 5s it would fail)
    assert claim(b, "b") == []
    a.commit()
    assert get(db, first)["locked_by"] == "a" and get(db, second)["locked_by"] == "b"


def test_a_rolled_back_claim_leaves_the_job_claimable(
    connect: Callable[..., Conn], db: Conn
) -> None:
    job_id = insert(db)
    a = connect(autocommit=False)
    assert claim_one(a, "a") == job_id
    a.rollback()
    assert get(db, job_id)["attempts"] == 0
    assert claim_one(db, "b") == job_id


def test_concurrent_claims_never_share_a_row(connect: Callable[..., Conn], db: Conn) -> None:
    total, workers = 400, 8
    db.execute(
        "INSERT INTO job (topic, available_at) "
        "SELECT 't', now() - make_interval(secs => g) FROM generate_series(1, %s) AS g",
        [total],
    )
    conns = [connect() for _ in range(workers)]
    barrier = threading.Barrier(workers)
    claimed: list[list[uuid.UUID]] = [[] for _ in range(workers)]

    def run(n: int) -> None:
        barrier.wait()
        while rows := claim(conns[n], f"w{n}", limit=3):
            claimed[n].extend(uuid.UUID(str(r["id"])) for r in rows)

    jobs = [Background(lambda n=n: run(n)) for n in range(workers)]
    for job in jobs:
        job.join(60)
    everything = [i for ids in claimed for i in ids]
    assert len(everything) == total and len(set(everything)) == total
    held = db.execute(
        "SELECT locked_by, count(*) AS n FROM job WHERE state = 'processing' "
        "AND attempts = 1 GROUP BY locked_by"
    ).fetchall()
    assert {r["locked_by"]: r["n"] for r in held} == {
        f"w{n}": len(ids) for n, ids in enumerate(claimed) if ids
    }


# -- outcome guards ----------------------------------------------------------------------


def test_a_stale_holder_loses(connect: Callable[..., Conn], db: Conn) -> None:
    job_id = insert(db)
    a, b, master = connect(), connect(), connect()
    assert claim_one(a, "A") == job_id
    expire(db, job_id)
    assert reap(master) == {job_id}
    row = get(db, job_id)
    assert (row["state"], row["attempts"], row["locked_by"], row["locked_until"]) == (
        "pending",
        0,  # the claim's attempt is refunded: a lost lease is a crash, not a failure
        None,
        None,
    )
    assert claim_one(b, "B") == job_id
    assert get(db, job_id)["attempts"] == 1
    # A comes back: every write it tries matches no row.
    assert set_done(a, job_id, "A") == 0
    assert set_failed(a, job_id, "A") is None
    assert set_canceled(a, job_id, "A") == 0
    assert renew(a, [(job_id, "A")]) == set()
    assert a.execute(Q.job_release, {"workers": ["A"]}).fetchall() == []
    assert get(db, job_id)["locked_by"] == "B"
    # B's outcome counts, once.
    assert set_done(b, job_id, "B") == 1
    assert set_done(b, job_id, "B") == 0
    assert get(db, job_id)["state"] == "done"


def test_outcome_of_a_job_never_claimed_or_held_by_someone_else(db: Conn) -> None:
    job_id = insert(db)
    assert set_done(db, job_id, "A") == 0
    claim_one(db, "B")
    assert set_done(db, job_id, "A") == 0
    assert set_failed(db, job_id, "A") is None
    assert set_canceled(db, job_id, "A") == 0
    assert get(db, job_id)["state"] == "processing"


def test_terminal_states_are_never_overwritten(db: Conn) -> None:
    finals = {}
    for outcome in ("done", "dead", "canceled"):
        job_id = insert(db)
        claim_one(db, "A")
        if outcome == "done":
            assert set_done(db, job_id, "A") == 1
        elif outcome == "dead":
            assert set_failed(db, job_id, "A", max_attempts=1) == "dead"
        else:
            assert set_canceled(db, job_id, "A") == 1
        finals[job_id] = get(db, job_id)
    for job_id, before in finals.items():
        assert set_done(db, job_id, "A") == 0
        assert set_failed(db, job_id, "A", refund=True) is None
        assert set_canceled(db, job_id, "A") == 0
        assert db.execute(Q.job_cancel, transition_params("cancel", job_id)).fetchall() == []
        assert renew(db, [(job_id, "A")]) == set()
        assert db.execute(Q.job_release, {"workers": ["A"]}).fetchall() == []
        assert get(db, job_id) == before


def test_failed_attempts_end_dead_exactly_at_max_attempts(db: Conn) -> None:
    job_id = insert(db)
    states = []
    for attempt in range(1, 4):
        assert claim_one(db, "A") == job_id
        assert get(db, job_id)["attempts"] == attempt
        states.append(set_failed(db, job_id, "A", max_attempts=3, error=f"try {attempt}"))
    assert states == ["failed", "failed", "dead"]
    row = get(db, job_id)
    assert (row["state"], row["attempts"], row["last_error"]) == ("dead", 3, "try 3")
    assert claim(db, "A") == []


def test_a_failure_waits_for_its_backoff(db: Conn) -> None:
    job_id = insert(db)
    claim_one(db, "A")
    assert set_failed(db, job_id, "A", delay=90.0) == "failed"
    row = get(db, job_id)
    assert row["available_at"] - row["updated_at"] == timedelta(seconds=90)
    assert claim(db, "A") == []


def test_max_attempts_one_and_attempts_already_past_the_limit(db: Conn) -> None:
    once = insert(db, offset=-2)
    claim_one(db, "A")
    assert set_failed(db, once, "A", max_attempts=1) == "dead"
    over = insert(db, offset=-1)
    db.execute("UPDATE job SET state = 'failed', attempts = 9 WHERE id = %s", [over])
    claim_one(db, "A")  # attempts 10 against a limit lowered to 3 since
    assert set_failed(db, over, "A", max_attempts=3) == "dead"


def test_a_refund_is_never_dead_and_never_below_zero(db: Conn) -> None:
    job_id = insert(db)
    db.execute("UPDATE job SET state = 'failed', attempts = 2 WHERE id = %s", [job_id])
    claim_one(db, "A")  # the last attempt: 3 of 3
    assert set_failed(db, job_id, "A", max_attempts=3, refund=True, delay=0) == "failed"
    row = get(db, job_id)
    assert (row["state"], row["attempts"]) == ("failed", 2)
    # Refunds forever never reach dead.
    for _ in range(5):
        claim_one(db, "A")
        assert set_failed(db, job_id, "A", max_attempts=1, refund=True) == "failed"
    assert get(db, job_id)["attempts"] == 2
    # A processing row that somehow has 0 attempts stays at 0 (the CHECK would fail below).
    claim_one(db, "A")
    db.execute("UPDATE job SET attempts = 0 WHERE id = %s", [job_id])
    assert set_failed(db, job_id, "A", refund=True) == "failed"
    assert get(db, job_id)["attempts"] == 0


def test_handler_cancel_is_guarded_and_records_why(db: Conn) -> None:
    job_id = insert(db)
    claim_one(db, "A")
    assert set_canceled(db, job_id, "B") == 0
    assert set_canceled(db, job_id, "A") == 1
    row = get(db, job_id)
    assert (row["state"], row["last_error"]) == ("canceled", "canceled by handler")
    # the cancel is the attempt's end: an entry in the error history, as a failure's
    [entry] = db.execute("SELECT errors FROM job_all WHERE id = %s", (job_id,)).fetchone()["errors"]  # type: ignore[index]
    assert (entry["kind"], entry["error"], entry["worker"]) == (
        "canceled",
        "canceled by handler",
        "A",
    )


def test_operator_cancel_of_a_processing_job_makes_its_holder_lose(db: Conn) -> None:
    job_id = insert(db)
    claim_one(db, "A")
    assert db.execute(Q.job_cancel, transition_params("cancel", job_id)).fetchall() != []
    assert renew(db, [(job_id, "A")]) == set()  # the master tells the child: LeaseLost
    assert set_done(db, job_id, "A") == 0
    assert get(db, job_id)["state"] == "canceled"


def test_operator_retry_only_of_dead_or_canceled(db: Conn) -> None:
    job_id = insert(db)
    claim_one(db, "A")
    set_failed(db, job_id, "A", max_attempts=1, error="kaput")
    retry = transition_params("retry", job_id)
    assert db.execute(Q.job_retry, retry).fetchall() != []
    row = get(db, job_id)
    assert (row["state"], row["attempts"], row["locked_by"], row["last_error"]) == (
        "pending",
        0,
        None,
        "kaput",
    )
    assert db.execute(Q.job_retry, retry).fetchall() == []  # pending: refused
    claim_one(db, "A")
    assert db.execute(Q.job_retry, retry).fetchall() == []  # processing: refused
    set_done(db, job_id, "A")
    assert db.execute(Q.job_retry, retry).fetchall() == []  # done: refused


# -- lease renewal and release -----------------------------------------------------------


def test_renewal_returns_only_jobs_still_processing_and_held(db: Conn) -> None:
    j1, j2, j3, j4, j5 = (insert(db, offset=-10 + i) for i in range(5))
    assert {uuid.UUID(str(r["id"])) for r in claim(db, "A", limit=2, lease=5)} == {j1, j2}
    assert claim_one(db, "B") == j3
    db.execute(Q.job_cancel, transition_params("cancel", j2))
    assert claim_one(db, "A") == j4
    set_done(db, j4, "A")  # j5 stays pending
    before = {j: get(db, j) for j in (j1, j2, j3, j4, j5)}
    renewed = renew(db, [(j, "A") for j in (j1, j2, j3, j4, j5)], lease=600)
    assert renewed == {j1}
    after = {j: get(db, j) for j in (j1, j2, j3, j4, j5)}
    assert after[j1]["locked_until"] > before[j1]["locked_until"] + timedelta(seconds=500)
    for j in (j2, j3, j4, j5):
        assert after[j] == before[j]
    # Each id is checked against its own holder.
    assert renew(db, [(j1, "A"), (j3, "B"), (j3, "A")]) == {j1, j3}
    assert renew(db, []) == set()


def test_renewal_revives_an_expired_but_unreaped_lease(db: Conn) -> None:
    job_id = insert(db)
    claim_one(db, "A")
    expire(db, job_id)
    assert renew(db, [(job_id, "A")]) == {job_id}
    assert reap(db) == set()
    assert get(db, job_id)["locked_by"] == "A"


def test_release_refunds_and_is_claimable_at_once(db: Conn) -> None:
    j1 = insert(db, offset=-3)
    j2 = insert(db, offset=-2)
    j3 = insert(db, offset=-1)
    db.execute("UPDATE job SET state = 'failed', attempts = 1 WHERE id = %s", [j2])
    assert {uuid.UUID(str(r["id"])) for r in claim(db, "A", limit=2)} == {j1, j2}
    assert claim_one(db, "B") == j3
    released = db.execute(Q.job_release, {"workers": ["A", "nobody"]}).fetchall()
    assert {uuid.UUID(str(r["id"])) for r in released} == {j1, j2}
    for job_id, attempts in ((j1, 0), (j2, 1)):
        row = get(db, job_id)
        assert (row["state"], row["attempts"], row["locked_by"], row["locked_until"]) == (
            "pending",
            attempts,
            None,
            None,
        )
    assert get(db, j3)["locked_by"] == "B"
    again = {uuid.UUID(str(r["id"])): r["attempts"] for r in claim(db, "C", limit=5)}
    assert again == {j1: 1, j2: 2}


# -- the reaper --------------------------------------------------------------------------


def test_reaper_returns_only_expired_processing_rows(db: Conn) -> None:
    expired = insert(db, offset=-5)
    live = insert(db, offset=-4)
    claim(db, "A", limit=2)
    expire(db, expired)
    finished = {}
    for outcome in ("done", "dead", "canceled", "operator"):
        job_id = insert(db)
        claim_one(db, "A")
        if outcome == "done":
            set_done(db, job_id, "A")
        elif outcome == "dead":
            set_failed(db, job_id, "A", max_attempts=1)
        elif outcome == "canceled":
            set_canceled(db, job_id, "A")
        else:
            db.execute(Q.job_cancel, transition_params("cancel", job_id))
        expire(db, job_id)  # terminal rows keep their last lease, now long past
        finished[job_id] = get(db, job_id)
        assert finished[job_id]["locked_until"] is not None
    pending = insert(db)
    before_live, before_pending = get(db, live), get(db, pending)
    assert reap(db) == {expired}
    row = get(db, expired)
    assert (row["state"], row["attempts"], row["locked_by"], row["locked_until"]) == (
        "pending",
        0,  # refunded
        None,
        None,
    )
    assert row["lease_expiries"] == 1
    assert row["available_at"] <= db.execute("SELECT now() AS t").fetchone()["t"]  # type: ignore[index]
    for job_id, before in finished.items():
        assert get(db, job_id) == before
    assert get(db, live) == before_live and get(db, pending) == before_pending
    assert reap(db) == set()


def test_expired_leases_refund_the_attempt_until_the_bound_makes_the_job_dead(db: Conn) -> None:
    """A job whose workers vanish with it never nears dead through max_attempts (a job
    claimed by a lost host, reaped, then failing once with max_attempts=2 is failed, not
    dead); its lease expiries are what bound it: the third of max_expiries=3 is dead."""
    job_id = insert(db)
    for expiries in (1, 2):
        assert claim_one(db, "A") == job_id
        expire(db, job_id)
        rows = db.execute(Q.job_reap_expired, {"max_expiries": 3}).fetchall()
        assert [(r["id"], r["state"], r["lease_expiries"]) for r in rows] == [
            (job_id, "pending", expiries)
        ]
        assert get(db, job_id)["attempts"] == 0
    assert claim_one(db, "A") == job_id
    assert set_failed(db, job_id, "A", max_attempts=2) == "failed"  # the first real failure
    db.execute("UPDATE job SET available_at = now() WHERE id = %s", (job_id,))
    assert claim_one(db, "A") == job_id
    expire(db, job_id)
    rows = db.execute(Q.job_reap_expired, {"max_expiries": 3}).fetchall()
    assert [(r["state"], r["lease_expiries"]) for r in rows] == [("dead", 3)]
    row = get(db, job_id)
    assert (row["state"], row["attempts"], row["locked_by"]) == ("dead", 2, None)
    assert row["last_error"] == (
        "lease expired 3 times: the workers running it vanished (host lost or frozen?)"
    )


def test_two_reapers_at_once_return_each_job_once(connect: Callable[..., Conn], db: Conn) -> None:
    ids = [insert(db, offset=-i) for i in range(1, 6)]
    claim(db, "A", limit=5)
    expire(db, *ids)
    r1, r2 = connect(autocommit=False), connect(autocommit=False)
    first = reap(r1)  # holds the row locks until commit
    second = reap(r2)  # skips the locked rows at once, never waits
    r1.commit()
    r2.commit()
    assert first == set(ids) and second == set()
    assert reap(db) == set()  # and nothing is left for a later pass


def _outcome_written_while_the_reaper_runs(
    connect: Callable[..., Conn], db: Conn, reaper_sql: Callable[[Conn], set[uuid.UUID]]
) -> tuple[set[uuid.UUID], Row, Conn, uuid.UUID]:
    """A race River met (its bug report 1302): A's lease has expired; A writes its outcome
    (done) and holds the row lock while the reaper runs. Returns what the reaper returned,
    the row as the reaper's transaction left it, A's connection (outcome not committed)
    and the id."""
    job_id = insert(db)
    worker = connect(autocommit=False)
    reaper = connect(autocommit=False)
    assert claim_one(worker, "A") == job_id
    worker.commit()
    expire(db, job_id)
    assert set_done(worker, job_id, "A") == 1  # not committed yet: the row stays locked
    reaped = Background(lambda: reaper_sql(reaper))
    result = reaped.join()  # must not wait for A's lock
    reaper.commit()
    return result, get(db, job_id), worker, job_id


def test_reaper_race_an_outcome_committed_meanwhile_survives(
    connect: Callable[..., Conn], db: Conn
) -> None:
    reaped, row, worker, job_id = _outcome_written_while_the_reaper_runs(connect, db, reap)
    assert reaped == set()  # the locked row was skipped, not waited for
    assert row["state"] == "processing"  # A's outcome is not committed yet
    worker.commit()
    assert reap(db) == set()  # the next pass sees it finished
    row = get(db, job_id)
    assert (row["state"], row["attempts"], row["locked_by"]) == ("done", 1, "A")


def test_reaper_race_control_a_read_then_update_reaper_loses_the_outcome(
    connect: Callable[..., Conn], db: Conn
) -> None:
    """The same race against a reaper that checks the state in a SELECT and then
    updates by id (River before the fix): it waits for A's lock, then overwrites the
    committed outcome. This shows that the schedule really reaches the race. The outcome
    is a failed attempt to retry later, which stays in job (a done one leaves job for
    job_history in its own statement, where no UPDATE of job can reach it)."""
    job_id = insert(db)
    worker = connect(autocommit=False)
    reaper = connect(autocommit=False)
    assert claim_one(worker, "A") == job_id
    worker.commit()
    expire(db, job_id)
    assert set_failed(worker, job_id, "A", delay=3600) == "failed"

    def read_then_update(conn: Conn) -> set[uuid.UUID]:
        # The SELECT does not wait for row locks: it sees the old, expired version.
        rows = conn.execute(
            "SELECT id FROM job WHERE state = 'processing' AND locked_until < now()"
        ).fetchall()
        ids = [r["id"] for r in rows]
        updated = conn.execute(
            "UPDATE job SET state = 'pending', locked_by = NULL, locked_until = NULL "
            "WHERE id = ANY(%s) RETURNING id",
            [ids],
        ).fetchall()
        return {uuid.UUID(str(r["id"])) for r in updated}

    pending = Background(lambda: read_then_update(reaper))
    wait_until_blocked(db, reaper.info.backend_pid, worker.info.backend_pid)
    worker.commit()
    reaped = pending.join()
    reaper.commit()
    assert reaped == {job_id}
    assert get(db, job_id)["state"] == "pending"  # the committed outcome is lost


def test_reaper_race_an_outcome_rolled_back_meanwhile_is_reaped(
    connect: Callable[..., Conn], db: Conn
) -> None:
    reaped, _, worker, job_id = _outcome_written_while_the_reaper_runs(connect, db, reap)
    assert reaped == set()
    worker.rollback()
    assert reap(db) == {job_id}  # the next pass takes it
    assert get(db, job_id)["state"] == "pending"


def test_renewal_in_flight_while_the_reaper_runs_keeps_the_job(
    connect: Callable[..., Conn], db: Conn
) -> None:
    job_id = insert(db)
    master = connect(autocommit=False)
    reaper = connect(autocommit=False)
    claim_one(db, "A")
    expire(db, job_id)
    assert renew(master, [(job_id, "A")]) == {job_id}  # locked until commit
    assert Background(lambda: reap(reaper)).join() == set()  # skipped, not waited for
    reaper.commit()
    master.commit()
    assert reap(db) == set()  # renewed: not expired any more
    assert get(db, job_id)["state"] == "processing"


# -- retention ---------------------------------------------------------------------------


@pytest.mark.parametrize("plan", ["default", "no index"])
def test_retention_deletes_old_terminal_rows_in_batches_oldest_first(db: Conn, plan: str) -> None:
    """Oldest first must come from the statement, not from the plan: with index scans
    off the rows come in physical order, which is scrambled here."""
    day = 86400

    def row_in(state: str, age_days: float) -> uuid.UUID:
        # Inserted in its state: a finished row stays in job, as the rows that ended
        # before migration 0020 do (an UPDATE ending a job moves it to job_history), and
        # those are what this retention deletes.
        job_id = uuid.uuid4()
        lock = state == "processing"
        db.execute(
            "INSERT INTO job (id, topic, state, updated_at, locked_by, locked_until) "
            "VALUES (%(id)s, 't', %(state)s, now() - make_interval(secs => %(age)s),"
            " CASE WHEN %(lock)s THEN 'A' END, CASE WHEN %(lock)s THEN now() END)",
            {"state": state, "age": age_days * day, "lock": lock, "id": job_id},
        )
        return job_id

    old_specs = [
        ("dead", 40),
        ("canceled", 30),
        ("done", 20),
        ("done", 12),
        ("dead", 9),
        ("done", 8),
        ("canceled", 7.5),
    ]
    specs = [*old_specs, ("done", 6.9), ("dead", 1), ("canceled", 0)]
    specs += [(state, 400) for state in ("pending", "processing", "failed")]
    # Inserted in a scrambled order, so the table's physical order is not the age order.
    made = {spec: row_in(*spec) for spec in random.Random(3).sample(specs, len(specs))}
    old_terminal = [made[spec] for spec in old_specs]
    young = [made[spec] for spec in specs[7:10]]
    active = [made[spec] for spec in specs[10:]]
    ttl, batch = 7 * day, 3
    if plan == "no index":
        db.execute("SET enable_indexscan = off")
        db.execute("SET enable_bitmapscan = off")
        db.execute("SET enable_indexonlyscan = off")

    def delete_batch() -> int:
        return len(db.execute(Q.job_delete_expired, {"ttl": ttl, "batch": batch}).fetchall())

    def remaining() -> set[uuid.UUID]:
        return {uuid.UUID(str(r["id"])) for r in db.execute("SELECT id FROM job").fetchall()}

    everything = set(old_terminal) | set(young) | set(active)
    assert delete_batch() == 3
    assert remaining() == everything - set(old_terminal[:3])
    assert delete_batch() == 3
    assert remaining() == everything - set(old_terminal[:6])
    assert delete_batch() == 1
    assert delete_batch() == 0
    assert remaining() == set(young) | set(active)


def test_retention_never_deletes_active_rows_however_old(db: Conn) -> None:
    db.execute(
        "INSERT INTO job (topic, state, locked_by, locked_until, updated_at, created_at) "
        "SELECT 't', s, CASE WHEN s = 'processing' THEN 'A' END, "
        "       CASE WHEN s = 'processing' THEN now() END, "
        "       now() - interval '10 years', now() - interval '10 years' "
        "FROM unnest(ARRAY['pending', 'processing', 'failed']) AS s, generate_series(1, 50)"
    )
    assert db.execute(Q.job_delete_expired, {"ttl": 0, "batch": 1000}).fetchall() == []
    row = db.execute("SELECT count(*) AS n FROM job").fetchone()
    assert row is not None and row["n"] == 150


# -- the claim's plan --------------------------------------------------------------------


def _index_names(plan: Any) -> list[str]:
    names: list[str] = []
    if isinstance(plan, dict):
        if "Index Name" in plan:
            names.append(plan["Index Name"])
        for value in plan.values():
            names.extend(_index_names(value))
    elif isinstance(plan, list):
        for item in plan:
            names.extend(_index_names(item))
    return names


def _node_types(plan: Any) -> list[tuple[str, str | None]]:
    nodes: list[tuple[str, str | None]] = []
    if isinstance(plan, dict):
        if "Node Type" in plan:
            nodes.append((plan["Node Type"], plan.get("Relation Name")))
        for value in plan.values():
            nodes.extend(_node_types(value))
    elif isinstance(plan, list):
        for item in plan:
            nodes.extend(_node_types(item))
    return nodes


def test_the_claim_uses_the_ready_index(db: Conn) -> None:
    """A pgqueuer-style plan regression test: a table as it looks after a while (mostly
    finished rows, a backlog of ready ones, some in flight), analysed; the claim must read
    job_ready_queue_idx rather than scan the table."""
    db.execute(
        "INSERT INTO job (topic, state, locked_by, locked_until, available_at, updated_at) "
        "SELECT 'topic-' || (g % 7), "
        "       CASE WHEN g % 50 = 0 THEN 'pending' WHEN g % 50 = 1 THEN 'failed' "
        "            WHEN g % 50 = 2 THEN 'processing' ELSE 'done' END, "
        "       CASE WHEN g % 50 = 2 THEN 'w' END, "
        "       CASE WHEN g % 50 = 2 THEN now() + interval '30 seconds' END, "
        "       now() - make_interval(secs => g), now() "
        "FROM generate_series(1, 60000) AS g"
    )
    db.execute("ANALYZE job")
    for limit in (1, 10):
        params = {
            "done": [],
            "topics": ["topic-1", "topic-3"],
            "limit": limit,
            "children": 1,
            "worker": "w1",
            "lease": 30.0,
            "queue": "default",
        }
        row = db.execute("EXPLAIN (FORMAT JSON) " + Q.job_finish_and_claim, params).fetchone()
        assert row is not None
        plan = row["QUERY PLAN"]
        if isinstance(plan, str):
            plan = json.loads(plan)
        shown = json.dumps(plan, indent=1)
        assert "job_ready_queue_idx" in _index_names(plan), shown
        nodes = _node_types(plan)
        # The index gives the FIFO order: no sort of the ready rows, no scan of the table.
        assert ("Index Scan", "job") in nodes, shown
        assert not any(node in ("Sort", "Incremental Sort") for node, _ in nodes), shown
        assert ("Seq Scan", "job") not in nodes, shown
    # And the plan is not only chosen but works: the oldest ready row of those topics.
    expected = db.execute(
        "SELECT id FROM job WHERE state IN ('pending', 'failed') AND available_at <= now() "
        "AND topic IN ('topic-1', 'topic-3') ORDER BY available_at, id LIMIT 1"
    ).fetchone()
    assert expected is not None
    assert claim(db, "w1", ("topic-1", "topic-3"))[0]["id"] == expected["id"]


def test_the_claim_locks_exactly_the_rows_it_claims(connect: Callable[..., Conn], db: Conn) -> None:
    """PostgreSQL bug #15715: an "id IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)" may
    lock more than n rows. The claim's CTE must lock exactly the rows it returns."""
    for i in range(20):
        insert(db, offset=-i - 1)
    worker = connect(autocommit=False)
    assert len(claim(worker, "A", limit=3)) == 3  # transaction open: locks held
    row = db.execute("SELECT count(*) AS n FROM (SELECT id FROM job FOR UPDATE SKIP LOCKED) s")
    assert row.fetchone()["n"] == 17  # type: ignore[index]
    worker.rollback()


def test_brooq_never_unpickles() -> None:
    """Payloads are JSON only: no module of brooq imports pickle, marshal or shelve."""
    import ast
    from pathlib import Path

    import brooq

    for path in Path(brooq.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not {"pickle", "marshal", "shelve", "dill", "cloudpickle"} & {
                n.split(".")[0] for n in names
            }, path
