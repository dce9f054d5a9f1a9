"""`brooq [jobs] hold` and `brooq [jobs] release` against a real database: one job by id
and the bulk form (--topic, --state, --queue, --tag, --yes, --dry-run, --json), their
refusals (one line on stderr, the exit codes of cancel and retry), and the on_hold count
`stats` and `queues` show.

Every check of what changed (and of what did not) reads the table, not the command's
answer."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

import brooq
from brooq.cli import cancel_retry as cli_cancel_retry
from brooq.cli.common import cli
from tests.db.test_bulk import only_these_changed, put, rows
from tests.db.test_cli import MISSING, as_json, ok, refused, state_of

Conn = psycopg.Connection[Any]


def job(queue: brooq.Queue, db: Conn, set_: str | None = None, **options: Any) -> str:
    """A mail job, due a minute and a half ago, then given ``set_`` (SQL) if any."""
    job_id, _ = queue.enqueue(brooq.Job("mail", {"to": "dee@example.org"}, **options))
    db.execute("UPDATE job SET available_at = now() - interval '90 s' WHERE id = %s", (job_id,))
    if set_ is not None:
        db.execute(f"UPDATE job SET {set_} WHERE id = %s", (job_id,))
    return str(job_id)


def available_at(db: Conn, job_id: str) -> Any:
    row = db.execute("SELECT available_at FROM job_all WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return row[0]


# -- one job by id ---------------------------------------------------------------------------


def test_hold_then_release_one_job(dsn: str, queue: brooq.Queue, db: Conn) -> None:
    job_id = job(queue, db)
    due = available_at(db, job_id)

    assert ok(dsn, "jobs", "hold", job_id).strip() == f"held {job_id}: on hold until released"
    assert state_of(db, job_id) == ("on_hold", 0)
    assert available_at(db, job_id) == due  # its place in line is kept
    assert as_json(dsn, "jobs", "show", job_id)["state"] == "on_hold"
    listed = as_json(dsn, "jobs", "list", "--state", "on_hold")["jobs"]
    assert [j["id"] for j in listed] == [job_id]
    shown = ok(dsn, "jobs", "show", job_id).splitlines()
    assert "state:           on_hold" in shown
    assert any(line.startswith("available at:    when released, in line from ") for line in shown)

    # `brooq release` is the same command as `brooq jobs release`
    out = ok(dsn, "release", job_id).strip()
    assert out == f"released {job_id}: pending again, in line where it was"
    assert state_of(db, job_id) == ("pending", 0)
    assert available_at(db, job_id) == due
    assert as_json(dsn, "jobs", "list", "--state", "on_hold")["jobs"] == []


def test_a_failed_job_is_held_with_its_attempts(dsn: str, queue: brooq.Queue, db: Conn) -> None:
    job_id = job(queue, db, "state = 'failed', attempts = 2, last_error = 'SMTP 451'")
    assert ok(dsn, "hold", job_id).strip() == f"held {job_id}: on hold until released"
    assert state_of(db, job_id) == ("on_hold", 2)
    assert ok(dsn, "jobs", "release", job_id).startswith(f"released {job_id}")
    assert state_of(db, job_id) == ("pending", 2)


def test_a_held_job_is_counted_on_hold(dsn: str, queue: brooq.Queue, db: Conn) -> None:
    held = job(queue, db)
    job(queue, db)
    ok(dsn, "hold", held)

    (mail,) = as_json(dsn, "stats")["topics"]
    assert (mail["topic"], mail["on_hold"], mail["ready"], mail["pending"]) == ("mail", 1, 1, 1)
    (default,) = as_json(dsn, "queues")
    assert (default["name"], default["on_hold"], default["ready"]) == ("default", 1, 1)
    lines = ok(dsn, "stats").splitlines()
    column = lines[0].split().index("ON_HOLD")
    assert lines[1].split()[column] == "1"


def test_a_held_job_can_be_canceled(dsn: str, queue: brooq.Queue, db: Conn) -> None:
    job_id = job(queue, db)
    ok(dsn, "hold", job_id)
    assert ok(dsn, "cancel", job_id).strip() == f"canceled {job_id}"
    assert state_of(db, job_id)[0] == "canceled"


@pytest.mark.parametrize(
    ("command", "set_", "options", "why"),
    [
        (
            "hold",
            "state = 'processing', attempts = 1, locked_by = 'web1:100/child-1', "
            "locked_until = now() + interval '30 s'",
            {},
            "it is processing; only pending or failed jobs can be held",
        ),
        ("hold", "state = 'done', attempts = 1", {}, "it is done; only pending or failed jobs"),
        ("hold", "state = 'dead', attempts = 5", {}, "it is dead; only pending or failed jobs"),
        ("release", None, {}, "it is pending; only on_hold jobs can be released"),
        (
            "hold",
            None,
            {"unique_key": "invoice-7"},
            "it has a unique_key ('invoice-7'), which a job on hold would give up; "
            "cancel it, or let it run",
        ),
        (
            "hold",
            "parked = 'sleep'",
            {},
            "a durable handler parked it (it has started and sleeps or waits); "
            "cancel it to stop it",
        ),
    ],
)
def test_a_refusal_is_one_line_and_changes_nothing(
    dsn: str,
    queue: brooq.Queue,
    db: Conn,
    command: str,
    set_: str | None,
    options: dict[str, Any],
    why: str,
) -> None:
    job_id = job(queue, db, set_, **options)
    before = rows(db)
    for words in ([command], ["jobs", command]):
        line = refused(dsn, *words, job_id, code=1)  # a refused cancel's code
        assert line.startswith(f"error: cannot {command} job {job_id}: "), line
        assert why in line, line
    assert rows(db) == before


def test_a_refused_hold_exits_as_a_refused_cancel(dsn: str, queue: brooq.Queue, db: Conn) -> None:
    job_id = job(queue, db, "state = 'done', attempts = 1")
    canceled = refused(dsn, "cancel", job_id, code=1)
    assert canceled.startswith(f"error: cannot cancel job {job_id}: it is done")
    assert refused(dsn, "hold", job_id, code=1).startswith(f"error: cannot hold job {job_id}")


def test_unknown_malformed_or_missing_ids(dsn: str) -> None:
    for command in ("hold", "release"):
        assert refused(dsn, command, MISSING, code=1) == f"error: no job with id {MISSING}"
        assert "not a UUID" in refused(dsn, "jobs", command, "12345", code=2)
    line = refused(dsn, "jobs", "hold", code=2)
    assert (
        "give a job id, or --topic and --state for the bulk form (--state pending|failed)" in line
    )
    line = refused(dsn, "jobs", "release", code=2)
    assert "Missing argument JOB_ID: give a job id, or --topic for the bulk form (see:" in line


# -- in bulk ---------------------------------------------------------------------------------


@pytest.fixture
def mail(db: Conn) -> dict[str, list[uuid.UUID]]:
    """mail pending in two queues, one of them with a unique_key, failed, dead; report
    pending; written by SQL as test_bulk's jobs are."""
    made = {
        "pending": put(db, "mail", "pending", n=3),
        "pending/bulk": put(db, "mail", "pending", queue="bulk", n=2),
        "keyed": put(db, "mail", "pending"),
        "failed": put(db, "mail", "failed", n=2),
        "dead": put(db, "mail", "dead"),
        "report": put(db, "report", "pending", n=2),
    }
    db.execute("UPDATE job SET unique_key = 'k-1' WHERE id = %s", made["keyed"])
    return made


def states(db: Conn, ids: list[uuid.UUID]) -> set[str]:
    return {rows(db)[job_id]["state"] for job_id in ids}


def test_a_dry_run_counts_and_changes_nothing(
    dsn: str, db: Conn, mail: dict[str, list[uuid.UUID]]
) -> None:
    before = rows(db)
    out = ok(dsn, "jobs", "hold", "--topic", "mail", "--state", "pending", "--dry-run")
    assert out.splitlines() == [
        "6 jobs match (topic mail, state pending)",
        "nothing was held (--dry-run)",
    ]
    # --dry-run asks nothing: --json needs no --yes then
    args = ["hold", "--topic", "mail", "--state", "failed", "--dry-run"]
    assert as_json(dsn, *args) == {"matched": 2, "changed": 0}
    out = ok(dsn, "release", "--topic", "mail", "--dry-run", "--yes")
    assert out.splitlines() == [
        "0 jobs match (topic mail, state on_hold)",
        "nothing was released (--dry-run)",
    ]
    assert rows(db) == before


def test_hold_then_release_a_topic(dsn: str, db: Conn, mail: dict[str, list[uuid.UUID]]) -> None:
    before = rows(db)
    out = ok(dsn, "jobs", "hold", "--topic", "mail", "--state", "pending", "--yes")
    assert out.splitlines() == [
        "6 jobs match (topic mail, state pending)",
        "held 5 of 6: on hold until released (1 left alone: they have a unique_key, a "
        "durable handler parked them, or they changed state meanwhile)",
    ]
    held = mail["pending"] + mail["pending/bulk"]
    after = rows(db)
    only_these_changed(before, after, held)
    for job_id in held:
        assert after[job_id]["state"] == "on_hold"
        assert after[job_id]["attempts"] == before[job_id]["attempts"]
        assert after[job_id]["available_at"] == before[job_id]["available_at"]
    (default,) = [q for q in as_json(dsn, "queues") if q["name"] == "default"]
    assert default["on_hold"] == 3

    # one queue, as JSON; then the rest, --state on_hold given or not
    args = ["release", "--topic", "mail", "--queue", "bulk", "--yes"]
    assert as_json(dsn, "jobs", *args) == {"matched": 2, "changed": 2}
    assert states(db, mail["pending/bulk"]) == {"pending"}
    assert states(db, mail["pending"]) == {"on_hold"}
    out = ok(dsn, "release", "--topic", "mail", "--state", "on_hold", "--yes")
    assert out.splitlines() == [
        "3 jobs match (topic mail, state on_hold)",
        "released 3 of 3: pending again, in line where it was",
    ]
    final = rows(db)
    only_these_changed(before, final, held)
    for job_id in held:
        assert final[job_id]["state"] == "pending"
        assert final[job_id]["available_at"] == before[job_id]["available_at"]


def test_hold_the_failed_jobs_of_a_tag(
    dsn: str, db: Conn, mail: dict[str, list[uuid.UUID]]
) -> None:
    tagged = mail["failed"][0]
    db.execute("UPDATE job SET tags = ARRAY['vip'] WHERE id = %s", (tagged,))
    before = rows(db)
    args = ["hold", "--topic", "mail", "--state", "failed", "--tag", "vip", "--yes"]
    assert as_json(dsn, *args) == {"matched": 1, "changed": 1}
    only_these_changed(before, rows(db), [tagged])
    assert states(db, [tagged]) == {"on_hold"}


def test_without_yes_and_without_a_terminal_nothing_changes(
    dsn: str, db: Conn, mail: dict[str, list[uuid.UUID]]
) -> None:
    before = rows(db)
    line = refused(dsn, "jobs", "hold", "--topic", "mail", "--state", "pending", code=2)
    assert line == (
        "error: 6 jobs match (topic mail, state pending); stdin is not a terminal, so "
        "nothing was held: pass --yes to hold them"
    )
    line = refused(dsn, "release", "--topic", "mail", "--json", code=2)
    assert line.startswith(
        "error: with --json, --yes is required: no prompt is shown (nothing was released)"
    )
    assert rows(db) == before


@pytest.mark.parametrize(
    ("command", "state", "rule"),
    [
        ("hold", "processing", "only pending or failed jobs can be held in bulk"),
        ("hold", "done", "only pending or failed jobs can be held in bulk"),
        ("hold", "on_hold", "only pending or failed jobs can be held in bulk"),
        ("hold", "bogus", "only pending or failed jobs can be held in bulk"),
        ("release", "pending", "only on_hold jobs can be released in bulk"),
        ("release", "failed", "only on_hold jobs can be released in bulk"),
    ],
)
def test_a_state_the_command_does_not_take(
    dsn: str, db: Conn, mail: dict[str, list[uuid.UUID]], command: str, state: str, rule: str
) -> None:
    before = rows(db)
    line = refused(dsn, "jobs", command, "--topic", "mail", "--state", state, "--yes", code=2)
    assert line == (
        f"error: Invalid value for '--state': '{state}': {rule} (see: brooq jobs {command} --help)"
    )
    assert rows(db) == before


def test_usage_errors_write_nothing(dsn: str, db: Conn, mail: dict[str, list[uuid.UUID]]) -> None:
    before = rows(db)
    some_id = str(mail["pending"][0])
    line = refused(dsn, "jobs", "hold", some_id, "--topic", "mail", "--state", "pending", code=2)
    assert "give a job id or the bulk filters (--topic, --state), not both" in line
    assert "not both: --dry-run with JOB_ID" in refused(
        dsn, "release", some_id, "--dry-run", code=2
    )
    line = refused(dsn, "hold", "--state", "pending", "--yes", code=2)
    assert "or --topic for the bulk form" in line
    assert "does not match" in refused(dsn, "release", "--topic", "Mail", "--yes", code=2)
    assert "queue" in refused(dsn, "release", "--topic", "mail", "--queue", "A B", code=2)
    assert rows(db) == before


@pytest.mark.parametrize("command", ["hold", "release"])
def test_the_prompt_at_a_terminal(
    dsn: str,
    db: Conn,
    mail: dict[str, list[uuid.UUID]],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    if command == "release":
        db.execute("UPDATE job SET state = 'on_hold' WHERE id = ANY(%s)", [mail["report"]])
    monkeypatch.setattr(cli_cancel_retry, "can_ask", lambda: True)
    state = "pending" if command == "hold" else "on_hold"
    args = ["--database", dsn, "jobs", command, "--topic", "report", "--state", state]
    before = rows(db)
    declined = CliRunner().invoke(cli, args, input="n\n")
    assert declined.exit_code == 2
    question = f"{command.capitalize()} them? [y/N]: n\n"
    assert f"2 jobs match (topic report, state {state})\n{question}" in declined.output
    done = "held" if command == "hold" else "released"
    assert f"not confirmed; nothing was {done}" in declined.output
    assert rows(db) == before
    accepted = CliRunner().invoke(cli, args, input="y\n")
    assert accepted.exit_code == 0, accepted.output
    assert accepted.output.splitlines()[-1].startswith(f"{done} 2 of 2: ")
    only_these_changed(before, rows(db), mail["report"])
    assert states(db, mail["report"]) == {"on_hold" if command == "hold" else "pending"}
