"""Queue.purge and `brooq purge`: every job of a queue or topic not yet taken is canceled,
in batches of their own transactions; processing, finished and parked jobs, other queues
and other topics are left alone."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

import brooq
from brooq.cli import purge as cli_purge
from brooq.errors import BrooqError, InvalidQueue, InvalidTopic
from tests.db.test_cli import run

N = 10_000
# Of each N-job set: how many are put in each state besides pending (ready).
OTHERS = {"processing": 50, "done": 50, "dead": 50, "canceled": 50, "failed": 50, "parked": 50}


def _fill(queue: brooq.Queue, db: psycopg.Connection[Any], topic: str, name: str) -> None:
    """N jobs of ``topic`` in queue ``name``: most ready, some scheduled, and the OTHERS."""
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    jobs = [brooq.Job(topic, {"n": n}, queue=name) for n in range(N - 100)]
    jobs += [brooq.Job(topic, {"n": n}, queue=name, available_at=later) for n in range(100)]
    queue.enqueue_many(jobs)
    for state, count in OTHERS.items():
        db.execute(
            "UPDATE job SET state = %(state)s, locked_by = 'someone', "
            "locked_until = now() + interval '1 hour', parked = %(parked)s "
            "WHERE id IN (SELECT id FROM job WHERE topic = %(topic)s AND queue = %(queue)s "
            "AND state = 'pending' AND available_at <= now() LIMIT %(n)s)",
            {
                "state": "waiting" if state == "parked" else state,
                "parked": "event" if state == "parked" else None,
                "topic": topic,
                "queue": name,
                "n": count,
            },
        )


def _states(db: psycopg.Connection[Any], **where: str) -> dict[str, int]:
    cond = " AND ".join(f"{k} = %({k})s" for k in where) or "true"
    rows = db.execute(
        "SELECT CASE WHEN parked IS NOT NULL THEN 'parked' ELSE state END, count(*) "
        f"FROM job_all WHERE {cond} GROUP BY 1",
        where,
    ).fetchall()
    return dict(rows)


def _untaken(n: int = N) -> int:
    """Of an N-job set: the jobs a purge cancels (pending ready and scheduled, failed)."""
    return n - sum(c for s, c in OTHERS.items() if s != "failed")


def _after_purge(before: dict[str, int]) -> dict[str, int]:
    left = {s: c for s, c in before.items() if s not in ("pending", "failed")}
    left["canceled"] = before.get("canceled", 0) + before["pending"] + before["failed"]
    return left


def _transactions(db: psycopg.Connection[Any], **where: str) -> int:
    """How many transactions canceled the set's jobs (one xmin each: a canceled job's row
    was moved into job_history by the cancel's own statement)."""
    cond = " AND ".join(f"{k} = %({k})s" for k in where)
    row = db.execute(
        f"SELECT count(DISTINCT xmin::text) FROM job_history WHERE {cond} "
        "AND state = 'canceled' "
        "AND locked_by IS NULL",
        where,
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_purge_by_queue_cancels_its_untaken_jobs_in_batches_and_nothing_else(
    queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    _fill(queue, db, "mail.send", "bulk")
    _fill(queue, db, "mail.send", "other")
    before, other = _states(db, queue="bulk"), _states(db, queue="other")
    assert queue.purge(queue="bulk", dry_run=True) == _untaken()
    assert _states(db, queue="bulk") == before  # a dry run changes nothing
    assert queue.purge(queue="bulk", batch_size=1_000) == _untaken()
    assert _states(db, queue="bulk") == _after_purge(before)
    assert _states(db, queue="other") == other
    # Bounded transactions: one per batch of 1,000 rows, never one for the whole purge.
    assert _transactions(db, queue="bulk") == math.ceil(_untaken() / 1_000)
    assert queue.purge(queue="bulk") == 0  # nothing left to purge


def test_a_purge_by_topic_and_by_both(queue: brooq.Queue, db: psycopg.Connection[Any]) -> None:
    _fill(queue, db, "img.resize", "default")
    _fill(queue, db, "img.crop", "default")
    queue.enqueue_many([brooq.Job("img.resize", queue="fast") for _ in range(30)])
    resize, crop = _states(db, topic="img.resize", queue="default"), _states(db, topic="img.crop")
    # Both: only that topic in that queue.
    assert queue.purge(queue="fast", topic="img.resize") == 30
    assert _states(db, topic="img.resize", queue="default") == resize
    assert queue.purge(topic="img.resize") == _untaken()
    assert _states(db, topic="img.resize", queue="default") == _after_purge(resize)
    assert _states(db, topic="img.crop") == crop
    assert _transactions(db, topic="img.resize", queue="default") == 1  # one default batch


def test_waiting_jobs_are_purged_with_what_waits_on_them_and_late_jobs_are_left(
    queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    first, _ = queue.enqueue(brooq.Job("flow.a", queue="flows"))
    second, _ = queue.enqueue(brooq.Job("flow.b", queue="flows", after=[first]))
    elsewhere, _ = queue.enqueue(brooq.Job("flow.c", queue="else", after=[first]))
    late, _ = queue.enqueue(brooq.Job("flow.a", queue="flows"))
    # A job created after the purge's start (its first batch's now()) is left alone.
    db.execute("UPDATE job SET created_at = now() + interval '1 hour' WHERE id = %s", (late,))
    assert queue.purge(queue="flows") == 2
    got = {i: queue.get(i).state for i in (first, second, elsewhere, late)}  # type: ignore[union-attr]
    # The job in another queue that waited on a purged one follows it, as with cancel.
    assert got == {first: "canceled", second: "canceled", elsewhere: "canceled", late: "pending"}


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({}, BrooqError, "purge needs a queue or a topic"),
        ({"queue": "Bad Q"}, InvalidQueue, "queue 'Bad Q' does not match"),
        ({"topic": ""}, InvalidTopic, "topic"),
        ({"queue": "q", "batch_size": 0}, BrooqError, "batch_size must be a positive integer"),
    ],
)
def test_a_bad_purge_is_refused_before_any_statement(
    queue: brooq.Queue, kwargs: dict[str, Any], error: type[Exception], words: str
) -> None:
    queue.close()
    # A closed Queue would fail at its first statement: the refusal comes first.
    with pytest.raises(error, match=words):
        queue.purge(**kwargs)


def test_the_cli_purges_with_yes_refuses_without_it_and_exits_2_on_bad_input(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str
) -> None:
    queue.enqueue_many([brooq.Job("cli.purge", queue="q1") for _ in range(12)])
    queue.enqueue_many([brooq.Job("cli.keep", queue="q2") for _ in range(3)])
    refused = run("--database", dsn, "purge", "--queue", "q1")
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "error: 12 jobs not yet taken (queue q1); stdin is not a terminal, so nothing was "
        "purged: pass --yes to cancel them"
    )
    assert _states(db, queue="q1") == {"pending": 12}
    for args, words in [
        ((), "give --queue, --topic or both"),
        (("--queue", "Bad Q"), "Invalid value for '--queue'"),
        (("--topic", "x y"), "Invalid value for '--topic'"),
        (("--queue", "q1", "--json"), "with --json, --yes is required"),
    ]:
        bad = run("--database", dsn, "purge", *args)
        assert bad.returncode == 2, (args, bad)
        assert words in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    done = run("--database", dsn, "purge", "--queue", "q1", "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "purged 12 jobs (queue q1): canceled"
    as_json = run(
        "--database", dsn, "purge", "--topic", "cli.keep", "--queue", "q2", "--yes", "--json"
    )
    assert as_json.returncode == 0 and json.loads(as_json.stdout) == {"purged": 3}
    assert _states(db) == {"canceled": 15}
    assert run("--database", dsn, "purge", "--queue", "q1", "--yes").stdout.strip() == (
        "purged 0 jobs (queue q1): canceled"
    )


def test_the_cli_asks_at_a_terminal(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from brooq.cli import cli

    queue.enqueue_many([brooq.Job("cli.ask") for _ in range(2)])
    monkeypatch.setattr(cli_purge, "can_ask", lambda: True)
    said_no = CliRunner().invoke(
        cli, ["--database", dsn, "purge", "--topic", "cli.ask"], input="n\n"
    )
    assert said_no.exit_code == 2 and "2 jobs not yet taken (topic cli.ask)" in said_no.output
    assert _states(db) == {"pending": 2}
    said_yes = CliRunner().invoke(
        cli, ["--database", dsn, "purge", "--topic", "cli.ask"], input="y\n"
    )
    assert said_yes.exit_code == 0 and "purged 2 jobs (topic cli.ask)" in said_yes.output
    assert _states(db) == {"canceled": 2}
