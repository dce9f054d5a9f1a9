"""Rate limits and groups in the claim statement (brooq_claim_coordinated, migration 0012),
against a real PostgreSQL with several connections: the window's room and what a held-back
claim answers, racing claimers, a claim rolled back, groups at their limit stepped over,
rates per group, the idle windows swept, and what the limits hold back as the operator's
reads count it. The two-master process tests are tests/process/test_rate_limits.py."""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row, tuple_row

import brooq
from brooq.declare.handlers import Handler
from brooq.operator import reads
from brooq.sql import Q
from brooq.worker.pacing import turns

Conn = psycopg.Connection[Any]


@pytest.fixture
def db(connect: Callable[..., Conn]) -> Conn:
    return connect()


def handler(topic: str = "t", **options: Any) -> Handler:
    q = brooq.Queue(dsn="postgresql://x@127.0.0.1:1/x")
    q.handler(topic, **options)(lambda claim: None)
    return q.handlers[topic]


def claim(
    conn: Conn,
    h: Handler,
    worker: str = "w",
    *,
    done: list[uuid.UUID] | None = None,
    topics: tuple[str, ...] = (),
    limit: int = 1,
) -> list[dict[str, Any]]:
    """One round trip of a child whose turn is ``h``'s topic: the statement and the
    parameters brooq.worker.roundtrip sends. The claimed rows (and a held-back answer)."""
    [turn] = turns({h.topic: h})
    params = {
        "done": done or [],
        "topics": list(topics),
        "limit": limit,
        "children": 1,
        "worker": worker,
        "lease": 30.0,
        "queues": ["default"],
        **turn.params,
        "batch": limit,  # the child's pacing: its round trip's limit at most
    }
    cur = conn.cursor(row_factory=dict_row)
    statement = getattr(Q, f"job_finish_and_claim_{turn.shape}")  # coordinated
    rows = cur.execute(statement, params).fetchall()
    return [r for r in rows if r["claimed"]]  # the finished rows (claimed false) left out


def jobs(conn: Conn, topic: str, n: int, group: str | None = None) -> None:
    conn.execute(
        "INSERT INTO job (topic, group_key, available_at) "
        "SELECT %s, %s, now() - interval '1 minute' + i * interval '1 microsecond' "
        "FROM generate_series(1, %s) AS i",
        (topic, group, n),
    )


def group_of(conn: Conn, job_id: uuid.UUID) -> str | None:
    cur = conn.cursor(row_factory=dict_row)
    row = cur.execute("SELECT group_key FROM job_all WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return None if row["group_key"] is None else str(row["group_key"])


# -- rate_limit -----------------------------------------------------------------------------


def test_a_full_window_holds_the_next_start_back_and_says_until_when(db: Conn) -> None:
    h = handler("rt", rate_limit="3/s")
    jobs(db, "rt", 10)
    claimed = [claim(db, h, f"w{i}") for i in range(3)]
    assert all(len(rows) == 1 and rows[0]["id"] is not None for rows in claimed)
    [held] = claim(db, h, "w3")
    assert held["id"] is None and held["claimed"] and held["topic"] == "rt"
    wait = (held["available_at"] - held["locked_until"]).total_seconds()
    # The first start's place lasts the period and the allowance (1.05 s).
    assert 0.85 < wait <= 1.05, wait
    # Held back: pending, no attempt spent.
    assert db.execute(
        "SELECT count(*) AS n, max(attempts) AS attempts FROM job_all WHERE state = 'pending'"
    ).fetchone() == {"n": 7, "attempts": 0}
    time.sleep(wait + 0.01)
    assert claim(db, h, "w3")[0]["id"] is not None  # the window had room again


def test_other_topics_are_claimed_while_the_rated_one_is_held_back(db: Conn) -> None:
    h = handler("rt", rate_limit="1/m")
    jobs(db, "rt", 3)
    jobs(db, "free", 3)
    first = claim(db, h, topics=("free",), limit=2)
    assert sorted(r["topic"] for r in first) == ["free", "rt"]
    again = claim(db, h, topics=("free",), limit=2)
    assert sorted((r["topic"], r["id"] is None) for r in again) == [
        ("free", False),
        ("free", False),
        ("rt", True),
    ]


def test_a_claim_rolled_back_leaves_the_window_as_it_was(dsn: str) -> None:
    h = handler("rt", rate_limit="1/m")
    with psycopg.connect(dsn) as conn:  # one transaction: the claim, then a rollback
        jobs(conn, "rt", 2)
        conn.commit()
        assert claim(conn, h)[0]["id"] is not None
        conn.rollback()
        assert conn.execute("SELECT count(*) FROM brooq_rate_slot").fetchone() == (0,)
        assert claim(conn, h)[0]["id"] is not None  # still room: nothing was counted
        conn.commit()
        assert claim(conn, h)[0]["id"] is None


def test_under_a_rate_a_taken_lock_is_not_waited_for(dsn: str, db: Conn) -> None:
    """Another claim of the topic holds its lock: a rated claim answers at once, held
    back for a millisecond or two, instead of waiting in line (a wait would eat the
    allowance); a claim under group_limit alone waits, as global_limit's does."""
    rated = handler("rt", rate_limit="5/s")
    jobs(db, "rt", 2)
    with psycopg.connect(dsn) as other:
        other.execute("SELECT pg_advisory_xact_lock(1651666799, hashtext('rt'))")
        started = time.perf_counter()
        [held] = claim(db, rated)
        assert time.perf_counter() - started < 1.0
        assert held["id"] is None
        wait = (held["available_at"] - held["locked_until"]).total_seconds()
        assert 0.001 <= wait <= 0.003
    assert claim(db, rated)[0]["id"] is not None  # the lock free again: a start
    grouped = handler("tw", group_limit=1)
    jobs(db, "tw", 1, "A")
    with psycopg.connect(dsn) as other:
        other.execute("SELECT pg_advisory_xact_lock(1651666799, hashtext('tw'))")
        db.execute("SET lock_timeout = '200ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            claim(db, grouped)
        db.execute("RESET lock_timeout")


def test_racing_claimers_never_start_more_than_the_rate_in_any_window(dsn: str) -> None:
    """Eight connections claim a topic of Rate(5, per=0.5 s) for about 2.5 s, each sleeping
    what a held-back answer says. Every start (the stamp each slot takes, logged by a
    trigger) is a window (period + allowance) after the start five before it, and the
    claimers achieve at least 80 % of the rate."""
    rate = brooq.Rate(5, per=timedelta(milliseconds=500))
    h = handler("rt", rate_limit=rate)
    with psycopg.connect(dsn, autocommit=True) as setup:
        jobs(setup, "rt", 400)
        setup.execute("CREATE TABLE slot_log (free_at timestamptz)")
        setup.execute(
            "CREATE FUNCTION log_slot() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "INSERT INTO slot_log VALUES (NEW.free_at); RETURN NULL; END $$"
        )
        setup.execute(
            "CREATE TRIGGER log_slot AFTER INSERT OR UPDATE ON brooq_rate_slot "
            "FOR EACH ROW EXECUTE FUNCTION log_slot()"
        )
    stop = threading.Event()
    errors: list[BaseException] = []

    def claimer(n: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                done: list[uuid.UUID] = []
                while not stop.is_set():
                    rows = claim(conn, h, f"c{n}", done=done)
                    done = [r["id"] for r in rows if r["id"] is not None]
                    held = [r for r in rows if r["id"] is None]
                    if held:
                        wait = (held[0]["available_at"] - held[0]["locked_until"]).total_seconds()
                        time.sleep(max(wait, 0.001))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(2.5)
    stop.set()
    for t in threads:
        t.join(10)
    assert errors == []
    with psycopg.connect(dsn) as conn:
        stamps = [r[0] for r in conn.execute("SELECT free_at FROM slot_log ORDER BY free_at")]
    gaps = [
        (stamps[i + rate.limit] - stamps[i]).total_seconds()
        for i in range(len(stamps) - rate.limit)
    ]
    assert gaps and min(gaps) >= rate.window - 1e-6, min(gaps)
    # The rate the window is used at: N per the median time between a start and the one N
    # before it (the first window's burst and a last straggler do not skew it).
    achieved = rate.limit / statistics.median(gaps)
    assert achieved >= 0.8 * rate.limit / rate.seconds, f"{achieved:.1f} starts/s"


# -- group_limit and group_rate_limit ---------------------------------------------------------


def test_a_group_at_its_limit_is_stepped_over_not_read_through(db: Conn) -> None:
    """group_limit=1, 1,000 jobs of tenant B (taken first: the groups come in turn from
    the highest name down) and 10 of tenant A: while B's one job runs, the next claims
    take A's (each claim in about the time it takes with a short backlog ahead, not one
    that grows with B's)."""
    h = handler("tenant.work", group_limit=1)
    jobs(db, "tenant.work", 1000, "B")
    jobs(db, "tenant.work", 10, "A")
    [b] = claim(db, h, "w0")
    assert group_of(db, b["id"]) == "B"
    [a] = claim(db, h, "w1")
    assert group_of(db, a["id"]) == "A"
    assert claim(db, h, "w2") == []  # both at their limit
    # w1 finishes its A job and claims in the same statement: A's next (its own done
    # does not count), not a job of B.
    [a2] = claim(db, h, "w1", done=[a["id"]])
    assert group_of(db, a2["id"]) == "A"


def claim_buffers(db: Conn, h: Handler) -> int:
    """The buffers (shared, hit or read) a claim that finds nothing to take touches, A at
    its limit with its backlog ahead and B's one job held by another worker: counted by
    EXPLAIN (ANALYZE, BUFFERS) of brooq_claim_batch (a topic under group_limit alone),
    every statement inside it included (deterministic, where a time on a shared machine
    is not). After one call that plans the function's statements."""
    [turn] = turns({h.topic: h})
    assert turn.shape == "coordinated"
    p = turn.params
    call = (
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM brooq_claim_batch("
        "%s, %s, %s, %s, %s, %s, %s, %s, %s, '{default}', '{}', 'probe', 30, 1)"
    )
    names = ("limited", "cap", "rate", "window", "group_cap", "group_rate", "group_window")
    args = [p[k] for k in (*names, "in_turn", "allowance")]
    cur = db.cursor(row_factory=tuple_row)
    cur.execute(call, args)
    [[plan]] = cur.execute(call, args).fetchall()
    node = plan[0]["Plan"]
    return int(node["Shared Hit Blocks"]) + int(node["Shared Read Blocks"])


def test_a_claim_behind_a_blocked_backlog_costs_the_same_at_1000_and_20000(db: Conn) -> None:
    """The groups by name from the last turn, one index probe each, and the jobs without a
    group looked for in at most 256 rows: a claim behind 20,000 blocked jobs touches about
    the buffers it touches behind 1,000 (reading the backlog through would touch
    thousands)."""
    h = handler("tenant.work", group_limit=1)
    jobs(db, "tenant.work", 1000, "A")
    jobs(db, "tenant.work", 1, "B")
    db.execute("ANALYZE job")
    assert claim(db, h, "w0") and claim(db, h, "w1")  # A's and B's running
    small = claim_buffers(db, h)
    db.execute(
        "INSERT INTO job (topic, group_key, available_at) SELECT 'tenant.work', 'A', "
        "now() - interval '2 minutes' FROM generate_series(1, 19000)"
    )
    db.execute("ANALYZE job")
    large = claim_buffers(db, h)
    print(f"a claim behind a blocked backlog: {small} buffers (1,000), {large} (20,000)")
    assert large <= 2 * small + 64, (small, large)


def test_the_groups_take_turns_behind_a_blocked_head(db: Conn) -> None:
    """Z (the first in turn: from the highest name down) is at its limit: a worker that
    finishes and claims again goes on from the group the last claim stopped at (G3, G2,
    G1, G3), not from the first group in turn each time."""
    h = handler("tenant.work", group_limit=1)
    jobs(db, "tenant.work", 40, "Z")
    for g in ("G1", "G2", "G3"):
        jobs(db, "tenant.work", 5, g)
    assert group_of(db, claim(db, h, "w0")[0]["id"]) == "Z"
    seen, done = [], []
    for _ in range(4):
        [row] = claim(db, h, "w1", done=done)
        seen.append(group_of(db, row["id"]))
        done = [row["id"]]
    assert seen == ["G3", "G2", "G1", "G3"]


def test_a_rate_per_group_holds_back_that_group_only(db: Conn) -> None:
    h = handler("tenant.work", group_rate_limit="2/m")
    jobs(db, "tenant.work", 5, "A")
    jobs(db, "tenant.work", 5, "B")
    jobs(db, "tenant.work", 1)  # no group: no group's rate holds it back
    got = [claim(db, h, f"w{i}")[0] for i in range(6)]
    # The job without a group first (its share of a claim), then the groups in turn,
    # each until its window is full.
    assert [group_of(db, row["id"]) for row in got[:5]] == [None, "A", "B", "A", "B"]
    assert got[5]["id"] is None  # both groups' windows are full: held back, with a time
    wait = (got[5]["available_at"] - got[5]["locked_until"]).total_seconds()
    assert 55 < wait <= 63


def test_every_limit_together(db: Conn) -> None:
    """global_limit, rate_limit, group_limit and group_rate_limit on one topic: each
    holds on its own."""
    h = handler("all.four", global_limit=3, rate_limit="4/m", group_limit=1, group_rate_limit="5/m")
    for g in ("A", "B", "C", "D", "E"):
        jobs(db, "all.four", 3, g)
    first = [claim(db, h, f"w{i}") for i in range(4)]
    # The groups in turn from the highest name down.
    assert [group_of(db, rows[0]["id"]) for rows in first[:3]] == ["E", "D", "C"]
    assert first[3] == []  # global_limit 3 reached
    # w0 finishes E's job and claims in the same statement (its own done does not count
    # against the global_limit): the next group in turn, B; the 4th start within the
    # minute.
    [again] = claim(db, h, "w0", done=[first[0][0]["id"]])
    assert group_of(db, again["id"]) == "B"
    [held] = claim(db, h, "w1", done=[first[1][0]["id"]])  # the 5th start within 1 m
    assert held["id"] is None


# -- the sweep and the operator's reads ---------------------------------------------------------


def test_the_sweep_deletes_idle_windows_whole_and_skips_busy_ones(db: Conn) -> None:
    db.execute(
        "INSERT INTO brooq_rate_slot (topic, group_key, slot, free_at) VALUES "
        "('idle', '', 1, now() - interval '1 s'), ('idle', '', 2, now() - interval '2 s'), "
        "('idle', 'A', 1, now() - interval '1 s'), "
        "('busy', '', 1, now() - interval '1 s'), ('busy', '', 2, now() + interval '1 h')"
    )
    assert db.execute(Q.rate_windows_sweep, {"windows": 1000}).fetchone() == {"deleted": 3}
    left = db.execute("SELECT topic, slot FROM brooq_rate_slot ORDER BY 1, 2").fetchall()
    assert [(r["topic"], r["slot"]) for r in left] == [("busy", 1), ("busy", 2)]


def test_the_sweep_leaves_a_topic_whose_lock_is_held(dsn: str, db: Conn) -> None:
    db.execute(
        "INSERT INTO brooq_rate_slot (topic, group_key, slot, free_at) "
        "VALUES ('locked', '', 1, now() - interval '1 s')"
    )
    with psycopg.connect(dsn) as claimer:  # a claim of the topic in progress
        claimer.execute("SELECT pg_advisory_xact_lock(1651666799, hashtext('locked'))")
        assert db.execute(Q.rate_windows_sweep, {"windows": 10}).fetchone() == {"deleted": 0}
    assert db.execute(Q.rate_windows_sweep, {"windows": 10}).fetchone() == {"deleted": 1}


def publish(db: Conn, limits: dict[str, Any], missed: int = 0) -> None:
    """A live master's row (or one ``missed`` beats late) publishing ``limits``."""
    import json

    db.execute(
        "INSERT INTO brooq_master (id, host, pid, version, app, queues, topics, beat_seconds, "
        "started_at, seen_at, limits) VALUES (gen_random_uuid(), 'h', 1, '0', 'a:q', "
        "'{default}', %s, 10, now(), now() - make_interval(secs => 10 * %s), %s::jsonb)",
        (list(limits), missed, json.dumps(limits)),
    )


def test_what_the_limits_hold_back_as_the_operator_reads_it(db: Conn, queue: brooq.Queue) -> None:
    rated, grouped = handler("rt", rate_limit="2/m"), handler("tw", group_limit=1)
    publish(db, {"rt": {"queue": "default", **rated.limits()}})
    publish(db, {"tw": {"queue": "default", **grouped.limits()}})
    publish(db, {"gone": {"queue": "default", "global_limit": 1}}, missed=5)  # not live
    jobs(db, "rt", 5)
    jobs(db, "tw", 4, "B")  # the first in turn (the highest name)
    jobs(db, "tw", 2, "A")
    assert all(claim(db, rated, f"w{i}")[0]["id"] for i in range(2))  # the window full
    assert claim(db, grouped, "w9")  # B at its limit
    limits = {t.topic: t for t in queue.limits()}
    assert sorted(limits) == ["rt", "tw"]
    assert limits["rt"].rate_limit == "2/m" and limits["rt"].held_by == "rate_limit"
    assert limits["tw"].group_limit == 1 and limits["tw"].held_by is None
    assert limits["tw"].groups_held == 1
    stats = {r.topic: r for r in queue.stats()}
    assert (stats["rt"].ready, stats["rt"].held) == (3, 3)
    assert (stats["tw"].ready, stats["tw"].held) == (5, 3)  # B's 3 left, A's 2 not held
    assert stats["rt"].oldest_ready_age == 0.0  # every ready job held: none waits
    assert 59 < stats["tw"].oldest_ready_age < 70  # A's oldest, not B's older ones
    assert reads.held_by_topic(db, Q) == {("default", "rt"): (3, 0.0)} | {
        ("default", "tw"): (3, pytest.approx(stats["tw"].oldest_ready_age, abs=1))
    }


def test_the_held_count_reads_a_topics_window_once_not_once_per_ready_job(db: Conn) -> None:
    """job_held_by_topic (the master's stats, `brooq stats`) counts a rated topic's window
    once: read once per ready job, a backlog of 100,000 behind a window of 50,000 places
    made one count take minutes, holding back the pruning of every table meanwhile."""
    rated = handler("rt", rate_limit="500/m", group_rate_limit="5/m")
    publish(db, {"rt": {"queue": "default", **rated.limits()}})
    for g in ("A", "B", "C"):
        jobs(db, "rt", 100, g)
    assert len(claim(db, rated, limit=30)) == 15  # each group's window full
    db.execute("ANALYZE job")
    cur = db.cursor(row_factory=tuple_row)
    [[plan]] = cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + Q.job_held_by_topic).fetchall()
    scans: list[tuple[str, int]] = []

    def walk(node: dict[str, Any]) -> None:
        if node.get("Relation Name") == "brooq_rate_slot":
            scans.append((node["Node Type"], node["Actual Loops"]))
        for child in node.get("Plans", ()):
            walk(child)

    walk(plan[0]["Plan"])
    assert scans and all(loops == 1 for _, loops in scans), scans
    assert reads.held_by_topic(db, Q) == {("default", "rt"): (285, 0.0)}


def test_brooq_queues_and_stats_show_the_limits_and_what_they_hold(dsn: str, db: Conn) -> None:
    from tests.db.test_cli import as_json, ok

    rated = handler("api.rated", rate_limit="2/m", global_limit=5)
    publish(db, {"api.rated": {"queue": "default", **rated.limits()}})
    jobs(db, "api.rated", 4)
    jobs(db, "plain", 1)
    assert all(claim(db, rated, f"w{i}")[0]["id"] for i in range(2))
    lines = ok(dsn, "queues").splitlines()
    limits = lines[lines.index("") + 1 :]
    assert limits[0].split() == [
        "TOPIC", "QUEUE", "GLOBAL", "LIMIT", "RATE", "LIMIT", "GROUP", "LIMIT", "GROUP",
        "RATE", "LIMIT", "HOLDING", "BACK",
    ]  # fmt: skip
    assert limits[1].split() == [
        "api.rated", "default", "5", "2/m", "-", "-", "all", "ready", "jobs", "(rate_limit)"
    ]  # fmt: skip
    [default] = as_json(dsn, "queues")
    assert default["limits"] == {
        "api.rated": {
            "global_limit": 5,
            "rate_limit": "2/m",
            "group_limit": None,
            "group_rate_limit": None,
            "held_by": "rate_limit",
            "groups_held": 0,
            "fair_groups": False,
        }
    }
    stats = {t["topic"]: t for t in as_json(dsn, "stats")["topics"]}
    assert (stats["api.rated"]["ready"], stats["api.rated"]["held"]) == (2, 2)
    assert (stats["plain"]["ready"], stats["plain"]["held"]) == (1, 0)
    row = next(line for line in ok(dsn, "stats").splitlines() if "api.rated" in line)
    assert row.split()[2:6] == ["0", "0", "2", "2"] and row.split()[-2] == "-"  # none unheld


def test_the_status_page_shows_the_limits_and_a_held_topic_as_held(db: Conn) -> None:
    from tests.db.test_page import get, text

    rated, grouped = handler("api.rated", rate_limit="1/m"), handler("tw", group_limit=1)
    publish(db, {"api.rated": {"queue": "default", **rated.limits()}})
    publish(db, {"tw": {"queue": "default", **grouped.limits()}})
    jobs(db, "api.rated", 3)
    jobs(db, "tw", 3, "A")
    assert claim(db, rated)[0]["id"] and claim(db, grouped)[0]["id"]
    body = text(get(db, "/"))
    rated_row = body[body.index("<td>api.rated</td>") :].split("</tr>")[0]
    assert "held back (rate_limit)" in rated_row and "rate_limit 1/m" in rated_row
    assert "holding back all ready jobs (rate_limit)" in rated_row
    grouped_row = body[body.index("<td>tw</td>") :].split("</tr>")[0]
    assert "group_limit 1" in grouped_row and "holding back 1 group" in grouped_row
    assert "held back (" not in grouped_row  # some groups only: its age is shown
    assert "<th>limits</th>" in body and "waiting its turn, not stuck" in body


# -- a job's group on every way in -------------------------------------------------------------


def test_every_enqueue_path_stores_the_group(dsn: str, queue: brooq.Queue, db: Conn) -> None:
    from datetime import datetime, timezone

    later = datetime.now(timezone.utc) + timedelta(hours=1)
    one, _ = queue.enqueue(brooq.Job("t", group="line"))  # the enqueue line (libpq)
    keyed, _ = queue.enqueue(brooq.Job("t", idempotency_key="k", group="pool"))  # the pool
    with psycopg.connect(dsn) as conn:  # the caller's transaction
        mine, _ = brooq.enqueue(conn, brooq.Job("t", group="mine"))
    copied = queue.enqueue_many(  # COPY, ready and scheduled, with a group among them
        [brooq.Job("t", group="copy"), brooq.Job("t"), brooq.Job("t", available_at=later,
                                                               group="later")]
    )  # fmt: skip
    plain = queue.enqueue_many([brooq.Job("t"), brooq.Job("t", available_at=later)])  # no group
    keyed_many = queue.enqueue_many([brooq.Job("t", idempotency_key="m", group="many")])
    expected = {
        one: "line",
        keyed: "pool",
        mine: "mine",
        copied[0][0]: "copy",
        copied[1][0]: None,
        copied[2][0]: "later",
        plain[0][0]: None,
        plain[1][0]: None,
        keyed_many[0][0]: "many",
    }
    assert {job_id: group_of(db, job_id) for job_id in expected} == expected
    record = queue.get(one)
    assert record is not None and record.group == "line"
    assert {r.id: r.group for r in queue.list_jobs(topic="t")} == expected
