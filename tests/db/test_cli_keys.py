"""`brooq keys`, `brooq keys unblock`, `brooq enqueue --ordering-key` and the blocked keys
`brooq queues` counts, run as the operator runs them (a subprocess) against a real
database: the listing (none, dead, retrying, --topic, --limit, --json), the unblock (the
key's next job pending, the dead one left dead), and the refusals (exit 2, one line on
stderr, nothing written).

Every check of what changed (and of what did not) reads the table, not the command's
answer. The claims and failures are the children's own statements."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import brooq
from brooq.sql import Q
from tests.db.test_cli import as_json, ok, refused

Conn = psycopg.Connection[Any]
TOPIC = "t.o"
LEASE = 30.0


def claim(dsn: str, topic: str = TOPIC, queue: str = "default") -> list[uuid.UUID]:
    """A child's round trip: the jobs of ``topic`` in ``queue`` it claims (left
    processing), in claim order."""
    params = {
        "done": [],
        "topics": [topic],
        "limit": 50,
        "children": 1,
        "worker": "w",
        "lease": LEASE,
        "queue": queue,
    }
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        rows = conn.execute(Q.job_finish_and_claim, params).fetchall()
    return [r["id"] for r in rows if r["claimed"]]


def fail(db: Conn, job_id: uuid.UUID, *, dead: bool, delay: float = 3600.0) -> str:
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


def states(db: Conn, ids: list[uuid.UUID]) -> list[str]:
    found = dict(db.execute("SELECT id, state FROM job_all WHERE id = ANY(%s)", (ids,)).fetchall())
    return [found[i] for i in ids]


def keyed(
    q: brooq.Queue, n: int, key: str, topic: str = TOPIC, queue: str | None = None
) -> list[Any]:
    """``n`` jobs of ``key``, enqueued in order (in ``queue``, if given): their ids."""
    jobs = [brooq.Job(topic, {"n": i}, ordering_key=key, queue=queue) for i in range(n)]
    return [job_id for job_id, _ in q.enqueue_many(jobs)]


def blocked_dead(queue: brooq.Queue, db: Conn, dsn: str, n: int, key: str) -> list[Any]:
    """``n`` jobs of ``key``, the first claimed and dead: the key blocked."""
    ids = keyed(queue, n, key)
    assert claim(dsn) == [ids[0]]
    assert fail(db, ids[0], dead=True) == "dead"
    return ids


def blocks(db: Conn) -> list[tuple[str, str, uuid.UUID]]:
    """brooq_key_block's rows: the keys a dead job blocks."""
    return db.execute(
        "SELECT topic, ordering_key, job_id FROM brooq_key_block ORDER BY job_id"
    ).fetchall()


# -- brooq keys ------------------------------------------------------------------------------


def test_no_blocked_key_is_one_clear_line(dsn: str, queue: brooq.Queue) -> None:
    keyed(queue, 2, "cust-1")  # waiting their turn behind a pending job: not blocked
    assert ok(dsn, "keys") == "(no ordered key is blocked)\n"
    assert ok(dsn, "keys", "--topic", TOPIC) == f"(no ordered key of {TOPIC} is blocked)\n"
    assert as_json(dsn, "keys") == []


def test_dead_and_retrying_keys_are_listed_oldest_first(
    dsn: str, queue: brooq.Queue, db: Conn
) -> None:
    dead = blocked_dead(queue, db, dsn, 3, "cust-1")
    retrying = keyed(queue, 2, "cust 2")
    assert claim(dsn) == [retrying[0]]
    assert fail(db, retrying[0], dead=False) == "failed"
    other = keyed(queue, 1, "cust-1", topic="t.other", queue="bulk")
    assert claim(dsn, "t.other", "bulk") == other
    assert fail(db, other[0], dead=True) == "dead"

    lines = ok(dsn, "keys").splitlines()
    assert [h.strip() for h in lines[0].split("  ") if h.strip()] == [
        "TOPIC",
        "KEY",
        "REASON",
        "JOB",
        "QUEUE",
        "SINCE",
        "RETRY AT",
        "WAITING",
    ]
    first, second, third = lines[1:]
    assert first.split()[:5] == [TOPIC, "cust-1", "dead", str(dead[0]), "default"]
    assert first.split()[-2:] == ["-", "2"] and first.count(" UTC") == 1  # no retry at
    assert second.split()[:6] == [TOPIC, "cust", "2", "retrying", str(retrying[0]), "default"]
    assert second.split()[-1] == "1" and second.count(" UTC") == 2  # since, retry at
    assert third.split()[:5] == ["t.other", "cust-1", "dead", str(other[0]), "bulk"]
    assert third.split()[-2:] == ["-", "0"]

    listed = as_json(dsn, "keys")
    assert [(k["topic"], k["ordering_key"], k["reason"], k["job_id"]) for k in listed] == [
        (TOPIC, "cust-1", "dead", str(dead[0])),
        (TOPIC, "cust 2", "retrying", str(retrying[0])),
        ("t.other", "cust-1", "dead", str(other[0])),
    ]
    assert [(k["queue"], k["waiting"]) for k in listed] == [
        ("default", 2),
        ("default", 1),
        ("bulk", 0),
    ]
    assert listed[0]["retry_at"] is None and listed[1]["retry_at"] is not None
    assert list(listed[0]) == [
        "topic",
        "ordering_key",
        "reason",
        "job_id",
        "queue",
        "since",
        "retry_at",
        "waiting",
    ]

    only = as_json(dsn, "keys", "--topic", "t.other")
    assert [k["job_id"] for k in only] == [str(other[0])]
    assert len(ok(dsn, "keys", "--topic", TOPIC).splitlines()) == 3
    assert [k["job_id"] for k in as_json(dsn, "keys", "--limit", "1")] == [str(dead[0])]
    # Listing changes nothing.
    assert states(db, dead + retrying + other) == [
        "dead",
        "waiting",
        "waiting",
        "failed",
        "waiting",
        "dead",
    ]


# -- brooq keys unblock ----------------------------------------------------------------------


def test_unblock_starts_the_next_job_and_the_dead_one_stays_dead(
    dsn: str, queue: brooq.Queue, db: Conn
) -> None:
    first, second, third = blocked_dead(queue, db, dsn, 3, "cust-1")
    out = ok(dsn, "keys", "unblock", TOPIC, "cust-1")
    assert out == f"unblocked key 'cust-1' of topic {TOPIC}: its next job {second} is pending\n"
    assert states(db, [first, second, third]) == ["dead", "pending", "waiting"]
    assert blocks(db) == []
    assert as_json(dsn, "keys") == []
    assert claim(dsn) == [second]  # the key goes on in order, one at a time

    # Again: no dead job blocks it any more.
    line = refused(dsn, "keys", "unblock", TOPIC, "cust-1", code=2)
    assert line == (
        f"error: no dead job blocks key 'cust-1' of topic '{TOPIC}': nothing to unblock "
        "(brooq keys lists the blocked keys)"
    )
    assert states(db, [first, second, third]) == ["dead", "processing", "waiting"]


def test_unblock_with_nothing_waiting_starts_no_job(dsn: str, queue: brooq.Queue, db: Conn) -> None:
    [only] = blocked_dead(queue, db, dsn, 1, "cust-1")
    out = ok(dsn, "keys", "unblock", TOPIC, "cust-1")
    assert out == (
        f"unblocked key 'cust-1' of topic {TOPIC}: no job started (none waits its turn, or "
        "another job of the key is unfinished)\n"
    )
    assert states(db, [only]) == ["dead"] and blocks(db) == []
    # The key is free: its next job starts at once.
    [later] = keyed(queue, 1, "cust-1")
    assert states(db, [later]) == ["pending"]


def test_unblock_json(dsn: str, queue: brooq.Queue, db: Conn) -> None:
    _, second = blocked_dead(queue, db, dsn, 2, "k")
    assert as_json(dsn, "keys", "unblock", TOPIC, "k") == {
        "topic": TOPIC,
        "ordering_key": "k",
        "started": str(second),
    }


BAD_INPUTS = [
    (("keys", "unblock", "Bad Topic", "cust-1"), "Invalid value for 'TOPIC'"),
    (("keys", "unblock", TOPIC, ""), "Invalid value for 'KEY': an ordering key is 1 to 256"),
    (("keys", "unblock", TOPIC, "a\nb"), "holds a control character"),
    (("keys", "unblock", TOPIC, "x" * 257), "257 characters long"),
    (("keys", "unblock", TOPIC), "Missing argument 'KEY'"),
    (("keys", "unblock", TOPIC, "nobody"), "no dead job blocks key 'nobody'"),
    (("keys", "unblock", TOPIC, "busy"), "no dead job blocks key 'busy'"),  # a retry awaited
    (
        ("keys", "unblock", "t.other", "cust-1"),
        "no dead job blocks key 'cust-1' of topic 't.other'",
    ),
    (("keys", "--topic", "Bad Topic"), "Invalid value for '--topic'"),
    (("keys", "--topic", ""), "Invalid value for '--topic'"),
    (("keys", "--limit", "0"), "Invalid value for '--limit'"),
    (("keys", "--limit", "10001"), "Invalid value for '--limit'"),
    (("keys", "--limit", "many"), "Invalid value for '--limit'"),
    (("keys", "--json", "unblock", TOPIC, "cust-1"), "give --json without unblock"),
    (("keys", "--topic", TOPIC, "unblock", TOPIC, "cust-1"), "give --topic without unblock"),
    (("keys", "stop"), "No such command 'stop'"),
]


def test_bad_input_is_refused_in_one_line_and_nothing_is_written(
    dsn: str, queue: brooq.Queue, db: Conn
) -> None:
    """Every case of BAD_INPUTS against one database: each refused with exit 2 in one
    line naming what was wrong, the blocks and the jobs as they were after each."""
    ids = blocked_dead(queue, db, dsn, 2, "cust-1")
    busy = keyed(queue, 2, "busy")
    assert claim(dsn) == [busy[0]] and fail(db, busy[0], dead=False) == "failed"
    expected = ([(TOPIC, "cust-1", ids[0])], ["dead", "waiting", "failed", "waiting"])
    assert (blocks(db), states(db, ids + busy)) == expected
    for args, message in BAD_INPUTS:
        line = refused(dsn, *args, code=2)
        assert message in line, (args, line)
        assert "Traceback" not in line
        assert (blocks(db), states(db, ids + busy)) == expected, args


# -- brooq enqueue --ordering-key ------------------------------------------------------------


def test_enqueue_with_an_ordering_key(dsn: str, queue: brooq.Queue, db: Conn) -> None:
    first = ok(dsn, "enqueue", TOPIC, "--ordering-key", "cust-1").split()
    second = as_json(dsn, "enqueue", TOPIC, "--ordering-key", "cust-1", "--payload", '{"n": 2}')
    other = ok(dsn, "enqueue", TOPIC, "--ordering-key", "cust-2").split()
    assert first[0] == "enqueued" and second["created"] is True and other[0] == "enqueued"
    ids = [uuid.UUID(first[1]), uuid.UUID(second["id"]), uuid.UUID(other[1])]
    assert states(db, ids) == ["pending", "waiting", "pending"]
    record = queue.get(ids[1])
    assert record is not None and record.ordering_key == "cust-1" and record.payload == {"n": 2}
    assert set(claim(dsn)) == {ids[0], ids[2]}  # one job per key
    shown = ok(dsn, "jobs", "show", str(ids[1])).splitlines()
    assert "ordering key:    cust-1, behind an earlier job of its key" in shown
    assert "ordering key:    cust-2" in ok(dsn, "jobs", "show", str(ids[2])).splitlines()
    plain = ok(dsn, "enqueue", "t.plain").split()[1]
    assert "ordering key" not in ok(dsn, "jobs", "show", plain)  # a line only when it has one


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--ordering-key", ""), "Invalid value for --ordering-key: an ordering key is 1 to 256"),
        (("--ordering-key", "x" * 257), "257 characters long"),
        (("--ordering-key", "a\tb"), "holds a control character"),
        (("--ordering-key", "k", "--unique-key", "u"), "cannot be combined with unique_key"),
        (
            ("--ordering-key", "k", "--after", str(uuid.UUID(int=1))),
            "cannot be combined with after",
        ),
    ],
)
def test_enqueue_refuses_a_bad_ordering_key(
    dsn: str, db: Conn, extra: tuple[str, ...], message: str
) -> None:
    line = refused(dsn, "enqueue", TOPIC, *extra, code=2)
    assert message in line, line
    assert "--ordering-key" in line
    assert db.execute("SELECT count(*) FROM job_all").fetchone() == (0,)


# -- brooq queues ----------------------------------------------------------------------------


def test_queues_counts_the_blocked_keys(dsn: str, queue: brooq.Queue, db: Conn) -> None:
    queue.enqueue(brooq.Job("t.plain", queue="bulk"))
    # No key blocked: no column, zeros in JSON.
    assert "BLOCKED KEYS" not in ok(dsn, "queues")
    assert [q["blocked_keys"] for q in as_json(dsn, "queues")] == [{"dead": 0, "retrying": 0}]

    blocked_dead(queue, db, dsn, 2, "a")
    blocked_dead(queue, db, dsn, 1, "b")
    busy = keyed(queue, 2, "c")
    assert claim(dsn) == [busy[0]] and fail(db, busy[0], dead=False) == "failed"

    listed = {q["name"]: q for q in as_json(dsn, "queues")}
    assert listed["default"]["blocked_keys"] == {"dead": 2, "retrying": 1}
    assert listed["bulk"]["blocked_keys"] == {"dead": 0, "retrying": 0}
    assert list(listed["default"])[-2:] == ["blocked_keys", "limits"]

    lines = ok(dsn, "queues").splitlines()
    assert lines[0].endswith("OLDEST READY  BLOCKED KEYS")
    rows = {line.split()[0]: line for line in lines[1:]}
    assert rows["default"].endswith("  2 dead, 1 retrying")
    assert rows["bulk"].endswith("  -")

    # Unblocked, a key is counted no more.
    ok(dsn, "keys", "unblock", TOPIC, "a")
    listed = {q["name"]: q for q in as_json(dsn, "queues")}
    assert listed["default"]["blocked_keys"] == {"dead": 1, "retrying": 1}
