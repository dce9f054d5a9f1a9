"""A durable handler's parked jobs as the operator sees them, against a real PostgreSQL:
the overview, `brooq top` and `brooq stats` count them apart from ready ones (sleeping,
waiting for an event, waiting for child jobs), and the job page lists a job's recorded
steps (never their results), what it sleeps until or waits for, and its children, bounded
and escaped."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import brooq
import brooq.testing
from brooq.page import reads
from brooq.page.routes import serve
from tests.db.test_cli import run

Conn = psycopg.Connection[Any]

HOSTILE = "<script>alert(1)</script>\"'&"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#x27;&amp;"
SECRET = "s3cr3t-step-result"


def app(queue: brooq.Queue) -> None:
    @queue.handler("p.sleep")
    def sleeper(claim: brooq.Claim[Any]) -> Any:
        claim.step("fetch", lambda: {"secret": SECRET})
        claim.sleep("1h")

    @queue.handler("p.wait")
    def waiter(claim: brooq.Claim[Any]) -> Any:
        return claim.wait_event(claim.payload["key"], timeout=claim.payload.get("timeout"))

    @queue.handler("p.parent")
    def parent(claim: brooq.Claim[Any]) -> Any:
        claim.wait_jobs([claim.spawn(brooq.Job("p.child")) for _ in range(3)])

    @queue.handler("p.child")
    def child(claim: brooq.Claim[Any]) -> Any:
        claim.wait_event("never")


@pytest.fixture
def world(queue: brooq.Queue, db: Conn) -> dict[str, uuid.UUID]:
    """One job sleeping, two waiting for an event (one with a deadline, one on a hostile
    key), a parent waiting for its 3 children (each waiting for an event), a job whose
    wait was released (ready, still carrying the word), a ready job, a scheduled one and
    one waiting for an upstream job."""
    app(queue)
    ids = {
        "sleep": queue.enqueue(brooq.Job("p.sleep"))[0],
        "wait": queue.enqueue(brooq.Job("p.wait", {"key": HOSTILE}))[0],
        "deadline": queue.enqueue(brooq.Job("p.wait", {"key": "k2", "timeout": "1h"}))[0],
        "released": queue.enqueue(brooq.Job("p.wait", {"key": "k3", "timeout": "1h"}))[0],
        "parent": queue.enqueue(brooq.Job("p.parent"))[0],
    }
    brooq.testing.drain(queue)
    assert queue.emit_event("k3")  # released: pending now, claimable, not parked
    ids["ready"] = queue.enqueue(brooq.Job("p.wait", {"key": "k4"}))[0]
    ids["scheduled"] = queue.enqueue(brooq.Job("p.wait", {"key": "k5"}))[0]
    db.execute(
        "UPDATE job SET available_at = now() + interval '1 hour' WHERE id = %s",
        (ids["scheduled"],),
    )
    db.execute(
        "INSERT INTO job (topic, state, upstream_open) VALUES ('p.wait', 'waiting', 1)"
    )  # waiting for an upstream job (after=[...]): not parked
    states = dict(db.execute("SELECT parked || ':' || state, count(*) FROM job GROUP BY 1"))
    assert states == {
        "sleep:pending": 1,
        "event:waiting": 4,  # the hostile key's and the three children's
        "event:pending": 2,  # the deadline's (later) and the released one (now)
        "jobs:waiting": 1,
        None: 3,
    }, states
    return ids


@pytest.fixture
def page_db(connect: Callable[..., Conn]) -> Conn:
    return connect()


def figures(data: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    return {
        g["topic"]: (g["ready"], g["scheduled"], g["waiting"], g["parked"]) for g in data["groups"]
    }


EXPECTED = {  # ready, scheduled, waiting, parked
    "p.sleep": (0, 0, 0, 1),
    "p.wait": (2, 1, 1, 2),
    "p.parent": (0, 0, 0, 1),
    "p.child": (0, 0, 0, 3),
}


def test_the_overview_counts_parked_jobs_apart(
    world: dict[str, uuid.UUID], page_db: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert figures(reads.overview(page_db)) == EXPECTED  # the table read whole
    page_db.execute(
        "INSERT INTO job (topic, state, payload) "
        "SELECT 'pad', 'done', jsonb_build_object('pad', repeat('x', 500)) "
        "FROM generate_series(1, 2000)"
    )
    monkeypatch.setattr(reads, "SAMPLE_PAGES", 2)  # a sample, then every state exactly
    data = reads.overview(page_db)
    assert data["estimate"] is None and figures(data) == EXPECTED
    # The small queues' exact count beside an estimated backlog carries them too.
    with reads.read_only(page_db) as cur:
        rows = cur.execute(
            reads.Q.web_overview_queues_exact, {"queues": ["default"], "cap": 1000}
        ).fetchall()
    parked = {(r["state"], r["topic"]): int(r["parked"]) for r in rows}
    assert parked[("pending", "p.sleep")] == 1 and parked[("pending", "p.wait")] == 1

    body = serve(page_db, "GET", "/", actions_enabled=False).body.decode()
    assert "<th>parked</th>" in body
    row = re.search(r"<tr><td>default</td><td>p\.child</td>(.*?)</tr>", body)
    assert row is not None
    cells = re.findall(r'<td class="n">([^<]*)</td>', row.group(1))
    assert cells[:8] == ["0", "0", "0", "0", "0", "3", "0", "0"], cells  # waiting … parked …


def test_top_and_stats_count_parked_jobs(world: dict[str, uuid.UUID], dsn: str) -> None:
    out = run("--database", dsn, "top", "--once")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    header = lines[2].split()
    assert [header[4], header[7]] == ["READY", "PARKED"], header
    rows = {line.split()[1]: [line.split()[4], line.split()[7]] for line in lines[3:7]}
    assert rows == {
        "p.child": ["0", "3"],
        "p.parent": ["0", "1"],
        "p.sleep": ["0", "1"],
        "p.wait": ["2", "2"],
    }
    top = json.loads(run("--database", dsn, "top", "--json").stdout)
    assert {t["topic"]: (t["ready"], t["parked"]) for t in top["topics"]} == {
        "p.child": (0, 3),
        "p.parent": (0, 1),
        "p.sleep": (0, 1),
        "p.wait": (2, 2),
    }
    stats = json.loads(run("--database", dsn, "stats", "--json").stdout)["topics"]
    # Parked jobs are in no other count (waiting, scheduled); pending is the state's count.
    counts = {t["topic"]: (t["pending"], t["waiting"], t["scheduled"], t["parked"]) for t in stats}
    assert counts == {
        "p.child": (0, 0, 0, 3),
        "p.parent": (0, 0, 0, 1),
        "p.sleep": (1, 0, 0, 1),
        "p.wait": (4, 1, 1, 2),  # pending: released, ready, scheduled, the deadline's
    }
    lines = run("--database", dsn, "stats").stdout.splitlines()
    assert "PARKED" in lines[0].split()
    at = lines[0].split().index("PARKED")
    assert lines[-1].split()[0] == "(total)" and lines[-1].split()[at - 1] == "7"


def test_the_job_page_shows_steps_parking_and_children(
    world: dict[str, uuid.UUID], page_db: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    def page(job_id: uuid.UUID) -> str:
        response = serve(page_db, "GET", f"/jobs/{job_id}", actions_enabled=False)
        assert response.status == 200
        return response.body.decode()

    body = page(world["sleep"])
    assert '<span class="state">parked</span>: sleeps until ' in body
    assert "<h2>Recorded steps (2)</h2>" in body
    assert "<td>fetch</td>" in body and "<td>__sleep:0</td>" in body
    size = len(json.dumps({"secret": SECRET}).encode())
    assert f"{size:,} B" in body and SECRET not in body  # the size, never the result

    body = page(world["wait"])
    assert f"waits for the event <code>{ESCAPED}</code>" in body and HOSTILE not in body
    assert ", until" not in body
    body = page(world["deadline"])
    assert "waits for the event <code>k2</code> since " in body and ", until " in body
    body = page(world["released"])
    assert '<span class="state">parked</span>' not in body  # woken: the word alone parks nothing

    body = page(world["parent"])
    assert "waits for its child jobs: 3 not ended yet" in body
    assert "<h2>Child jobs (3)</h2>" in body
    children = [r["id"] for r in page_db.execute("SELECT id FROM job WHERE topic = 'p.child'")]
    shown = re.findall(r'href="/jobs/([0-9a-f-]{36})"', body)
    assert set(map(str, children)) <= set(shown)
    assert "Waits for (upstream)" not in body  # children are not upstream jobs

    monkeypatch.setattr(reads, "GRAPH_LIMIT", 2)
    monkeypatch.setattr(reads, "STEPS_SHOWN", 1)
    body = page(world["parent"])
    assert "<h2>Child jobs (2 of 3)</h2>" in body and "only the first 2 shown" in body
    assert "<h2>Recorded steps (1 of 3)</h2>" in body and "lists them all" in body

    monkeypatch.setattr(reads, "NAME_CHARS", 8)
    body = page(world["wait"])
    assert "waits for the event <code>&lt;script&gt;</code>" in body
    assert f"(first 8 of {len(HOSTILE)} characters)" in body


def test_an_estimated_backlog_splits_into_ready_and_parked_without_a_remainder(
    page_db: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sampled and scaled up, ready and parked pending jobs still add up to the pending
    jobs: no scheduled job appears out of rounding when there is none."""
    page_db.execute(
        "INSERT INTO job (topic, state, available_at, parked, payload) "
        "SELECT 't' || i % 7, 'pending', "
        "       CASE WHEN i % 3 = 0 THEN now() + interval '1 hour' ELSE now() END, "
        "       CASE WHEN i % 3 = 0 THEN 'sleep' END, "
        "       jsonb_build_object('pad', repeat('x', 300)) "
        "FROM generate_series(1, 7000) AS i"
    )
    row = page_db.execute("SELECT pg_relation_size('job') / 8192 AS pages").fetchone()
    assert row is not None and int(row["pages"]) > 100
    monkeypatch.setattr(reads, "EXACT_BELOW", 1)  # every state estimated
    for share in range(2, 30):
        monkeypatch.setattr(reads, "SAMPLE_PAGES", int(row["pages"]) // share)
        groups = reads.overview(page_db)["groups"]
        assert len(groups) == 7
        for a in groups:
            assert a["scheduled"] == 0 and {"ready", "parked"} <= a["estimated"], (share, a)
            assert 0.6 * 1000 < a["ready"] + a["parked"] < 1.4 * 1000, a
