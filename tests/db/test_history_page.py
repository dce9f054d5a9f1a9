"""The status page reads finished jobs wherever they are (migration 0020): in job_history,
where every outcome moves them, or still in job (ended before the migration). Each page
is read with the finished jobs in job, then again once they are in job_history: the
overview's counts and its done chart, the lists and their filters, the job page (its
error history, graph, steps and children), the search, the charts (exact and sampled),
the not-found page, and the retry button of a dead job. The charts' and the done chart's
time-bounded reads are checked to leave job_history's older partitions unread (EXPLAIN).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from brooq.page import reads, signin
from brooq.page.actions import Actions
from brooq.producer.ids import uuid7
from brooq.sql import Q
from tests.db.test_page import get, insert, job_ids, text
from tests.db.test_page_charts import seed

Conn = psycopg.Connection[Any]
FINISHED = ("done", "dead", "canceled")


BOUNDS = (
    "SELECT c.relname AS name, substring(pg_get_expr(c.relpartbound, c.oid) "
    "FROM 'FROM \\(''([^'']+)''\\)')::timestamptz AS lo "
    "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
    "WHERE i.inhparent = 'job_history'::regclass "
    "AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT' ORDER BY lo"
)


@pytest.fixture
def db(connect: Callable[..., Conn]) -> Conn:
    """A connection to a database whose job_history has daily partitions from three days
    before its oldest one (the master makes them ahead only) to tomorrow."""
    conn = connect()
    conn.execute(
        "SELECT brooq_history_prepare(interval '1 day', now(), now() + interval '1 day', 10)"
    )
    oldest: datetime = conn.execute(BOUNDS).fetchone()["lo"]
    for days in (1, 2, 3):
        conn.execute(
            sql.SQL("CREATE TABLE {} PARTITION OF job_history FOR VALUES FROM ({}) TO ({})").format(
                sql.Identifier(f"job_history_old_{days}"),
                sql.Literal(oldest - timedelta(days=days)),
                sql.Literal(oldest - timedelta(days=days - 1)),
            )
        )
    return conn


def to_history(db: Conn, where: str = "true") -> int:
    """Move the finished rows of job (those matching ``where``) into job_history, as
    the outcomes do: deleted from job, inserted there with every column as it was."""
    with db.transaction():
        db.execute("SELECT set_config('brooq.moving', 'on', true)")
        cur = db.execute(
            "WITH gone AS (DELETE FROM job WHERE state IN ('done', 'dead', 'canceled') "
            f"AND ({where}) RETURNING *) INSERT INTO job_history SELECT * FROM gone"
        )
        return cur.rowcount


def to_job(db: Conn) -> None:
    """Put every finished row back into job (as before migration 0020)."""
    with db.transaction():
        db.execute(
            "WITH gone AS (DELETE FROM job_history RETURNING *) INSERT INTO job SELECT * FROM gone"
        )


def where_is(db: Conn, job_id: uuid.UUID) -> list[str]:
    rows = db.execute(
        "SELECT 'job' FROM job WHERE id = %(id)s UNION ALL "
        "SELECT 'job_history' FROM job_history WHERE id = %(id)s",
        {"id": job_id},
    ).fetchall()
    return [next(iter(r.values())) if isinstance(r, dict) else r[0] for r in rows]


def dead_pages(db: Conn, target: str) -> list[str]:
    """Every job id of a list, page after page, following the next-page links."""
    ids: list[str] = []
    for _ in range(100):
        body = text(get(db, target))
        ids += job_ids(body)
        found = re.search(r'href="(/dead\?[^"]*after=[^"]*)"', body)
        if found is None:
            return ids
        target = found.group(1).replace("&amp;", "&")
    raise AssertionError("more than 100 pages")


def test_a_job_ended_by_any_statement_is_on_its_page_from_job_history(db: Conn) -> None:
    """The end written by an UPDATE (its trigger moves the row): the job page, the
    search, the dead list, the overview's count read it in job_history."""
    errors = [
        {"attempt": n, "at": f"2026-01-01T00:0{n}:00+00:00", "error": f"boom {n}",
         "worker": "h:1:x", "kind": "raised", "traceback": f"Traceback {n}"}
        for n in (1, 2, 3)
    ]  # fmt: skip
    job_id = insert(db, topic="mail.send", queue="low", state="failed", attempts=3,
                    errors=errors, tags=["billing"], group_key="acct-1")  # fmt: skip
    db.execute(
        "UPDATE job SET state = 'dead', last_error = 'boom 3', updated_at = now() WHERE id = %s",
        [job_id],
    )
    assert where_is(db, job_id) == ["job_history"]
    page = text(get(db, f"/jobs/{job_id}"))
    assert "mail.send" in page and "<h2>Attempts (3)</h2>" in page
    assert all(f"boom {n}" in page for n in (1, 2, 3))
    found = get(db, f"/find?id={job_id}")
    assert found.status == 303 and dict(found.headers)["Location"] == f"/jobs/{job_id}"
    for target in ("/dead", "/dead?topic=mail.send", "/dead?tag=billing", "/dead?group=acct-1"):
        assert job_ids(text(get(db, target))) == [str(job_id)], target
    for target in ("/dead?topic=other", "/dead?tag=other", "/dead?group=other", "/failed"):
        assert job_ids(text(get(db, target))) == [], target
    (group,) = reads.overview(db)["groups"]
    assert (group["queue"], group["topic"], group["dead"]) == ("low", "mail.send", 1)
    unknown = get(db, f"/jobs/{uuid.uuid4()}")
    assert unknown.status == 404 and "retention has deleted it" in text(unknown)


def test_the_dead_list_pages_the_same_wherever_the_rows_are(db: Conn) -> None:
    """Dead jobs of three queues over three days (three partitions), some left in job:
    the list pages through all of them newest first, without overlap, filters too, as
    it did with every row in job."""
    now = datetime.now(timezone.utc)
    for i in range(130):
        insert(db, topic=("a", "b")[i % 2], queue=("q1", "q2", "q3")[i % 3], state="dead",
               tags=["even"] if i % 2 == 0 else ["odd"], group_key=f"g{i % 4}",
               updated_at=now - timedelta(hours=i * 0.5, seconds=i % 7))  # fmt: skip
    for i in range(6):  # the same instant: the id breaks the tie
        insert(db, topic="a", queue=("q1", "q2")[i % 2], state="dead", updated_at=now)
    targets = ("/dead", "/dead?topic=a", "/dead?tag=odd", "/dead?group=g1&topic=b")
    before = {t: dead_pages(db, t) for t in targets}
    assert len(before["/dead"]) == 136 and len(set(before["/dead"])) == 136
    assert to_history(db, "queue <> 'q3' OR updated_at > now() - interval '20 hours'") > 100
    assert db.execute("SELECT count(*) AS n FROM job WHERE state = 'dead'").fetchone()["n"] > 0
    assert db.execute("SELECT count(DISTINCT tableoid) AS n FROM job_history").fetchone()["n"] >= 3
    for target in targets:
        assert dead_pages(db, target) == before[target], target
    expected = [
        str(r["id"])
        for r in db.execute(
            "SELECT id FROM job_all WHERE state = 'dead' ORDER BY updated_at DESC, id DESC"
        )
    ]
    assert before["/dead"] == expected


def test_the_job_page_reads_its_graph_steps_and_children_in_job_history(db: Conn) -> None:
    """A job whose upstream job, downstream job and spawned child have ended: their
    states on its page, as before they moved."""
    up = insert(db, topic="extract", state="done", has_downstream=True)
    me = insert(db, topic="transform", state="done", has_downstream=True)
    down = insert(db, topic="load", state="canceled", last_error="upstream")
    child = insert(db, topic="child.part", state="dead")
    db.execute(
        "INSERT INTO brooq_job_edge (downstream_id, position, upstream_id, ended) "
        "VALUES (%(me)s, 1, %(up)s, true), (%(down)s, 1, %(me)s, true)",
        {"me": me, "up": up, "down": down},
    )
    db.execute(
        "INSERT INTO brooq_job_step (job_id, name, result) VALUES "
        "(%(me)s, '__spawn:0', %(child)s), (%(me)s, 'fetch', '{\"rows\": 3}')",
        {"me": me, "child": json.dumps(str(child))},
    )

    def seen() -> dict[str, Any]:
        row = reads.job(db, me)
        assert row is not None
        return {
            "state": row["state"],
            "upstream": [(str(r["id"]), r["state"]) for r in row["upstream"]],
            "downstream": [(str(r["id"]), r["state"]) for r in row["downstream"]],
            "children": [(str(r["id"]), r["state"]) for r in row["children"]],
            "steps": [r["name"] for r in row["steps"]],
            "totals": (row["upstream_total"], row["downstream_total"], row["children_total"]),
        }

    before = seen()
    assert before["upstream"] == [(str(up), "done")]
    assert before["downstream"] == [(str(down), "canceled")]
    assert before["children"] == [(str(child), "dead")]
    assert to_history(db) == 4
    assert seen() == before
    page = text(get(db, f"/jobs/{me}"))
    for other in (up, down, child):
        assert f"/jobs/{other}" in page
    assert "fetch" in page


def test_the_overview_counts_dead_and_done_jobs_in_both_tables(db: Conn) -> None:
    minute = db.execute("SELECT date_trunc('minute', now()) AS m").fetchone()["m"]
    for queue, topic, dead in (("default", "a", 7), ("low", "b", 3)):
        db.execute(
            "INSERT INTO job (topic, queue, state) SELECT %s, %s, 'dead' "
            "FROM generate_series(1, %s)",
            [topic, queue, dead],
        )
    db.execute(
        "INSERT INTO job (topic, state, updated_at) SELECT 'a', 'done', %s - "
        "make_interval(mins => g %% 30) FROM generate_series(1, 45) AS g",
        [minute],
    )
    insert(db, topic="a", state="pending")

    def figures() -> tuple[Any, ...]:
        data = reads.overview(db)
        groups = {(g["queue"], g["topic"]): (g["dead"], g["ready"]) for g in data["groups"]}
        return groups, data["estimate"], sum(int(r["jobs"]) for r in data["done_per_minute"])

    before = figures()
    assert before == ({("default", "a"): (7, 1), ("low", "b"): (3, 0)}, None, 45)
    to_history(db, "topic = 'b' OR state = 'done'")  # the 7 dead of "a" stay in job
    assert figures() == before
    to_history(db)
    assert figures() == before
    body = text(get(db, "/"))
    assert "45 done in the last hour" in body


def test_a_large_dead_history_is_estimated_from_a_sample_of_its_pages(
    db: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past EXACT_BELOW dead jobs (as a sample of job_history's pages puts them), the
    dead are estimated from that sample, within its margin; under it, counted."""
    db.execute(
        "INSERT INTO job (topic, state, last_error) SELECT 'a', "
        "CASE WHEN g % 4 = 0 THEN 'dead' ELSE 'done' END, repeat('x', 200) "
        "FROM generate_series(1, 20000) AS g"
    )
    db.execute("INSERT INTO job (topic, state) SELECT 'a', 'dead' FROM generate_series(1, 50)")
    to_history(db, "last_error IS NOT NULL")  # 5,000 dead moved, 50 left in job
    db.execute("VACUUM ANALYZE job_history")
    monkeypatch.setattr(reads, "SAMPLE_PAGES", 60)
    monkeypatch.setattr(reads, "EXACT_BELOW", 1_000)
    pages = db.execute(Q.web_history_pages).fetchone()["pages"]
    assert pages > 3 * reads.SAMPLE_PAGES
    data = reads.overview(db)
    (group,) = data["groups"]
    assert data["estimate"] is not None and "dead" in group["estimated"]
    guess, error = data["estimate"]["states"]["dead"], data["estimate"]["margins"]["dead"]
    assert 0 < error < 100
    assert abs(guess - 5_050) <= max(5_050 * error / 100, 1) * 1.5
    assert data["estimate"]["history"]["pages"] == pages
    body = text(get(db, "/"))
    assert "of job_history" in body  # the note says which sample
    # The catalog's count under EXACT_BELOW: counted, unless past EXACT_CAP.
    monkeypatch.setattr(reads, "EXACT_BELOW", 50_000)
    data = reads.overview(db)
    assert data["estimate"] is None and data["groups"][0]["dead"] == 5_050
    monkeypatch.setattr(reads, "EXACT_CAP", 1_000)
    data = reads.overview(db)
    assert data["estimate"]["states"]["dead"] == guess


def test_the_charts_are_the_same_with_the_finished_jobs_in_job_history(db: Conn) -> None:
    """test_page_charts' seeded jobs, charted with every finished row in job, then in
    job_history: the same series (read again while the minute turns)."""
    seed(db)
    for _ in range(3):
        before = {w: reads.charts(db, w) for w in ("hour", "day")}
        filtered = reads.charts(db, "hour", queue="q", topic="t.a")
        assert to_history(db) > 0
        after = {w: reads.charts(db, w) for w in ("hour", "day")}
        if all(before[w]["start"] == after[w]["start"] for w in before):
            break
        to_job(db)
    for window in ("hour", "day"):
        assert after[window]["sampled"] is None
        for key in ("counts", "percentiles", "attempts_seen"):
            assert after[window][key] == before[window][key], (window, key)
    assert sum(before["hour"]["counts"]["done"]) >= 5
    again = reads.charts(db, "hour", queue="q", topic="t.a")
    assert again["counts"] == filtered["counts"]


def test_the_sampled_charts_and_done_chart_read_job_history(
    db: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past their caps the charts and the overview's done chart are drawn from a sample
    of job's pages and of job_history's partitions of the window: with pages enough to
    take every one, the figures are the exact ones."""
    minute = db.execute("SELECT date_trunc('minute', now()) AS m").fetchone()["m"]
    db.execute(
        "INSERT INTO job (topic, state, available_at, started_at, updated_at) "
        "SELECT 'a', 'done', %(m)s - make_interval(mins => g %% 50, secs => 3), "
        "%(m)s - make_interval(mins => g %% 50, secs => 2), %(m)s - make_interval(mins => g %% 50) "
        "FROM generate_series(1, 600) AS g",
        {"m": minute},
    )
    # An old day's jobs: outside the window, in a partition of their own.
    db.execute(
        "INSERT INTO job (topic, state, updated_at) SELECT 'a', 'done', now() - interval '2 days' "
        "FROM generate_series(1, 300)"
    )
    to_history(db)
    exact = reads.charts(db, "hour")
    assert sum(exact["counts"]["done"]) == 600 and exact["sampled"] is None
    monkeypatch.setattr(reads, "CHART_CAP", 100)
    monkeypatch.setattr(reads, "CHART_SAMPLE_PAGES", 100_000)
    sampled = reads.charts(db, "hour")
    assert sampled["sampled"] == 100.0 and sampled["start"] == exact["start"]
    assert sampled["counts"]["done"] == exact["counts"]["done"]
    monkeypatch.setattr(reads, "EXACT_CAP", 100)
    monkeypatch.setattr(reads, "SAMPLE_PAGES", 100_000)
    data = reads.overview(db)
    assert sum(int(r["jobs"]) for r in data["done_per_minute"]) == 600
    assert not data["done_estimated"]


def _plan_nodes(plan: Any) -> Iterator[dict[str, Any]]:
    if isinstance(plan, dict):
        if "Node Type" in plan:
            yield plan
        for value in plan.values():
            yield from _plan_nodes(value)
    elif isinstance(plan, list):
        for value in plan:
            yield from _plan_nodes(value)


def partitions_read(db: Conn, statement: str, params: dict[str, Any]) -> dict[str, int]:
    """The partitions of job_history a statement's plan scans, with the loops each ran
    (EXPLAIN ANALYZE: 0, pruned while it ran; missing, pruned when it started)."""
    with db.cursor(row_factory=dict_row) as cur:
        row = cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params).fetchone()
    assert row is not None
    plan = next(iter(row.values()))
    read: dict[str, int] = {}
    for node in _plan_nodes(plan):
        name = node.get("Relation Name", "")
        if name.startswith("job_history"):
            read[name] = read.get(name, 0) + int(node.get("Actual Loops", 0))
    return read


def test_time_bounded_reads_leave_older_partitions_unread(db: Conn) -> None:
    """The charts' sources, their sizes and the done chart bound updated_at, job_history's
    partition key: a partition of two days ago is never scanned (EXPLAIN ANALYZE)."""
    db.execute(
        "INSERT INTO job (topic, state, updated_at) SELECT 'a', 'done', now() - interval '2 days' "
        "FROM generate_series(1, 50) UNION ALL "
        "SELECT 'a', 'done', now() - interval '1 minute' FROM generate_series(1, 50)"
    )
    to_history(db)
    old, new = (
        r["p"]
        for r in db.execute(
            "SELECT tableoid::regclass::text AS p FROM job_history GROUP BY 1 "
            "ORDER BY min(updated_at)"
        )
    )
    hour = {"step": 60, "buckets": 60, "cap": 1000, "queue": None, "topic": None}
    sample = {**hour, "percent": 100.0, "seed": 1.0}
    for name, statement, params in (
        ("web_done_per_minute", Q.web_done_per_minute, {"cap": 1000}),
        ("web_done_per_minute_sample", Q.web_done_per_minute_sample, sample),
        ("web_charts_sizes", Q.web_charts_sizes, hour),
        ("web_charts", Q.web_charts, hour),
        ("web_charts_sample", Q.web_charts_sample, sample),
        ("web_charts (day)", Q.web_charts, {**hour, "step": 900, "buckets": 96}),
    ):
        read = partitions_read(db, statement, params)
        assert read.get(new, 0) > 0, (name, read)
        assert read.get(old, 0) == 0, (name, read)


def test_the_retry_button_brings_a_dead_job_back_from_history(dsn: str, db: Conn) -> None:
    """The page's retry of a dead job that is in job_history: it is pending in job again
    (brooq.operator.changes.transition, operator.sql's retry)."""
    job_id = insert(db, topic="a", state="failed", attempts=3)
    db.execute("UPDATE job SET state = 'dead', last_error = 'boom' WHERE id = %s", [job_id])
    assert where_is(db, job_id) == ["job_history"]
    token = b"0123456789abcdef-admin"
    actions = Actions(dsn, token)
    session, cookie = signin.new_session(token, time.time())

    class Request:
        method = "POST"
        path = f"/jobs/{job_id}/retry"
        headers = {"cookie": f"{signin.COOKIE}={cookie}", "host": "localhost"}

    answer = actions.answer(Request(), f"csrf={session.csrf(token)}".encode())
    assert answer.split(b"\r\n", 1)[0].endswith(b"303 See Other"), answer[:400]
    assert where_is(db, job_id) == ["job"]
    row = db.execute("SELECT state, attempts FROM job WHERE id = %s", [job_id]).fetchone()
    assert row["state"] == "pending"
    page = text(get(db, f"/jobs/{job_id}"))
    assert "pending" in page or "ready" in page


def test_the_job_page_reads_no_partition_older_than_the_job(db: Conn) -> None:
    """A job's id carries its enqueue time (UUIDv7): the job page's reads by id skip the
    partitions that ended before it (brooq_history_floor, when the statement is planned);
    an id without that time (version 4) reads them all."""
    oldest = db.execute(BOUNDS).fetchone()["name"]
    fresh = insert(db, id=uuid7(), topic="a", state="failed", attempts=1)
    old = insert(db, topic="a", state="failed", attempts=1)
    db.execute("UPDATE job SET state = 'dead' WHERE id = ANY(%s)", [[fresh, old]])
    for job_id, reads_oldest in ((fresh, False), (old, True)):
        for statement, params in (
            (Q.web_job_get, {"id": job_id}),
            (Q.web_job_logs, {"id": job_id, "chars": 100, "attempts": 20}),
        ):
            plan = db.execute("EXPLAIN " + statement, params).fetchall()
            shown = " ".join(str(next(iter(r.values()))) for r in plan)
            assert (oldest in shown) is reads_oldest, (job_id, shown)
        assert reads.job(db, job_id) is not None
