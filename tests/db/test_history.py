"""Finished jobs in job_history (migration 0020): how rows get there, the races of a row
that leaves job while another session writes it, and the partitions' upkeep."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg import sql

from brooq import migrate
from brooq.settings import history_partition_problems
from brooq.sql import Q
from brooq.supervisor import history, maintenance

Conn = psycopg.Connection[Any]
Row = dict[str, Any]

LEASE = 30.0


@pytest.fixture
def db(connect: Callable[..., Conn]) -> Conn:
    return connect()


def insert(db: Conn, topic: str = "t", **columns: Any) -> uuid.UUID:
    names = ["id", "topic", "available_at", *columns]
    job_id = uuid.uuid4()
    values = [job_id, topic, datetime.now(timezone.utc) - timedelta(seconds=1), *columns.values()]
    marks = ", ".join(["%s"] * len(values))
    db.execute(f"INSERT INTO job ({', '.join(names)}) VALUES ({marks})", values)
    return job_id


def round_trip(conn: Conn, worker: str, done: list[uuid.UUID], limit: int = 1) -> list[Row]:
    """The hot-path statement: write `done` for ``done``, claim up to ``limit``."""
    return conn.execute(
        Q.job_finish_and_claim,
        {
            "done": done,
            "topics": ["t"],
            "limit": limit,
            "children": 1,
            "worker": worker,
            "lease": LEASE,
            "queue": "default",
        },
    ).fetchall()


def claim_one(conn: Conn, worker: str) -> uuid.UUID:
    rows = [r for r in round_trip(conn, worker, []) if r["claimed"]]
    assert len(rows) == 1, rows
    return uuid.UUID(str(rows[0]["id"]))


def where(db: Conn, job_id: uuid.UUID) -> list[tuple[str, str]]:
    """(relation, state) of every row with this id, in job and job_history."""
    rows = db.execute(
        "SELECT 'job' AS rel, state FROM job WHERE id = %(id)s "
        "UNION ALL SELECT 'history', state FROM job_history WHERE id = %(id)s",
        {"id": job_id},
    ).fetchall()
    return sorted((r["rel"], r["state"]) for r in rows)


def test_job_history_has_the_columns_of_job_in_its_order(db: Conn) -> None:
    def columns(table: str) -> list[tuple[str, str]]:
        rows = db.execute(
            "SELECT attname, format_type(atttypid, atttypmod) AS type FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            [table],
        ).fetchall()
        return [(r["attname"], r["type"]) for r in rows]

    assert columns("job_history") == columns("job")
    assert columns("job_all") == columns("job")
    # The claim statement's INSERT lists every column: one more column in job, and this
    # would not hold (the statement would no longer run).
    insert(db)
    worker = "w1"
    job_id = claim_one(db, worker)
    round_trip(db, worker, [job_id], limit=0)
    assert where(db, job_id) == [("history", "done")]


def test_the_claim_statement_moves_its_done_rows_with_their_outcome(db: Conn) -> None:
    ids = [insert(db) for _ in range(3)]
    worker = "w1"
    claimed = [r["id"] for r in round_trip(db, worker, [], limit=3) if r["claimed"]]
    assert sorted(claimed) == sorted(ids)
    before = db.execute("SELECT * FROM job WHERE id = %s", [ids[0]]).fetchone()
    # Every `done` written: none of them comes back (only an unwritten one would).
    assert round_trip(db, worker, ids, limit=0) == []
    for job_id in ids:
        assert where(db, job_id) == [("history", "done")]
    after = db.execute("SELECT * FROM job_history WHERE id = %s", [ids[0]]).fetchone()
    assert after is not None and before is not None
    assert after["updated_at"] > before["updated_at"]
    for column in ("topic", "payload", "attempts", "available_at", "locked_by", "started_at"):
        assert after[column] == before[column], column
    # A second write of the same done finds nothing: written exactly once, and each
    # comes back as not written.
    again = round_trip(db, worker, ids, limit=0)
    assert sorted(r["id"] for r in again if not r["claimed"]) == sorted(ids)
    assert all(r["topic"] is None for r in again)
    assert db.execute("SELECT count(*) AS n FROM job_history").fetchone() == {"n": 3}


def test_every_other_end_moves_the_row_by_its_trigger(db: Conn) -> None:
    worker = "w1"
    dead, canceled, done = insert(db), insert(db), insert(db)
    claimed = [r["id"] for r in round_trip(db, worker, [], limit=3) if r["claimed"]]
    assert sorted(claimed) == sorted([dead, canceled, done])
    db.execute(
        "UPDATE job SET state = 'dead', last_error = 'x' WHERE id = %s RETURNING state", [dead]
    )
    db.execute(Q.job_set_done, {"id": done, "worker": worker, "result": '{"a": 1}'})
    # By hand, as an operator would: the row moves all the same.
    db.execute("UPDATE job SET state = 'canceled' WHERE id = %s", [canceled])
    assert where(db, dead) == [("history", "dead")]
    assert where(db, canceled) == [("history", "canceled")]
    assert where(db, done) == [("history", "done")]
    row = db.execute("SELECT result FROM job_all WHERE id = %s", [done]).fetchone()
    assert row == {"result": {"a": 1}}


def test_a_late_done_racing_the_reaper_neither_errors_nor_writes_twice(
    connect: Callable[..., Conn],
) -> None:
    """The worker's done holds the row (moved, uncommitted) while the reaper's pass
    looks for expired leases: the reaper skips the locked row (SKIP LOCKED), its next
    pass finds the row gone, and the job ends done once."""
    db = connect()
    job_id = insert(db)
    worker = "w1"
    claim_one(db, worker)
    db.execute("UPDATE job SET locked_until = now() - interval '1 second' WHERE id = %s", [job_id])
    child = connect(autocommit=False)
    reaper = connect(autocommit=False)
    round_trip(child, worker, [job_id], limit=0)  # the move, not committed
    returned, dead = maintenance.reap_expired(reaper, 5)
    reaper.commit()
    assert not returned and not dead
    child.commit()
    returned, dead = maintenance.reap_expired(reaper, 5)
    reaper.commit()
    assert not returned and not dead
    assert where(db, job_id) == [("history", "done")]
    row = db.execute("SELECT attempts, lease_expiries FROM job_all WHERE id = %s", [job_id])
    assert row.fetchone() == {"attempts": 1, "lease_expiries": 0}


def test_the_reaper_first_then_the_late_done_finds_no_claim(
    connect: Callable[..., Conn],
) -> None:
    db = connect()
    job_id = insert(db)
    worker = "w1"
    claim_one(db, worker)
    db.execute("UPDATE job SET locked_until = now() - interval '1 second' WHERE id = %s", [job_id])
    reaper = connect(autocommit=False)
    child = connect(autocommit=False)
    returned, _ = maintenance.reap_expired(reaper, 5)
    assert sum(returned.values()) == 1
    result: dict[str, Any] = {}

    def late_done() -> None:
        try:
            result["rows"] = round_trip(child, worker, [job_id], limit=0)
            child.commit()
        except Exception as exc:
            result["error"] = exc

    thread = threading.Thread(target=late_done)
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive()
    reaper.commit()
    thread.join(10)
    assert "error" not in result, result
    # Its claim was lost: nothing written, and the statement says so.
    assert [(r["claimed"], r["id"]) for r in result["rows"]] == [(False, job_id)]
    assert where(db, job_id) == [("job", "pending")]


def test_a_cancel_racing_the_claim_statements_done_reports_the_end(
    connect: Callable[..., Conn],
) -> None:
    db = connect()
    job_id = insert(db)
    worker = "w1"
    claim_one(db, worker)
    child = connect(autocommit=False)
    operator = connect()
    round_trip(child, worker, [job_id], limit=0)
    result: dict[str, Any] = {}

    def cancel() -> None:
        try:
            result["updated"] = operator.execute(
                "UPDATE job SET state = 'canceled' WHERE id = %s "
                "AND state IN ('pending', 'failed', 'processing', 'waiting')",
                [job_id],
            ).rowcount
        except Exception as exc:
            result["error"] = exc

    thread = threading.Thread(target=cancel)
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive()
    child.commit()
    thread.join(10)
    assert result == {"updated": 0}
    assert where(db, job_id) == [("history", "done")]


def partitions(db: Conn) -> list[str]:
    rows = db.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'job_history'::regclass ORDER BY 1"
    ).fetchall()
    return [r["relname"] for r in rows]


def drop_partitions(db: Conn) -> None:
    """Every partition but the default one gone: a master down past those made ahead."""
    for name in partitions(db):
        if name != "job_history_default":
            db.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(name)))


def make_partition(db: Conn, start: datetime, end: datetime) -> str:
    """A partition of a past range, as an earlier master made it."""
    name = "job_history_" + start.strftime("%Y%m%d_%H%M%S")
    db.execute(
        sql.SQL("CREATE TABLE {} PARTITION OF job_history FOR VALUES FROM ({}) TO ({})").format(
            sql.Identifier(name), sql.Literal(start), sql.Literal(end)
        )
    )
    return name


def day(days_ago: int) -> datetime:
    today = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    return today - timedelta(days=days_ago)


def test_the_migration_makes_today_and_four_days_ahead(db: Conn) -> None:
    today = day(0)
    expected = [
        "job_history_" + (today + timedelta(days=n)).strftime("%Y%m%d") + "_000000"
        for n in range(5)
    ]
    assert partitions(db) == [*expected, "job_history_default"]


def test_an_outcome_never_fails_for_a_missing_partition(db: Conn) -> None:
    drop_partitions(db)
    job_id = insert(db)
    claim_one(db, "w1")
    round_trip(db, "w1", [job_id], limit=0)
    row = db.execute(
        "SELECT tableoid::regclass::text AS part FROM job_history WHERE id = %s", [job_id]
    ).fetchone()
    assert row == {"part": "job_history_default"}
    # The master makes partitions from the first boundary after now again, never one that
    # covers now (an insert routing a row as it is attached would fail): the row stays in
    # the default partition, which retention empties row by row.
    made = history.prepare(db, 3600.0)
    assert made in (23, 24)  # the hours from the next one that starts 5 min away to now + 24 h
    first = min(p for p in partitions(db) if p != "job_history_default")
    start = datetime.strptime(first, "job_history_%Y%m%d_%H%M%S").replace(tzinfo=timezone.utc)
    assert start > datetime.now(timezone.utc)
    row = db.execute(
        "SELECT tableoid::regclass::text AS part FROM job_history WHERE id = %s", [job_id]
    ).fetchone()
    assert row == {"part": "job_history_default"}
    assert history.prepare(db, 3600.0) in (0, 1)  # the day ahead, its last span at most
    assert history.prepare(db, 3600.0) == 0


def test_a_row_of_the_default_partition_moves_into_the_partition_made_for_it(db: Conn) -> None:
    drop_partitions(db)
    job_id = insert(db)
    _end_at(db, job_id, datetime.now(timezone.utc) + timedelta(hours=6))  # a clock set back
    history.prepare(db, 3600.0)
    row = db.execute(
        "SELECT tableoid::regclass::text AS part FROM job_history WHERE id = %s", [job_id]
    ).fetchone()
    assert row is not None and row["part"] != "job_history_default"


def test_an_outcome_goes_on_while_partitions_are_attached(connect: Callable[..., Conn]) -> None:
    """Round trips in a thread while the master attaches partitions ahead: none fails."""
    db = connect()
    drop_partitions(db)
    worker = connect()
    ids = [insert(db) for _ in range(200)]
    errors: list[Exception] = []
    stop = threading.Event()

    def work() -> None:
        left = list(ids)
        try:
            while left and not stop.is_set():
                claimed = [r["id"] for r in round_trip(worker, "w1", [], limit=5) if r["claimed"]]
                round_trip(worker, "w1", claimed, limit=0)
                left = [i for i in left if i not in claimed]
        except Exception as exc:
            errors.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    made = 0
    for _ in range(10):
        made += history.prepare(db, 3600.0)
    thread.join(30)
    stop.set()
    assert errors == []
    assert made >= 23
    n = db.execute("SELECT count(*) AS n FROM job_history").fetchone()
    assert n == {"n": 200}


def test_prepare_makes_partitions_ahead_aligned_and_never_twice(db: Conn) -> None:
    # The migration made five days; three days ahead are covered: nothing to make.
    assert history.prepare(db, 86400.0) == 0
    drop_partitions(db)
    assert history.prepare(db, 86400.0) == 3  # tomorrow and the two days after: 3 days ahead
    names = partitions(db)
    tomorrow = day(-1).strftime("%Y%m%d")
    assert names[0] == f"job_history_{tomorrow}_000000"
    assert history.prepare(db, 86400.0) == 0
    # A shorter span later goes on from the end of the last partition, without overlap.
    assert history.prepare(db, 3600.0) == 0


def _end_at(db: Conn, job_id: uuid.UUID, when: datetime, state: str = "done") -> None:
    """Put a finished job's row in history with its end at ``when``."""
    db.execute(
        "WITH gone AS (DELETE FROM job WHERE id = %(id)s RETURNING *) "
        "INSERT INTO job_history SELECT (gone).* FROM gone",
        {"id": job_id},
    )
    db.execute(
        "UPDATE job_history SET state = %(state)s, updated_at = %(at)s WHERE id = %(id)s",
        {"id": job_id, "at": when, "state": state},
    )


def test_a_partition_past_retention_is_dropped_whole_with_its_keys_and_steps(
    db: Conn,
) -> None:
    for n in (11, 10, 9):
        make_partition(db, day(n), day(n - 1))
    old = day(9) + timedelta(hours=12)
    keyed = insert(db, idempotency_key="k-1")
    plain = insert(db)
    recent = insert(db)
    _end_at(db, keyed, old)
    _end_at(db, plain, old)
    db.execute("INSERT INTO brooq_job_step (job_id, name) VALUES (%s, 'a')", [plain])
    history.prepare(db, 86400.0)
    _end_at(db, recent, datetime.now(timezone.utc))
    assert db.execute("SELECT count(*) AS n FROM brooq_job_key").fetchone() == {"n": 1}
    dropped = history.drop_expired(db, 7 * 86400.0, budget=60.0)
    assert "job_history_" + old.strftime("%Y%m%d") + "_000000" in [d.name for d in dropped]
    assert sum(d.released for d in dropped) == 1
    assert where(db, keyed) == [] and where(db, plain) == []
    assert where(db, recent) == [("history", "done")]
    assert db.execute("SELECT count(*) AS n FROM brooq_job_key").fetchone() == {"n": 0}
    assert db.execute("SELECT count(*) AS n FROM brooq_job_step").fetchone() == {"n": 0}
    # The key is free again for a new job.
    insert(db, idempotency_key="k-1")


def test_a_partitions_keys_are_released_a_batch_per_pass_before_it_is_dropped(
    db: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no time budget each call releases one batch of keys; the partition is dropped
    by the call that finds its last batch short, its keys counted over every call, and
    each released key free for a new job even before the drop."""
    monkeypatch.setattr(history, "KEYS_BATCH", 2)
    make_partition(db, day(9), day(8))  # the one expired partition
    old = day(9) + timedelta(hours=12)
    keyed = {f"k-{n}": insert(db, idempotency_key=f"k-{n}") for n in range(5)}
    order = sorted(keyed, key=lambda k: keyed[k])  # the keys in their jobs' id order
    plain = insert(db)
    for job_id in [*keyed.values(), plain]:
        _end_at(db, job_id, old)
    history.prepare(db, 86400.0)
    name = "job_history_" + old.strftime("%Y%m%d") + "_000000"

    def keys() -> list[str]:
        rows = db.execute("SELECT idempotency_key AS k FROM brooq_job_key ORDER BY 1").fetchall()
        return [r["k"] for r in rows]

    releasing: dict[str, history.Releasing] = {}
    assert history.drop_expired(db, 7 * 86400.0, releasing=releasing, budget=0.0) == []
    assert keys() == sorted(order[2:]) and list(releasing) == [name]
    assert releasing[name].released == 2
    assert where(db, keyed[order[0]]) == [("history", "done")]  # released, not yet dropped
    assert history.drop_expired(db, 7 * 86400.0, releasing=releasing, budget=0.0) == []
    assert keys() == [order[4]]
    insert(db, idempotency_key=order[0])  # a released key is free again
    dropped = history.drop_expired(db, 7 * 86400.0, releasing=releasing, budget=0.0)
    assert [(d.name, d.released) for d in dropped] == [(name, 5)]
    assert releasing == {} and keys() == [order[0]]  # the new job's
    assert all(where(db, job_id) == [] for job_id in [*keyed.values(), plain])


def test_a_partition_dropped_by_another_master_is_forgotten(
    db: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(history, "KEYS_BATCH", 1)
    make_partition(db, day(9), day(8))  # the one expired partition
    old = day(9) + timedelta(hours=12)
    for n in range(3):
        _end_at(db, insert(db, idempotency_key=f"k-{n}"), old)
    history.prepare(db, 86400.0)
    mine: dict[str, history.Releasing] = {}
    assert history.drop_expired(db, 7 * 86400.0, releasing=mine, budget=0.0) == []
    assert len(mine) == 1
    assert (
        len(history.drop_expired(db, 7 * 86400.0, budget=60.0)) == 1
    )  # the other master, unhurried
    assert history.drop_expired(db, 7 * 86400.0, releasing=mine, budget=0.0) == []
    assert mine == {}


def test_an_upstream_job_still_read_by_a_waiting_job_outlives_its_partition(
    db: Conn,
) -> None:
    for n in (11, 10, 9):
        make_partition(db, day(n), day(n - 1))
    old = day(9) + timedelta(hours=12)
    up = insert(db)
    other = insert(db)
    down = insert(db, state="waiting", upstream_open=1, on_upstream_failure="cancel")
    db.execute("UPDATE job SET has_downstream = true WHERE id = %s", [up])
    db.execute(
        "INSERT INTO brooq_job_edge (downstream_id, position, upstream_id) VALUES (%s, 1, %s)",
        [down, up],
    )
    _end_at(db, up, old)
    _end_at(db, other, old)
    history.prepare(db, 86400.0)
    dropped = history.drop_expired(db, 7 * 86400.0, budget=60.0)
    assert sum(d.kept for d in dropped) == 1
    assert where(db, up) == [("history", "done")]
    assert where(db, other) == []
    row = db.execute(
        "SELECT tableoid::regclass::text AS part FROM job_history WHERE id = %s", [up]
    ).fetchone()
    assert row == {"part": "job_history_default"}
    # Once nothing waits on it, the default partition's expiry takes it.
    assert sum(history.expire_default(db, 7 * 86400.0, 100).values()) == 0
    db.execute("UPDATE job SET state = 'canceled' WHERE id = %s", [down])
    assert sum(history.expire_default(db, 7 * 86400.0, 100).values()) == 1
    assert where(db, up) == []


def test_a_drop_behind_a_reader_gives_up_soon_and_outcomes_go_on(
    connect: Callable[..., Conn],
) -> None:
    db = connect()
    for n in (11, 10, 9):
        make_partition(db, day(n), day(n - 1))
    old = day(9) + timedelta(hours=12)
    job_id = insert(db)
    _end_at(db, job_id, old)
    history.prepare(db, 86400.0)
    reader = connect(autocommit=False)
    reader.execute("SELECT count(*) FROM job_history").fetchone()  # holds ACCESS SHARE
    started = time.monotonic()
    assert history.drop_expired(db, 7 * 86400.0, budget=60.0) == []
    assert time.monotonic() - started < 2.0
    # Outcomes were never queued behind the drop: one goes through while the reader holds on.
    ready = insert(db)
    claim_one(db, "w1")
    round_trip(db, "w1", [ready], limit=0)
    assert where(db, ready) == [("history", "done")]
    reader.rollback()
    assert len(history.drop_expired(db, 7 * 86400.0, budget=60.0)) == 3  # 11 to 8 days ago
    assert where(db, job_id) == []


def test_an_idempotency_key_stays_taken_after_its_job_moved(db: Conn) -> None:
    job_id = insert(db, idempotency_key="once")
    claim_one(db, "w1")
    round_trip(db, "w1", [job_id], limit=0)
    assert where(db, job_id) == [("history", "done")]
    with pytest.raises(psycopg.errors.UniqueViolation, match="belongs to job"):
        insert(db, idempotency_key="once")
    row = db.execute(
        "SELECT job_id FROM brooq_job_key WHERE topic = 't' AND idempotency_key = 'once'"
    ).fetchone()
    assert row == {"job_id": job_id}


@pytest.mark.parametrize(
    ("span", "ok"),
    [
        (3600.0, True),
        (4 * 3600.0, True),
        (86400.0, True),
        (7 * 86400.0, True),
        (5 * 3600.0, False),
        (1800.0, False),
        (36 * 3600.0, False),
        (8 * 86400.0, False),
    ],
)
def test_history_partition_spans(span: float, ok: bool) -> None:
    assert (history_partition_problems(span) == []) is ok


def test_the_down_step_brings_finished_jobs_back_into_job(dsn: str, db: Conn) -> None:
    ended = insert(db, idempotency_key="k")
    claim_one(db, "w1")
    round_trip(db, "w1", [ended], limit=0)
    db.execute("INSERT INTO brooq_job_step (job_id, name) VALUES (%s, 'a')", [ended])
    db.execute("INSERT INTO brooq_job_step (job_id, name) VALUES (%s, 'a')", [uuid.uuid4()])
    migrate.down(dsn, to=19)
    row = db.execute("SELECT state FROM job WHERE id = %s", [ended]).fetchone()
    assert row == {"state": "done"}
    assert db.execute("SELECT to_regclass('job_history') AS t").fetchone() == {"t": None}
    # The foreign key is back, orphans gone: the step of a job that never existed went.
    assert db.execute("SELECT count(*) AS n FROM brooq_job_step").fetchone() == {"n": 1}
    fk = db.execute(
        "SELECT convalidated FROM pg_constraint WHERE conname = 'brooq_job_step_job_id_fkey'"
    ).fetchone()
    assert fk == {"convalidated": True}
    migrate.up(dsn)
    assert where(db, ended) == [("job", "done")]  # stays as a legacy row


def test_the_down_step_moves_a_large_history_back_in_batches(dsn: str, db: Conn) -> None:
    """More rows than a batch, in two partitions (today's and the default), come back
    before the locked step; a row whose key was released with its partition and taken
    since by an active job comes back without it, the active job keeps it."""
    db.execute(
        "INSERT INTO job_history (id, topic, state, updated_at) "
        "SELECT gen_random_uuid(), 'bulk', 'done', now() - (g % 2) * interval '30 days' "
        "FROM generate_series(1, 25000) AS g"
    )
    old = insert(db, idempotency_key="reused")
    claim_one(db, "w1")
    round_trip(db, "w1", [old], limit=0)
    db.execute("DELETE FROM brooq_job_key WHERE idempotency_key = 'reused'")  # released
    taker = insert(db, idempotency_key="reused")
    parts = db.execute(
        "SELECT count(DISTINCT tableoid) AS n FROM job_history WHERE topic = 'bulk'"
    ).fetchone()
    assert parts == {"n": 2}
    # Each statement that inserts into job notes its transaction: the rows must come back
    # in several (a batch of 10,000 each), not in the locked one alone.
    db.execute("CREATE TABLE moves (tx bigint, n bigint)")
    db.execute(
        "CREATE FUNCTION note_move() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "INSERT INTO moves SELECT txid_current(), count(*) FROM added; RETURN NULL; END $$"
    )
    db.execute(
        "CREATE TRIGGER note_move AFTER INSERT ON job REFERENCING NEW TABLE AS added "
        "FOR EACH STATEMENT EXECUTE FUNCTION note_move()"
    )
    migrate.down(dsn, to=19)
    assert db.execute("SELECT count(*) AS n FROM job WHERE topic = 'bulk'").fetchone() == {
        "n": 25000
    }
    sizes = [r["n"] for r in db.execute("SELECT n FROM moves WHERE n > 0 ORDER BY tx")]
    assert sum(sizes) == 25001 and len(sizes) >= 3 and max(sizes) <= 10000, sizes
    rows = db.execute(
        "SELECT id, state, idempotency_key AS k FROM job WHERE id IN (%s, %s) ORDER BY state",
        [old, taker],
    ).fetchall()
    assert rows == [
        {"id": old, "state": "done", "k": None},
        {"id": taker, "state": "pending", "k": "reused"},
    ]
    assert db.execute(
        "SELECT count(*) AS n FROM pg_proc WHERE proname = 'brooq_history_move_back'"
    ).fetchone() == {"n": 0}
    migrate.up(dsn)


def test_a_round_trip_logs_done_only_for_the_jobs_it_wrote(
    db: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """Through RoundTrips, as a child runs it: three jobs claimed and run, one of them
    reaped and claimed again by another worker meanwhile. The next trip writes the two
    still ours (job_done, counted done) and names the third as not written (its
    outcome_skipped line); the third stays the other worker's."""
    import logging

    from brooq.ipc.board import Board
    from brooq.settings import Settings
    from brooq.worker import execute
    from brooq.worker.connection import ChildConnection
    from brooq.worker.meter import Meter
    from brooq.worker.outcome import OutcomeWriter
    from brooq.worker.roundtrip import RoundTrips
    from brooq.worker.state import ChildState
    from brooq.worker.weights import RoundOrder

    class OnThisConnection:
        local = None

        def get(self) -> Conn:
            return db

    settings, state = Settings(lease=LEASE), ChildState()
    unused = ChildConnection("postgresql://x@127.0.0.1:1/x", "w1", settings, state)
    outcomes = OutcomeWriter("w1", settings, unused, state, Board(), Meter(None))
    trips = RoundTrips(
        "w1", settings, Q, OnThisConnection(), outcomes, {}, ["t"], [],  # type: ignore[arg-type]
        RoundOrder([("default", 1)]), 1, print, lambda held: None,
    )  # fmt: skip
    ids = [insert(db) for _ in range(3)]
    claims = trips.exchange(3)
    assert claims is not None and sorted(c.id for c in claims) == sorted(ids)
    lost = claims[1].id
    db.execute("UPDATE job SET locked_by = 'w2' WHERE id = %s", [lost])  # reaped, taken
    for c in claims:
        assert trips.keep_done(c, execute.DONE, 0.001, None)
    with caplog.at_level(logging.INFO, logger="brooq"):
        assert trips.exchange(0) == []
    done_lines = [r.getMessage() for r in caplog.records if "event=job_done" in r.getMessage()]
    skipped = [r.getMessage() for r in caplog.records if "event=outcome_skipped" in r.getMessage()]
    assert sorted(line.split()[1] for line in done_lines) == sorted(
        f"job={c.id}" for c in claims if c.id != lost
    )
    assert len(skipped) == 1 and f"job={lost}" in skipped[0]
    assert where(db, lost) == [("job", "processing")]
    assert all(where(db, c.id) == [("history", "done")] for c in claims if c.id != lost)
