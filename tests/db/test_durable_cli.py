"""`brooq jobs show` on a durable handler's job (its steps, what it sleeps until or waits
for, its children), `brooq events emit` and `brooq events waits`, as an operator runs them
(`python -m brooq`, a subprocess)."""

from __future__ import annotations

import json
from typing import Any

import psycopg

import brooq
import brooq.testing
from tests.db.test_cli import run
from tests.db.test_durable_steps import row

Conn = psycopg.Connection[Any]


def app(queue: brooq.Queue) -> None:
    @queue.handler("o.sleep")
    def sleeper(claim: brooq.Claim[Any]) -> Any:
        claim.step("fetch", lambda: {"rows": 3})
        claim.sleep("1h")

    @queue.handler("o.wait")
    def waiter(claim: brooq.Claim[Any]) -> Any:
        return claim.wait_event(claim.payload["key"], timeout=claim.payload.get("timeout"))

    @queue.handler("o.parent")
    def parent(claim: brooq.Claim[Any]) -> Any:
        claim.wait_jobs([claim.spawn(brooq.Job("o.child"))])

    @queue.handler("o.child")
    def child(claim: brooq.Claim[Any]) -> Any:
        claim.wait_event("never")


def test_jobs_show_lists_steps_and_what_a_job_sleeps_until(
    queue: brooq.Queue, dsn: str, db: Conn
) -> None:
    app(queue)
    job_id, _ = queue.enqueue(brooq.Job("o.sleep"))
    brooq.testing.drain(queue)
    out = run("--database", dsn, "jobs", "show", str(job_id))
    assert out.returncode == 0, out.stderr
    [line] = [ln for ln in out.stdout.splitlines() if ln.startswith("sleeps until:")]
    assert line.endswith("(in 60.0m)") or line.endswith("(in 59.9m)"), line
    assert "steps (2, oldest first):" in out.stdout
    assert "  fetch  " in out.stdout and "  11 B" in out.stdout  # {"rows": 3}
    out = run("--database", dsn, "jobs", "show", str(job_id), "--json")
    shown = json.loads(out.stdout)
    assert shown["parked"] == "sleep" and shown["parked_until"] is not None
    assert [s["name"] for s in shown["steps"]] == ["fetch", "__sleep:0"]
    assert shown["steps"][0]["size"] == 11


def test_events_waits_and_emit(queue: brooq.Queue, dsn: str, db: Conn) -> None:
    app(queue)
    job_id, _ = queue.enqueue(brooq.Job("o.wait", {"key": "invoice-7\x1b[31m"}))
    other, _ = queue.enqueue(brooq.Job("o.wait", {"key": "k2", "timeout": "1h"}))
    brooq.testing.drain(queue)
    out = run("--database", dsn, "jobs", "show", str(job_id))
    assert "waits for:" in out.stdout and "event 'invoice-7" in out.stdout
    assert "\x1b" not in out.stdout  # the terminal's escaping
    out = run("--database", dsn, "events", "waits")
    assert out.returncode == 0, out.stderr
    assert str(job_id) in out.stdout and str(other) in out.stdout and "\x1b" not in out.stdout
    waits = json.loads(run("--database", dsn, "events", "waits", "--json").stdout)
    assert {w["key"]: w["until"] is None for w in waits} == {
        "invoice-7\x1b[31m": True,
        "k2": False,
    }
    out = run("--database", dsn, "events", "emit", "k2", "--payload", '{"paid": true}')
    assert out.returncode == 0 and "emitted k2" in out.stdout, out.stderr
    out = run("--database", dsn, "events", "emit", "k2")
    assert out.returncode == 0 and "changed nothing" in out.stdout
    assert brooq.testing.drain(queue) == {"done": 1}
    assert row(db, other)["result"] == {"paid": True}


def test_events_emit_refuses_bad_json_and_a_bad_key(dsn: str) -> None:
    out = run("--database", dsn, "events", "emit", "k", "--payload", "{nope")
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "--payload" in out.stderr
    assert "Traceback" not in out.stderr
    out = run("--database", dsn, "events", "emit", "")
    assert out.returncode == 2 and "must not be empty" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_jobs_show_lists_children_and_the_wait_for_them(
    queue: brooq.Queue, dsn: str, db: Conn
) -> None:
    app(queue)
    job_id, _ = queue.enqueue(brooq.Job("o.parent"))
    brooq.testing.drain(queue)
    out = run("--database", dsn, "jobs", "show", str(job_id))
    assert "waits for:       its child jobs" in out.stdout
    assert "children:" in out.stdout and "o.child" in out.stdout
    assert "upstream:" not in out.stdout  # its children are not upstream jobs
    shown = json.loads(run("--database", dsn, "jobs", "show", str(job_id), "--json").stdout)
    assert shown["parked"] == "jobs" and [c["topic"] for c in shown["children"]] == ["o.child"]


def test_retry_fresh_forgets_the_steps_of_one_job(queue: brooq.Queue, dsn: str, db: Conn) -> None:
    @queue.handler("o.dead", max_attempts=1)
    def dead(claim: brooq.Claim[Any]) -> Any:
        claim.step("once", lambda: 1)
        raise ValueError("dies")

    job_id, _ = queue.enqueue(brooq.Job("o.dead"))
    brooq.testing.drain(queue)
    out = run("--database", dsn, "retry", str(job_id))
    assert out.returncode == 0, out.stderr
    assert db.execute("SELECT count(*) FROM brooq_job_step").fetchone() == (1,)
    brooq.testing.drain(queue)
    db.rollback()
    out = run("--database", dsn, "retry", str(job_id), "--fresh")
    assert out.returncode == 0, out.stderr
    assert db.execute("SELECT count(*) FROM brooq_job_step").fetchone() == (0,)
    out = run("--database", dsn, "retry", "--topic", "o.dead", "--state", "dead", "--fresh")
    assert out.returncode == 2 and "--fresh takes one job id" in out.stderr
