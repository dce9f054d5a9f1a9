"""Bulk cancel and retry against a real database: Queue.cancel_many and
Queue.retry_many, their SQL (job_count_matching, job_cancel_batch, job_retry_batch: the
guards, the batches, the wake-up), and `brooq [jobs] cancel|retry --topic T --state S`.

Rows are written by SQL in several states, topics and queues; every check of what changed
(and of what did not) reads the table, not the API's answer."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg.rows import dict_row

import brooq
from brooq.cli import cancel_retry as cli_cancel_retry
from brooq.cli.common import cli
from brooq.job import BULK_FROM_STATES, STATES
from brooq.producer.ids import uuid7_many
from brooq.sql import Q
from tests.db.test_cli import ok, refused, run

Conn = psycopg.Connection[Any]
ERRORS = '[{"attempt": 1, "at": "2026-12-01T10:00:00+00:00", "error": "boom", "worker": "w"}]'


def put(db: Conn, topic: str, state: str, *, queue: str = "default", n: int = 1) -> list[uuid.UUID]:
    """``n`` jobs of ``topic`` in ``state``, written an hour ago, as a worker leaves them:
    attempts spent, an error and its history, the last lease, a waiter's flag."""
    ids = uuid7_many(n)
    db.execute(
        "INSERT INTO job (id, topic, queue, state, attempts, last_error, errors, locked_by,"
        " locked_until, waited, available_at, updated_at)"
        " SELECT i, %(topic)s, %(queue)s, %(state)s, 5, 'boom', %(errors)s::jsonb, 'w:1/c-1',"
        " now() - interval '1 hour', true, now() - interval '2 hours',"
        " now() - interval '1 hour'"
        " FROM unnest(%(ids)s::uuid[]) AS i",
        {"ids": ids, "topic": topic, "queue": queue, "state": state, "errors": ERRORS},
    )
    return ids


def rows(db: Conn) -> dict[uuid.UUID, dict[str, Any]]:
    cur = db.cursor(row_factory=dict_row)
    return {row["id"]: row for row in cur.execute("SELECT * FROM job_all")}


@pytest.fixture
def mixed(db: Conn) -> dict[str, list[uuid.UUID]]:
    """Jobs of two topics in every state but processing, in two queues."""
    made: dict[str, list[uuid.UUID]] = {}
    for state in STATES:
        if state == "processing":
            continue
        made[f"mail/{state}"] = put(db, "mail", state, n=3)
        made[f"mail/{state}/bulk"] = put(db, "mail", state, queue="bulk", n=2)
        made[f"report/{state}"] = put(db, "report", state, n=2)
    made["mail/processing"] = put(db, "mail", "pending", n=2)
    db.execute(
        "UPDATE job SET state = 'processing', locked_until = now() + interval '1 min'"
        " WHERE id = ANY(%s)",
        [made["mail/processing"]],
    )
    return made


def only_these_changed(
    before: dict[uuid.UUID, dict[str, Any]],
    after: dict[uuid.UUID, dict[str, Any]],
    changed: list[uuid.UUID],
) -> None:
    assert before.keys() == after.keys()
    for job_id, row in before.items():
        if job_id not in changed:
            assert after[job_id] == row, job_id


def assert_retried(before: dict[str, Any], after: dict[str, Any], now: datetime) -> None:
    """What job_retry does to one job: pending now, attempts reset, lease and waited flag
    cleared, last error and error history kept."""
    assert after["state"] == "pending"
    assert after["attempts"] == 0
    assert after["available_at"] <= now and after["available_at"] > before["available_at"]
    assert after["locked_by"] is None and after["locked_until"] is None
    assert after["waited"] is None
    assert after["last_error"] == before["last_error"] == "boom"
    assert after["errors"] == before["errors"]
    assert after["updated_at"] > before["updated_at"]


# -- Python API ------------------------------------------------------------------------------


def test_retry_many_changes_only_the_matching_jobs(
    queue: brooq.Queue, db: Conn, mixed: dict[str, list[uuid.UUID]]
) -> None:
    before = rows(db)
    result = queue.retry_many(topic="mail", state="dead")
    assert result == brooq.BulkResult(matched=5, changed=5)
    after = rows(db)
    changed = mixed["mail/dead"] + mixed["mail/dead/bulk"]
    only_these_changed(before, after, changed)
    now = db.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    for job_id in changed:
        assert_retried(before[job_id], after[job_id], now)


def test_the_queue_filter_and_canceled_jobs(
    queue: brooq.Queue, db: Conn, mixed: dict[str, list[uuid.UUID]]
) -> None:
    before = rows(db)
    assert queue.retry_many(topic="mail", state="canceled", queue="bulk") == (
        brooq.BulkResult(matched=2, changed=2)
    )
    only_these_changed(before, rows(db), mixed["mail/canceled/bulk"])


@pytest.mark.parametrize("state", BULK_FROM_STATES["cancel"])
def test_cancel_many(
    queue: brooq.Queue, db: Conn, mixed: dict[str, list[uuid.UUID]], state: str
) -> None:
    before = rows(db)
    result = queue.cancel_many(topic="mail", state=state, queue="default")
    assert result.to_dict() == {"matched": 3, "changed": 3}
    after = rows(db)
    only_these_changed(before, after, mixed[f"mail/{state}"])
    for job_id in mixed[f"mail/{state}"]:
        assert after[job_id]["state"] == "canceled"
        assert after[job_id]["updated_at"] > before[job_id]["updated_at"]
        # as job_cancel: nothing but the state and updated_at
        assert after[job_id]["attempts"] == before[job_id]["attempts"]


def test_a_dry_run_counts_and_changes_nothing(
    queue: brooq.Queue, db: Conn, mixed: dict[str, list[uuid.UUID]]
) -> None:
    before = rows(db)
    assert queue.cancel_many(topic="mail", state="pending", dry_run=True) == (
        brooq.BulkResult(matched=5, changed=0)
    )
    assert queue.retry_many(topic="report", state="dead", dry_run=True).matched == 2
    assert queue.retry_many(topic="nothing", state="dead") == brooq.BulkResult(0, 0)
    assert rows(db) == before


def test_bad_arguments_are_refused_before_any_write(
    queue: brooq.Queue, db: Conn, mixed: dict[str, list[uuid.UUID]]
) -> None:
    before = rows(db)
    with pytest.raises(brooq.InvalidTransition, match="only dead or canceled jobs can be"):
        queue.retry_many(topic="mail", state="done")
    with pytest.raises(
        brooq.InvalidTransition, match="only pending, failed, waiting or on_hold jobs"
    ):
        queue.cancel_many(topic="mail", state="processing")  # one by one, by id only
    with pytest.raises(brooq.InvalidTopic):
        queue.cancel_many(topic="Mail!", state="pending")
    with pytest.raises(brooq.InvalidQueue):
        queue.cancel_many(topic="mail", state="pending", queue="")
    with pytest.raises(brooq.BrooqError, match="batch_size"):
        queue.retry_many(topic="mail", state="dead", batch_size=0)
    with pytest.raises(TypeError):
        queue.retry_many("mail", "dead")  # type: ignore[misc]
    assert rows(db) == before


def test_batches_are_transactions_of_their_own_each_waking_the_masters(
    queue: brooq.Queue, db: Conn, connect: Any
) -> None:
    dead = put(db, "mail", "dead", n=25)
    listener = connect()
    listener.execute(Q.listen_jobs)
    result = queue.retry_many(topic="mail", state="dead", batch_size=4)
    assert result == brooq.BulkResult(matched=25, changed=25)
    after = rows(db)
    assert all(after[job_id]["state"] == "pending" for job_id in dead)
    # 6 batches of 4 and one of 1, committed one after the other: 7 instants of now().
    assert len({after[job_id]["updated_at"] for job_id in dead}) == 7
    # One notification per batch (separate transactions are not folded into one).
    woken = list(listener.notifies(timeout=1.0, stop_after=8))
    assert [n.channel for n in woken] == ["brooq_job"] * 7


def test_an_exact_multiple_of_the_batch_ends(queue: brooq.Queue, db: Conn) -> None:
    put(db, "mail", "pending", n=8)
    assert queue.cancel_many(topic="mail", state="pending", batch_size=4) == (
        brooq.BulkResult(matched=8, changed=8)
    )
    assert db.execute("SELECT count(*) FROM job_all WHERE state = 'canceled'").fetchone() == (8,)


# -- the SQL's guards ----------------------------------------------------------------------------


def batch_params(db: Conn, action: str, state: str, **extra: Any) -> dict[str, Any]:
    count = db.cursor(row_factory=dict_row).execute(
        Q.job_count_matching, {"topic": "mail", "state": state, "queue": None, "tag": None}
    )
    row = count.fetchone()
    assert row is not None
    return {
        "topic": "mail",
        "state": state,
        "queue": None,
        "tag": None,
        "as_of": row["as_of"],
        "from_states": list(BULK_FROM_STATES[action]),  # type: ignore[index]
        "batch": 100,
        "after": uuid.UUID(int=0),
        **extra,
    }


def test_a_job_written_after_the_count_is_left_alone(db: Conn) -> None:
    old, recent = put(db, "mail", "dead", n=2)
    params = batch_params(db, "retry", "dead")
    db.execute("UPDATE job SET updated_at = now() + interval '1 s' WHERE id = %s", [recent])
    out = db.cursor(row_factory=dict_row).execute(Q.job_retry_batch, params).fetchone()
    assert out is not None and (out["picked"], out["changed"]) == (1, 1)
    assert out["last_id"] == old
    after = rows(db)
    assert (after[old]["state"], after[recent]["state"]) == ("pending", "dead")


def test_a_locked_job_is_skipped_not_waited_for(db: Conn, connect: Any) -> None:
    free, held = put(db, "mail", "failed", n=2)
    holder = connect(autocommit=False)
    holder.execute("SELECT 1 FROM job WHERE id = %s FOR UPDATE", [held])
    params = batch_params(db, "cancel", "failed")
    out = db.cursor(row_factory=dict_row).execute(Q.job_cancel_batch, params).fetchone()
    assert out is not None and (out["picked"], out["changed"]) == (1, 1)
    holder.rollback()
    after = rows(db)
    assert (after[free]["state"], after[held]["state"]) == ("canceled", "failed")


@pytest.mark.parametrize(
    ("action", "state"), [("cancel", "done"), ("cancel", "processing"), ("retry", "pending")]
)
def test_the_sql_refuses_a_state_the_rule_does_not_allow(
    db: Conn, mixed: dict[str, list[uuid.UUID]], action: str, state: str
) -> None:
    """Even given a state the Python side would refuse, the batch writes nothing: the
    from_states guard is re-checked under the row lock, as in job_cancel and job_retry."""
    before = rows(db)
    query = Q.job_cancel_batch if action == "cancel" else Q.job_retry_batch
    out = db.cursor(row_factory=dict_row).execute(query, batch_params(db, action, state))
    row = out.fetchone()
    assert row is not None and row["picked"] > 0 and row["changed"] == 0
    assert rows(db) == before


# -- the command -------------------------------------------------------------------------------


def test_retry_with_yes(dsn: str, db: Conn, mixed: dict[str, list[uuid.UUID]]) -> None:
    before = rows(db)
    out = ok(dsn, "jobs", "retry", "--topic", "mail", "--state", "dead", "--yes")
    assert out.splitlines() == [
        "5 jobs match (topic mail, state dead)",
        "retried 5 of 5: pending now, attempts reset",
    ]
    only_these_changed(before, rows(db), mixed["mail/dead"] + mixed["mail/dead/bulk"])


def test_cancel_json(dsn: str, db: Conn, mixed: dict[str, list[uuid.UUID]]) -> None:
    before = rows(db)
    args = ["cancel", "--topic", "mail", "--state", "failed", "--queue", "bulk"]
    assert as_json_out(dsn, "jobs", *args, "--yes") == {"matched": 2, "changed": 2}
    only_these_changed(before, rows(db), mixed["mail/failed/bulk"])
    # `brooq cancel` is the same command
    assert as_json_out(dsn, *args, "--yes") == {"matched": 0, "changed": 0}


def as_json_out(dsn: str, *args: str) -> Any:
    return json.loads(ok(dsn, *args, "--json"))


def test_without_yes_and_without_a_terminal_nothing_changes(
    dsn: str, db: Conn, mixed: dict[str, list[uuid.UUID]]
) -> None:
    before = rows(db)
    line = refused(dsn, "jobs", "cancel", "--topic", "mail", "--state", "pending", code=2)
    assert line == (
        "error: 5 jobs match (topic mail, state pending); stdin is not a terminal, so "
        "nothing was canceled: pass --yes to cancel them"
    )
    line = refused(dsn, "retry", "--topic", "mail", "--state", "dead", "--json", code=2)
    assert line.startswith(
        "error: with --json, --yes is required: no prompt is shown (nothing was retried)"
    )
    assert rows(db) == before


@pytest.mark.parametrize(
    ("command", "state", "rule"),
    [
        (
            "cancel",
            "processing",
            "only pending, failed, waiting or on_hold jobs can be canceled in bulk",
        ),
        ("cancel", "done", "only pending, failed, waiting or on_hold jobs can be canceled in bulk"),
        ("retry", "failed", "only dead or canceled jobs can be retried in bulk"),
        ("retry", "bogus", "only dead or canceled jobs can be retried in bulk"),
    ],
)
def test_a_state_the_command_does_not_take(
    dsn: str, db: Conn, mixed: dict[str, list[uuid.UUID]], command: str, state: str, rule: str
) -> None:
    before = rows(db)
    line = refused(dsn, "jobs", command, "--topic", "mail", "--state", state, "--yes", code=2)
    assert line == (
        f"error: Invalid value for '--state': '{state}': {rule} (see: brooq jobs {command} --help)"
    )
    assert rows(db) == before


def test_a_dry_run_of_the_command_changes_nothing(
    dsn: str, db: Conn, mixed: dict[str, list[uuid.UUID]]
) -> None:
    before = rows(db)
    out = ok(dsn, "jobs", "cancel", "--topic", "mail", "--state", "pending", "--dry-run")
    assert out.splitlines() == [
        "5 jobs match (topic mail, state pending)",
        "nothing was canceled (--dry-run)",
    ]
    args = ["retry", "--topic", "mail", "--state", "dead", "--queue", "bulk", "--dry-run"]
    assert as_json_out(dsn, *args) == {"matched": 2, "changed": 0}  # no --yes needed
    assert rows(db) == before


def test_usage_errors(dsn: str, db: Conn, mixed: dict[str, list[uuid.UUID]]) -> None:
    before = rows(db)
    some_id = str(mixed["mail/dead"][0])
    line = refused(dsn, "jobs", "retry", some_id, "--topic", "mail", "--state", "dead", code=2)
    assert "give a job id or the bulk filters (--topic, --state), not both" in line
    line = refused(dsn, "retry", some_id, "--yes", code=2)
    assert "not both: --yes with JOB_ID" in line
    line = refused(dsn, "jobs", "cancel", "--topic", "mail", code=2)
    assert (
        "give a job id, or --state for the bulk form (--state pending|failed|waiting|on_hold)"
        in line
    )
    line = refused(dsn, "jobs", "cancel", "--queue", "bulk", "--state", "pending", code=2)
    assert "or --topic for the bulk form" in line
    assert "does not match" in refused(
        dsn, "cancel", "--topic", "Mail", "--state", "pending", "--yes", code=2
    )
    assert "queue" in refused(
        dsn, "cancel", "--topic", "mail", "--state", "pending", "--queue", "A B", code=2
    )
    assert rows(db) == before


def test_one_job_by_id_under_jobs_too(dsn: str, db: Conn) -> None:
    (job_id,) = put(db, "mail", "dead")
    assert ok(dsn, "jobs", "retry", str(job_id)).strip() == (
        f"retried {job_id}: pending now, attempts reset"
    )
    assert ok(dsn, "jobs", "cancel", str(job_id)).strip() == f"canceled {job_id}"
    assert rows(db)[job_id]["state"] == "canceled"


def test_the_prompt_at_a_terminal(
    dsn: str, db: Conn, mixed: dict[str, list[uuid.UUID]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_cancel_retry, "can_ask", lambda: True)
    args = ["--database", dsn, "jobs", "retry", "--topic", "report", "--state", "dead"]
    before = rows(db)
    declined = CliRunner().invoke(cli, args, input="n\n")
    assert declined.exit_code == 2
    assert "2 jobs match (topic report, state dead)\nRetry them? [y/N]: n\n" in declined.output
    assert "not confirmed; nothing was retried" in declined.output
    assert rows(db) == before
    accepted = CliRunner().invoke(cli, args, input="y\n")
    assert accepted.exit_code == 0, accepted.output
    assert accepted.output.splitlines()[-1] == "retried 2 of 2: pending now, attempts reset"
    only_these_changed(before, rows(db), mixed["report/dead"])


def test_a_terminal_and_nothing_matching_asks_nothing(
    dsn: str, db: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_cancel_retry, "can_ask", lambda: True)
    args = ["--database", dsn, "cancel", "--topic", "mail", "--state", "failed"]
    result = CliRunner().invoke(cli, args, input="")
    assert result.exit_code == 0
    assert result.output == "0 jobs match (topic mail, state failed)\n"


def test_the_help_names_the_bulk_states() -> None:
    for command in ("cancel", "retry"):
        out = run("jobs", command, "--help")
        assert out.returncode == 0
        assert "--state " + "|".join(BULK_FROM_STATES[command]) in out.stdout  # type: ignore[index]


def test_the_jobs_left_alone_are_said(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fewer changed than matched (jobs that moved meanwhile): the line says how many."""
    monkeypatch.setattr(
        brooq.Queue, "cancel_many", lambda self, **kw: brooq.BulkResult(matched=5, changed=3)
    )
    args = ["--database", dsn, "cancel", "--topic", "mail", "--state", "failed", "--yes"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "5 jobs match (topic mail, state failed)",
        "canceled 3 of 5 (2 changed state meanwhile and were left alone)",
    ]
