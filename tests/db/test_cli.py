"""The `brooq` command, run as a subprocess against a real database holding jobs in every
state; and `brooq top` in a pseudo-terminal."""

from __future__ import annotations

import dataclasses
import fcntl
import io
import json
import os
import select
import struct
import subprocess
import sys
import termios
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest

import brooq
from brooq.cli import show_lines, top
from brooq.operator.records import HolderStats, InFlight, TopicStats
from tests.cliproc import run_brooq

ROOT = Path(__file__).resolve().parents[2]
MISSING = str(uuid.UUID(int=7))
LONG_ERROR = "\n".join(
    ["Traceback (most recent call last):"]
    + [f'  File "app.py", line {n}, in step{n}' for n in range(1, 30)]
    + ["ValueError: bad address"]
)


def run(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m brooq ARGS` without the caller's database or QUEUE_* settings."""
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CRED", "QUEUE_"))
    }
    environ["PYTHONPATH"] = str(ROOT)
    environ.update(env or {})
    return run_brooq(list(args), env=environ, cwd=ROOT, stdin=stdin)


def ok(dsn: str, *args: str) -> str:
    out = run("--database", dsn, *args)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    return out.stdout


def as_json(dsn: str, *args: str) -> Any:
    return json.loads(ok(dsn, *args, "--json"))


def refused(dsn: str, *args: str, code: int) -> str:
    """The command fails with ``code`` and one line on stderr, no traceback; that line."""
    out = run("--database", dsn, *args)
    assert out.returncode == code, (out.stdout, out.stderr)
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    return lines[0]


@dataclass
class Jobs:
    """The ids of the jobs `world` made, by name."""

    ids: dict[str, uuid.UUID]

    def __getattr__(self, name: str) -> str:
        return str(self.ids[name])


@pytest.fixture
def world(queue: brooq.Queue, db: psycopg.Connection[Any]) -> Jobs:
    """Jobs in every state on two topics: mail in the default queue, report in the queue
    reports at priority 5. Created one second apart in this order (so `jobs list` has a
    known order), then each state set by UPDATE."""
    specs: list[tuple[str, str, str]] = [
        # name, topic, UPDATE ... SET
        ("ready", "mail", "available_at = now() - interval '90 s'"),
        ("scheduled", "mail", "available_at = now() + interval '1 hour'"),
        (
            "retrying",
            "mail",
            "state = 'failed', attempts = 1, last_error = 'SMTP 451', "
            "available_at = now() - interval '30 s', updated_at = now() - interval '5 min'",
        ),
        (
            "busy",
            "mail",
            "state = 'processing', attempts = 2, locked_by = 'web1:100/child-1', "
            "locked_until = now() + interval '30 s', updated_at = now() - interval '12 s'",
        ),
        (
            "expired",
            "mail",
            "state = 'processing', attempts = 1, locked_by = 'web1:100/child-2', "
            "locked_until = now() - interval '10 s', updated_at = now() - interval '100 s'",
        ),
        (
            "dead",
            "mail",
            "state = 'dead', attempts = 5, last_error = %(error)s, "
            "locked_by = 'web1:100/child-1', locked_until = now() - interval '20 s', "
            "updated_at = now() - interval '20 s'",
        ),
        ("done", "mail", "state = 'done', attempts = 1, updated_at = now() - interval '10 s'"),
        ("canceled", "mail", "state = 'canceled', updated_at = now() - interval '30 s'"),
        ("report_ready", "report", "available_at = now() - interval '10 s'"),
        (
            "report_busy",
            "report",
            "state = 'processing', attempts = 1, locked_by = 'web2:7/child-4', "
            "locked_until = now() + interval '60 s', updated_at = now() - interval '3 s'",
        ),
        ("report_old", "report", "state = 'done', updated_at = now() - interval '2 min'"),
        ("report_done", "report", "state = 'done', updated_at = now() - interval '1 s'"),
    ]
    ids: dict[str, uuid.UUID] = {}
    for n, (name, topic, assignment) in enumerate(specs):
        key = "key-ready" if name == "ready" else None
        payload = {"to": f"{name}@example.org", "n": n}
        where = {"queue": "reports", "priority": 5} if topic == "report" else {}
        ids[name], _ = queue.enqueue(brooq.Job(topic, payload, idempotency_key=key, **where))
        db.execute(
            "UPDATE job SET " + assignment + ", created_at = %(created)s WHERE id = %(id)s",
            {
                "id": ids[name],
                "error": LONG_ERROR,
                "created": datetime(2020, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=n),
            },
        )
    return Jobs(ids)


def state_of(db: psycopg.Connection[Any], job_id: str) -> tuple[str, int]:
    row = db.execute("SELECT state, attempts FROM job_all WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return row[0], row[1]


# -- stats ----------------------------------------------------------------------------------


def test_stats_json(dsn: str, world: Jobs) -> None:
    topics = as_json(dsn, "stats")["topics"]
    ages = {t["topic"]: t.pop("oldest_ready_age_seconds") for t in topics}
    assert topics == [
        {
            "queue": "default",
            "topic": "mail",
            "waiting": 0,
            "scheduled": 1,
            "ready": 2,  # ready, and the failed job due again
            "held": 0,
            "retrying": 0,
            "parked": 0,
            "on_hold": 0,
            "processing": 2,
            "dead": 1,
            "pending": 2,
            "failed": 1,
            "busy": 1,
            "handler": False,  # no master running
            "no_handler": True,  # and ready jobs
        },
        {
            "queue": "reports",
            "topic": "report",
            "waiting": 0,
            "scheduled": 0,
            "ready": 1,
            "held": 0,
            "retrying": 0,
            "parked": 0,
            "on_hold": 0,
            "processing": 1,
            "dead": 0,
            "pending": 1,
            "failed": 0,
            "busy": 1,
            "handler": False,
            "no_handler": True,
        },
    ]
    assert 90 <= ages["mail"] < 120
    assert 10 <= ages["report"] < 40


def test_stats_plain(dsn: str, world: Jobs) -> None:
    lines = ok(dsn, "stats").splitlines()
    assert lines[0].split() == [
        "QUEUE",
        "TOPIC",
        "WAITING",
        "SCHEDULED",
        "READY",
        "HELD",
        "RETRYING",
        "PARKED",
        "ON_HOLD",
        "PROCESSING",
        "DEAD",
        "OLDEST",
        "READY",
        "HANDLER",
    ]
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in lines[1:-1]}
    assert rows[("default", "mail")][:9] == ["0", "1", "2", "0", "0", "0", "0", "2", "1"]
    assert rows[("default", "mail")][9].endswith("m")  # 90 s and more shows as 1.5m
    assert rows[("default", "mail")][10] == "none"  # no master running
    assert rows[("reports", "report")][:9] == ["0", "0", "1", "0", "0", "0", "0", "1", "0"]
    total = lines[-1].split()
    assert total[0] == "(total)" and total[1:10] == ["0", "1", "3", "0", "0", "0", "0", "3", "1"]
    assert len(total) == 11  # the age; no HANDLER


def test_stats_of_an_empty_queue(dsn: str) -> None:
    assert as_json(dsn, "stats") == {"topics": []}
    assert ok(dsn, "stats").strip() == "(no unfinished or dead jobs)"


def test_queue_stats_in_flight_and_throughput(queue: brooq.Queue, world: Jobs) -> None:
    by_topic = {s.topic: s for s in queue.stats()}
    assert (by_topic["mail"].processing, by_topic["mail"].busy) == (2, 1)
    # done 10 s ago, dead 20 s ago, canceled 30 s ago; the failed row is 5 min old
    assert queue.throughput(60) == {"mail": 3, "report": 1}
    assert queue.throughput(15) == {"mail": 1, "report": 1}
    assert queue.throughput_by_queue(60) == {("default", "mail"): 3, ("reports", "report"): 1}
    flying = queue.in_flight(10)
    assert [str(j.id) for j in flying] == [world.expired, world.busy, world.report_busy]
    assert [j.locked_by for j in flying] == [
        "web1:100/child-2",
        "web1:100/child-1",
        "web2:7/child-4",
    ]
    assert flying[0].lease_left < 0 < flying[1].lease_left
    assert 100 <= flying[0].running_for < 130
    assert [str(j.id) for j in queue.in_flight(1)] == [world.expired]
    with pytest.raises(brooq.BrooqError, match="limit"):
        queue.in_flight(0)
    with pytest.raises(brooq.BrooqError, match="positive"):
        queue.throughput(0)


# -- jobs list ------------------------------------------------------------------------------

NEWEST_FIRST = [
    "report_done",
    "report_old",
    "report_busy",
    "report_ready",
    "canceled",
    "done",
    "dead",
    "expired",
    "busy",
    "retrying",
    "scheduled",
    "ready",
]


def test_jobs_list_json_is_newest_first(dsn: str, world: Jobs) -> None:
    listed = as_json(dsn, "jobs", "list")["jobs"]
    assert [j["id"] for j in listed] == [getattr(world, name) for name in NEWEST_FIRST]
    dead = listed[NEWEST_FIRST.index("dead")]
    assert dead == {
        "id": world.dead,
        "topic": "mail",
        "payload": {"to": "dead@example.org", "n": 5},
        "state": "dead",
        "attempts": 5,
        "available_at": dead["available_at"],
        "locked_by": "web1:100/child-1",
        "locked_until": dead["locked_until"],
        "last_error": LONG_ERROR,
        "idempotency_key": None,
        "created_at": "2020-01-01T00:00:05+00:00",
        "updated_at": dead["updated_at"],
        "queue": "default",
        "priority": 0,
        "result": None,
        "errors": [],
        "unique_key": None,
        "tags": [],
        "start_after": None,
        "group": None,
        "progress": None,
        "progress_message": None,
        "traceparent": None,
        "started_at": None,
        "ordering_key": None,
    }
    datetime.fromisoformat(dead["updated_at"])

    three = as_json(dsn, "jobs", "list", "--limit", "3")["jobs"]
    assert [j["id"] for j in three] == [getattr(world, n) for n in NEWEST_FIRST[:3]]
    processing = as_json(dsn, "jobs", "list", "--state", "processing", "--topic", "mail")
    assert [j["id"] for j in processing["jobs"]] == [world.expired, world.busy]
    assert as_json(dsn, "jobs", "list", "--topic", "nothing") == {"jobs": []}
    reports = as_json(dsn, "jobs", "list", "--queue", "reports")["jobs"]
    assert [j["id"] for j in reports] == [getattr(world, n) for n in NEWEST_FIRST[:4]]
    assert {(j["queue"], j["priority"]) for j in reports} == {("reports", 5)}
    busy = as_json(dsn, "jobs", "list", "--queue", "reports", "--state", "processing")
    assert [j["id"] for j in busy["jobs"]] == [world.report_busy]
    assert as_json(dsn, "jobs", "list", "--queue", "reports", "--topic", "mail") == {"jobs": []}
    assert as_json(dsn, "jobs", "list", "--queue", "never.used") == {"jobs": []}


def test_jobs_list_plain(dsn: str, world: Jobs) -> None:
    lines = ok(dsn, "jobs", "list", "--topic", "mail").splitlines()
    assert lines[0].split() == [
        "ID",
        "TOPIC",
        "QUEUE",
        "PRIORITY",
        "STATE",
        "ATTEMPTS",
        "CREATED",
        "LAST",
        "ERROR",
    ]
    rows = [line.split() for line in lines[1:]]
    mail = [n for n in NEWEST_FIRST if not n.startswith("report")]
    assert [r[0] for r in rows] == [getattr(world, n) for n in mail]
    dead = rows[mail.index("dead")]
    assert dead[1:9] == ["mail", "default", "0", "dead", "5", "2020-01-01", "00:00:05", "UTC"]
    assert " ".join(dead[9:]) == "ValueError: bad address"
    assert rows[mail.index("busy")][1:6] == ["mail", "default", "0", "processing", "2"]
    reports = [line.split() for line in ok(dsn, "jobs", "list", "--queue", "reports").splitlines()]
    assert [r[1:5] for r in reports[1:]] == [["report", "reports", "5", "done"]] * 2 + [
        ["report", "reports", "5", "processing"],
        ["report", "reports", "5", "pending"],
    ]
    assert ok(dsn, "jobs", "list", "--state", "done", "--topic", "x").strip() == "(no jobs)"


def test_jobs_list_limit_is_bounded(dsn: str, world: Jobs) -> None:
    assert len(as_json(dsn, "jobs", "list", "--limit", "1000")["jobs"]) == 12
    line = refused(dsn, "jobs", "list", "--limit", "1001", code=2)
    assert "1001" in line and "1 to 1000" in line
    refused(dsn, "jobs", "list", "--limit", "0", code=2)
    refused(dsn, "jobs", "list", "--state", "lost", code=2)
    assert "does not match" in refused(dsn, "jobs", "list", "--topic", "Bad Topic", code=2)
    line = refused(dsn, "jobs", "list", "--queue", "Bad Queue", code=2)
    assert "--queue" in line and "does not match" in line, line


def test_default_limit_is_100(dsn: str, queue: brooq.Queue) -> None:
    queue.enqueue_many([brooq.Job("bulk", {"n": n}) for n in range(105)])
    assert len(as_json(dsn, "jobs", "list")["jobs"]) == 100


# -- jobs show ------------------------------------------------------------------------------


def fields(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and not line.startswith(" "):
            out[name] = value.strip()
    return out


def test_jobs_show_a_processing_job(dsn: str, world: Jobs) -> None:
    text = ok(dsn, "jobs", "show", world.busy)
    shown = fields(text)
    assert shown["id"] == world.busy
    assert shown["state"] == "processing"
    assert shown["attempts"] == "2"
    assert shown["queue"] == "default, priority 0"
    assert shown["holder"] == "web1:100/child-1"
    assert shown["lease until"].endswith("s)") and "(in " in shown["lease until"]
    assert "expired" not in shown["lease until"]
    assert shown["created"].startswith("2020-01-01 00:00:03 UTC (")
    assert shown["last error"] == "-"
    assert json.loads(shown["payload"]) == {"to": "busy@example.org", "n": 3}
    assert len(text.splitlines()) <= 24
    assert "progress" not in shown  # nothing reported: no line
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE job SET progress = 0.25, progress_message = 'reading' WHERE id = %s",
            (world.busy,),
        )
    text = ok(dsn, "jobs", "show", world.busy)
    assert fields(text)["progress"] == "25% reading"
    assert len(text.splitlines()) <= 24


def test_jobs_show_an_expired_lease_and_a_dead_job(dsn: str, world: Jobs) -> None:
    expired = fields(ok(dsn, "jobs", "show", world.expired))
    assert "expired: the reaper will make the job pending again" in expired["lease until"]

    assert fields(ok(dsn, "jobs", "show", world.report_ready))["queue"] == "reports, priority 5"
    text = ok(dsn, "jobs", "show", world.dead)
    shown = fields(text)
    assert shown["state"] == "dead" and shown["attempts"] == "5"
    assert shown["holder"] == "- (last held by web1:100/child-1)"
    assert shown["lease until"] == "-"
    lines = text.splitlines()
    assert lines[-2] == "  ValueError: bad address"  # a long error keeps its end
    assert f"more lines: brooq jobs show {world.dead} --json" in text
    assert len(lines) <= 24


def test_jobs_show_json(dsn: str, world: Jobs, queue: brooq.Queue) -> None:
    record = queue.get(world.ready)
    assert record is not None
    shown = as_json(dsn, "jobs", "show", world.ready)
    assert shown == record.to_dict()
    assert (shown["state"], shown["idempotency_key"]) == ("pending", "key-ready")
    assert (shown["queue"], shown["priority"]) == ("default", 0)
    report = as_json(dsn, "jobs", "show", world.report_ready)
    assert (report["queue"], report["priority"]) == ("reports", 5)


def test_jobs_show_unknown_and_malformed(dsn: str, world: Jobs) -> None:
    assert refused(dsn, "jobs", "show", MISSING, code=1) == f"error: no job with id {MISSING}"
    assert "not a UUID" in refused(dsn, "jobs", "show", "42", code=2)
    refused(dsn, "jobs", "show", code=2)


def test_show_lines_keep_a_long_payload_on_one_screen() -> None:
    now = datetime(2030, 1, 1, tzinfo=timezone.utc)
    record = brooq.JobRecord(
        id=uuid.UUID(int=1),
        topic="t",
        payload={"rows": list(range(100))},
        state="pending",
        attempts=0,
        available_at=now,
        locked_by=None,
        locked_until=None,
        last_error=None,
        idempotency_key=None,
        created_at=now - timedelta(minutes=3),
        updated_at=now,
    )
    lines = show_lines(record, now)
    shown = fields("\n".join(lines))
    assert shown["created"] == "2029-12-31 23:57:00 UTC (3.0m ago)"
    assert (shown["result"], shown["errors"], shown["last error"]) == ("-", "-", "-")
    assert lines[-1].startswith("  … 96 more lines") and len(lines) == 24
    assert lines[-9:-1] == ["  {", '    "rows": [', *[f"      {n}," for n in range(6)]]

    both = show_lines(dataclasses.replace(record, last_error=LONG_ERROR), now)
    assert len(both) == 24
    assert both[2] == "queue:           default, priority 0"
    assert both[13] == "last error:" and both[14].startswith("  … 27 more lines")
    assert both[-6:-3] == ["  ValueError: bad address", "payload:", "  {"]
    assert both[-1].startswith("  … 101 more lines")


def test_show_lines_print_the_result_and_the_error_history() -> None:
    now = datetime(2030, 1, 1, tzinfo=timezone.utc)
    history = [
        {
            "attempt": n,
            # as jsonb writes now(): a fraction of fewer than 6 digits included
            "at": f"2029-12-31T23:5{n}:00.{'12345'[:n]}+01:00",
            "error": f"ValueError: bad input on attempt {n}\nTraceback (most recent call last):",
            "worker": f"web1:100/child-{n}",
        }
        for n in range(1, 4)
    ]
    record = brooq.JobRecord(
        id=uuid.UUID(int=1),
        topic="t",
        payload={"n": 1},
        state="dead",
        attempts=3,
        available_at=now,
        locked_by="web1:100/child-3",
        locked_until=None,
        last_error="ValueError: bad input on attempt 3",
        idempotency_key=None,
        created_at=now,
        updated_at=now,
        result={"sent": 2},
        errors=history,
    )
    lines = show_lines(record, now)
    assert len(lines) <= 24
    assert fields("\n".join(lines))["result"] == '{"sent": 2}'
    at = lines.index("errors (3, oldest first):")
    assert lines[at + 1 : at + 4] == [
        f"  attempt {n}  2029-12-31 22:5{n}:00 UTC  web1:100/child-{n}  "
        f"ValueError: bad input on attempt {n}"
        for n in range(1, 4)
    ]
    assert lines[at + 4].startswith("last error:")

    # 20 entries, a long result and a long payload: the newest entries are kept
    many = [{**history[0], "attempt": n} for n in range(1, 21)]
    big = {"rows": list(range(50))}
    crowded = show_lines(dataclasses.replace(record, errors=many, result=big, payload=big), now)
    assert len(crowded) == 24
    at = crowded.index("errors (20, oldest first):")
    assert crowded[at + 1].startswith("  … 18 more lines: brooq jobs show")
    assert crowded[at + 2].startswith("  attempt 19  ")
    assert crowded[at + 3].startswith("  attempt 20  ")
    assert crowded[at + 4] == "last error:      ValueError: bad input on attempt 3"
    assert crowded.index("result:") == 10 and crowded[11] == "  {"  # no "available at": dead


# -- cancel and retry -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ready", "retrying", "busy"])
def test_cancel(dsn: str, world: Jobs, db: psycopg.Connection[Any], name: str) -> None:
    job_id = getattr(world, name)
    assert ok(dsn, "cancel", job_id).strip() == f"canceled {job_id}"
    assert state_of(db, job_id)[0] == "canceled"


@pytest.mark.parametrize("name", ["done", "dead", "canceled"])
def test_cancel_refused(dsn: str, world: Jobs, db: psycopg.Connection[Any], name: str) -> None:
    job_id = getattr(world, name)
    before = state_of(db, job_id)
    line = refused(dsn, "cancel", job_id, code=1)
    assert line == (
        f"error: cannot cancel job {job_id}: it is {before[0]}; "
        "only pending, failed, processing, waiting or on_hold jobs can be canceled"
    )
    assert state_of(db, job_id) == before


@pytest.mark.parametrize("name", ["dead", "canceled"])
def test_retry(dsn: str, world: Jobs, db: psycopg.Connection[Any], name: str) -> None:
    job_id = getattr(world, name)
    assert ok(dsn, "retry", job_id).strip() == f"retried {job_id}: pending now, attempts reset"
    assert state_of(db, job_id) == ("pending", 0)
    assert as_json(dsn, "jobs", "show", job_id)["locked_by"] is None


@pytest.mark.parametrize("name", ["ready", "busy", "done"])
def test_retry_refused(dsn: str, world: Jobs, db: psycopg.Connection[Any], name: str) -> None:
    job_id = getattr(world, name)
    before = state_of(db, job_id)
    line = refused(dsn, "retry", job_id, code=1)
    assert f"cannot retry job {job_id}: it is {before[0]}" in line
    assert line.endswith("only dead or canceled jobs can be retried")
    assert state_of(db, job_id) == before


def test_cancel_and_retry_unknown_or_malformed(dsn: str, world: Jobs) -> None:
    for command in ("cancel", "retry"):
        assert refused(dsn, command, MISSING, code=1) == f"error: no job with id {MISSING}"
        assert "not a UUID" in refused(dsn, command, "12345", code=2)
        assert "Missing argument" in refused(dsn, command, code=2)


# -- enqueue --------------------------------------------------------------------------------


def test_enqueue(dsn: str, queue: brooq.Queue) -> None:
    out = ok(dsn, "enqueue", "mail.send", "--payload", '{"to": "a@example.org"}', "--key", "k")
    verb, job_id = out.split()
    assert verb == "enqueued"
    record = queue.get(job_id)
    assert record is not None
    assert (record.topic, record.payload, record.idempotency_key, record.state) == (
        "mail.send",
        {"to": "a@example.org"},
        "k",
        "pending",
    )
    assert ok(dsn, "enqueue", "mail.send", "--key", "k").split() == ["exists", job_id]
    again = as_json(dsn, "enqueue", "mail.send", "--key", "k")
    assert again == {"id": job_id, "created": False}

    fresh = as_json(dsn, "enqueue", "plain")
    assert fresh["created"] is True
    plain = queue.get(fresh["id"])
    assert plain is not None and plain.payload is None


def test_enqueue_later(dsn: str, queue: brooq.Queue) -> None:
    before = datetime.now(timezone.utc)
    job_id = ok(dsn, "enqueue", "later", "--in", "5m").split()[1]
    record = queue.get(job_id)
    assert record is not None
    assert 299 <= (record.available_at - before).total_seconds() <= 310

    job_id = ok(dsn, "enqueue", "later", "--at", "2030-01-31T09:00:00+01:00").split()[1]
    record = queue.get(job_id)
    assert record is not None
    assert record.available_at == datetime(2030, 1, 31, 8, tzinfo=timezone.utc)
    job_id = ok(dsn, "enqueue", "later", "--at", "2030-01-31T09:00:00Z").split()[1]
    record = queue.get(job_id)
    assert record is not None
    assert record.available_at == datetime(2030, 1, 31, 9, tzinfo=timezone.utc)


def test_enqueue_refuses_bad_input(dsn: str, db: psycopg.Connection[Any]) -> None:
    assert "not JSON" in refused(dsn, "enqueue", "t", "--payload", "{nope", code=2)
    assert "not both" in refused(
        dsn, "enqueue", "t", "--at", "2030-01-01T00:00Z", "--in", "1m", code=2
    )
    assert "no time zone" in refused(dsn, "enqueue", "t", "--at", "2030-01-01T09:00", code=2)
    assert "ISO 8601" in refused(dsn, "enqueue", "t", "--at", "tomorrow", code=2)
    assert "no unit" in refused(dsn, "enqueue", "t", "--in", "300", code=2)
    assert "does not match" in refused(dsn, "enqueue", "Bad Topic", code=2)
    assert "Missing argument" in refused(dsn, "enqueue", code=2)
    row = db.execute("SELECT count(*) FROM job_all").fetchone()
    assert row == (0,)


def test_enqueue_with_a_queue_and_a_priority(dsn: str, queue: brooq.Queue) -> None:
    job_id = ok(dsn, "enqueue", "mail.send", "--queue", "bulk", "--priority", "7").split()[1]
    record = queue.get(job_id)
    assert record is not None and (record.queue, record.priority) == ("bulk", 7)
    low = as_json(dsn, "enqueue", "mail.send", "--queue", "bulk.low", "--priority", "-32768")
    record = queue.get(low["id"])
    assert record is not None and (record.queue, record.priority) == ("bulk.low", -32768)
    for text, value in (("+32767", 32767), (" 0012 ", 12), ("-0", 0)):
        record = queue.get(ok(dsn, "enqueue", "t", "--priority", text).split()[1])
        assert record is not None and record.priority == value
    plain = queue.get(ok(dsn, "enqueue", "mail.send").split()[1])
    assert plain is not None and (plain.queue, plain.priority) == ("default", 0)


# -- queues ---------------------------------------------------------------------------------


def test_queues_json(dsn: str, world: Jobs) -> None:
    listed = as_json(dsn, "queues")
    assert isinstance(listed, list)
    ages = [q.pop("oldest_ready_seconds") for q in listed]
    assert listed == [
        {
            "name": "default",
            "paused": False,
            "waiting": 0,
            "scheduled": 1,
            "ready": 2,  # ready, and the failed job due again
            "held": 0,
            "retrying": 0,
            "parked": 0,
            "on_hold": 0,
            "processing": 2,
            "dead": 1,
            "failed": 1,
            "blocked_keys": {"dead": 0, "retrying": 0},
            "limits": {},
        },
        {
            "name": "reports",
            "paused": False,
            "waiting": 0,
            "scheduled": 0,
            "ready": 1,
            "held": 0,
            "retrying": 0,
            "parked": 0,
            "on_hold": 0,
            "processing": 1,
            "dead": 0,
            "failed": 0,
            "blocked_keys": {"dead": 0, "retrying": 0},
            "limits": {},
        },
    ]
    assert 90 <= ages[0] < 120 and 10 <= ages[1] < 40


def test_queues_plain(dsn: str, world: Jobs) -> None:
    lines = ok(dsn, "queues").splitlines()
    assert lines[0].split() == [
        "QUEUE",
        "PAUSED",
        "WAITING",
        "SCHEDULED",
        "READY",
        "HELD",
        "RETRYING",
        "PARKED",
        "ON_HOLD",
        "PROCESSING",
        "DEAD",
        "OLDEST",
        "READY",
    ]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert rows["default"][:10] == ["no", "0", "1", "2", "0", "0", "0", "0", "2", "1"]
    assert rows["default"][10].endswith("m")  # 90 s and more
    assert rows["reports"][:10] == ["no", "0", "0", "1", "0", "0", "0", "0", "1", "0"]
    assert len(rows["reports"]) == 11  # then the age
    assert len(rows) == 2


def paused_rows(db: psycopg.Connection[Any]) -> list[tuple[str, bool]]:
    return [
        (name, paused)
        for name, paused in db.execute("SELECT name, paused FROM brooq_queue ORDER BY name")
    ]


def test_pause_a_queue_before_any_job_then_resume_it(dsn: str, db: psycopg.Connection[Any]) -> None:
    assert as_json(dsn, "queues") == []
    assert ok(dsn, "queues").strip() == "(no queues: no unfinished or dead jobs, none paused)"
    out = ok(dsn, "queues", "pause", "bulk").strip()
    assert out == (
        "paused queue bulk: no new claims within poll_interval, running jobs finish "
        "(0 ready, 0 processing)"
    )
    assert paused_rows(db) == [("bulk", True)]
    idle = {
        "name": "bulk",
        "paused": True,
        "waiting": 0,
        "scheduled": 0,
        "ready": 0,
        "held": 0,
        "retrying": 0,
        "parked": 0,
        "on_hold": 0,
        "processing": 0,
        "dead": 0,
        "oldest_ready_seconds": 0.0,
        "failed": 0,
        "blocked_keys": {"dead": 0, "retrying": 0},
        "limits": {},
    }
    assert as_json(dsn, "queues") == [idle]
    assert ok(dsn, "queues").splitlines()[1].split() == ["bulk", "yes", *["0"] * 9, "-"]
    assert ok(dsn, "queues", "pause", "bulk").startswith("paused queue bulk")  # again: fine
    assert paused_rows(db) == [("bulk", True)]

    assert (
        ok(dsn, "queues", "resume", "bulk").strip() == "resumed queue bulk: claims go on (0 ready)"
    )
    assert paused_rows(db) == [("bulk", False)]
    assert as_json(dsn, "queues") == [{**idle, "paused": False}]  # still listed: it has a row
    assert db.execute("SELECT count(*) FROM job_all").fetchone() == (0,)  # no job was made


def test_pause_a_queue_that_has_jobs(dsn: str, world: Jobs, db: psycopg.Connection[Any]) -> None:
    out = ok(dsn, "queues", "pause", "reports").strip()
    assert out.endswith("running jobs finish (1 ready, 1 processing)"), out
    listed = {q["name"]: q for q in as_json(dsn, "queues")}
    assert (listed["reports"]["paused"], listed["default"]["paused"]) == (True, False)
    assert listed["reports"]["ready"] == 1  # a pause keeps the jobs; it stops claims
    assert state_of(db, world.report_busy) == ("processing", 1)  # the running job is left alone
    rows = {line.split()[0]: line.split()[1] for line in ok(dsn, "queues").splitlines()[1:]}
    assert rows == {"default": "no", "reports": "yes"}
    assert ok(dsn, "queues", "resume", "reports").strip().endswith("(1 ready)")
    assert paused_rows(db) == [("reports", False)]


def test_queues_refuse_bad_names_and_write_nothing(dsn: str, db: psycopg.Connection[Any]) -> None:
    for command in ("pause", "resume"):
        for name in ("Bad Name", "UPPER", "a..b", "x-", "q" * 129, ""):
            line = refused(dsn, "queues", command, name, code=2)
            assert "NAME" in line, line
        assert "Missing argument 'NAME'" in refused(dsn, "queues", command, code=2)
    assert "does not match" in refused(dsn, "queues", "pause", "Bad Name", code=2)
    assert "--json" in refused(dsn, "queues", "--json", "pause", "bulk", code=2)
    assert "No such command" in refused(dsn, "queues", "stop", "bulk", code=2)
    assert paused_rows(db) == []


# -- the database, and errors ---------------------------------------------------------------


def test_database_from_the_environment(dsn: str, world: Jobs, tmp_path: Path) -> None:
    def topics(env: dict[str, str]) -> list[str]:
        out = run("stats", "--json", env=env)
        assert out.returncode == 0, out.stderr
        return [t["topic"] for t in json.loads(out.stdout)["topics"]]

    assert topics({"DATABASE_URL": dsn}) == ["mail", "report"]
    (tmp_path / "url").write_text(dsn + "\n")
    assert topics({"DATABASE_URL": "", "DATABASE_URL_FILE": str(tmp_path / "url")}) == [
        "mail",
        "report",
    ]
    (tmp_path / "creds").mkdir()
    (tmp_path / "creds" / "database-url").write_text(dsn)
    assert topics({"CREDENTIALS_DIRECTORY": str(tmp_path / "creds")}) == ["mail", "report"]
    # --database wins over the environment
    out = run(
        "--database", dsn, "stats", "--json", env={"DATABASE_URL": "postgresql://x@127.0.0.1:1/x"}
    )
    assert out.returncode == 0, out.stderr


def test_no_database_configured() -> None:
    out = run("stats")
    assert out.returncode == 2
    assert out.stderr.startswith("error: no database configured") and "--database" in out.stderr
    assert "dsn=" not in out.stderr  # a command's user is not told of Python arguments
    assert len(out.stderr.splitlines()) == 1


def test_a_queue_without_a_database_names_its_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    import brooq
    from brooq.errors import InvalidDsn

    for name in ("DATABASE_URL", "DATABASE_URL_FILE", "CREDENTIALS_DIRECTORY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(InvalidDsn, match=r"brooq\.Queue\(dsn=\.\.\.\)") as info:
        _ = brooq.Queue().dsn
    assert "--database" not in str(info.value)


def test_unreachable_database_is_one_line_without_the_password() -> None:
    started = time.monotonic()
    out = run("--database", "postgresql://ops:s3cret@127.0.0.1:1/queue", "jobs", "list")
    assert out.returncode == 1
    assert out.stderr.startswith("error: cannot reach the database ops@127.0.0.1:1/queue")
    assert len(out.stderr.splitlines()) == 1 and "s3cret" not in out.stderr
    assert time.monotonic() - started < 5  # refused at once, not after pool retries


def test_schema_missing(empty_dsn: str) -> None:
    line = refused(empty_dsn, "stats", code=1)
    assert "brooq migrate up" in line


def test_unknown_command_and_option_are_one_line(dsn: str) -> None:
    assert "No such command 'nope'" in refused(dsn, "nope", code=2)
    line = refused(dsn, "jobs", "list", "--limt", "3", code=2)
    assert "No such option '--limt'" in line and "brooq jobs list --help" in line


# -- top ------------------------------------------------------------------------------------


def test_top_once(dsn: str, world: Jobs) -> None:
    lines = ok(dsn, "top", "--once").splitlines()
    assert lines[0].startswith("brooq top") and lines[0].endswith("(q quits)")
    assert lines[2].split() == [
        "QUEUE",
        "TOPIC",
        "WAITING",
        "SCHEDULED",
        "READY",
        "HELD",
        "RETRYING",
        "PARKED",
        "ON_HOLD",
        "PROCESSING",
        "DEAD",
        "FINISHED/60S",
        "OLDEST",
        "READY",
    ]
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in lines[3:5]}
    assert rows[("default", "mail")][:10] == ["0", "1", "2", "0", "0", "0", "0", "2", "1", "3"]
    assert rows[("reports", "report")][:10] == ["0", "0", "1", "0", "0", "0", "0", "1", "0", "1"]
    assert "IN FLIGHT  3 processing, 1 lease expired" in lines
    flying = lines[lines.index("IN FLIGHT  3 processing, 1 lease expired") + 2 :]
    assert [line.split()[:4] for line in flying] == [
        [world.expired, "mail", "1", "web1:100/child-2"],
        [world.busy, "mail", "2", "web1:100/child-1"],
        [world.report_busy, "report", "1", "web2:7/child-4"],
    ]
    assert flying[0].split()[-3] == "expired"  # then its age, then PROGRESS
    assert [line.split()[-1] for line in flying] == ["-", "-", "-"]  # no progress reported


def test_top_shows_a_running_jobs_progress(dsn: str, world: Jobs) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE job SET progress = 0.4, progress_message = 'resizing 3 of 8' WHERE id = %s",
            (world.busy,),
        )
    lines = ok(dsn, "top", "--once").splitlines()
    (row,) = [line for line in lines if line.startswith(str(world.busy))]
    assert row.endswith("40% resizing 3 of 8")
    (flying,) = [j for j in as_json(dsn, "top")["in_flight"] if j["id"] == str(world.busy)]
    assert (flying["progress"], flying["progress_message"]) == (0.4, "resizing 3 of 8")


def test_top_json(dsn: str, world: Jobs) -> None:
    snap = as_json(dsn, "top")
    assert snap["window_seconds"] == 60
    assert [
        (t["queue"], t["topic"], t["ready"], t["processing"], t["busy"], t["finished_in_window"])
        for t in snap["topics"]
    ] == [
        ("default", "mail", 2, 2, 1, 3),
        ("reports", "report", 1, 1, 1, 1),
    ]
    assert [(j["id"], j["locked_by"]) for j in snap["in_flight"]] == [
        (world.expired, "web1:100/child-2"),
        (world.busy, "web1:100/child-1"),
        (world.report_busy, "web2:7/child-4"),
    ]
    assert (
        snap["in_flight"][0]["lease_left_seconds"] < 0 < snap["in_flight"][1]["lease_left_seconds"]
    )


def test_top_counts_the_jobs_each_child_holds(
    dsn: str, queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    """CHILDREN: one row per holder of processing jobs, busiest first, with how long its
    oldest job has run; other states (a done row keeps its last holder) are not counted."""
    ids = [queue.enqueue(brooq.Job("render", {"n": n}))[0] for n in range(6)]
    holds = [  # job, holder, claimed this long ago
        (0, "app1:10/child-2", "40 s"),  # an async child: three at once
        (1, "app1:10/child-2", "7 s"),
        (2, "app1:10/child-2", "2 s"),
        (3, "app2:20/child-1", "90 s"),
    ]
    for n, holder, ago in holds:
        db.execute(
            "UPDATE job SET state = 'processing', locked_by = %s, "
            "locked_until = now() + interval '1 min', updated_at = now() - %s::interval "
            "WHERE id = %s",
            (holder, ago, ids[n]),
        )
    db.execute(  # finished, its last lease kept
        "UPDATE job SET state = 'done', locked_by = 'app3:30/child-1' WHERE id = %s", (ids[4],)
    )

    lines = ok(dsn, "top", "--once").splitlines()
    start = lines.index("CHILDREN  2 holding jobs")
    assert lines[start + 1].split() == ["HOLDER", "PROCESSING", "LONGEST"]
    rows = [line.split() for line in lines[start + 2 : start + 4]]
    assert [row[:2] for row in rows] == [["app1:10/child-2", "3"], ["app2:20/child-1", "1"]]
    assert rows[0][2].endswith("s") and 40 <= float(rows[0][2][:-1]) < 70  # the oldest of 3
    assert rows[1][2].endswith("m") and 1.5 <= float(rows[1][2][:-1]) < 2.5
    assert lines[start + 4] == "" and lines[start + 5] == "IN FLIGHT  4 processing"

    children = as_json(dsn, "top")["children"]
    assert [(c["locked_by"], c["processing"]) for c in children] == [
        ("app1:10/child-2", 3),
        ("app2:20/child-1", 1),
    ]
    assert 40 <= children[0]["oldest_running_seconds"] < 70
    assert 90 <= children[1]["oldest_running_seconds"] < 120

    [busiest] = queue.processing_by_holder(limit=1)  # the LIMIT keeps the busiest
    assert (busiest.locked_by, busiest.processing) == ("app1:10/child-2", 3)
    with pytest.raises(brooq.BrooqError, match="limit must be between 1 and 1000"):
        queue.processing_by_holder(limit=0)


def test_top_has_no_children_block_when_nothing_runs(dsn: str, queue: brooq.Queue) -> None:
    queue.enqueue(brooq.Job("render"))
    lines = ok(dsn, "top", "--once").splitlines()
    assert not any(line.startswith("CHILDREN") for line in lines)
    assert lines[-1] == "IN FLIGHT  0 processing"
    assert as_json(dsn, "top")["children"] == []


def test_top_needs_a_terminal_and_a_sane_interval(dsn: str) -> None:
    assert "--once" in refused(dsn, "top", code=2)
    assert "too short" in refused(dsn, "top", "--interval", "10ms", code=2)
    assert "no unit" in refused(dsn, "top", "--interval", "1", code=2)


class Terminal:
    """`brooq top` on the slave side of a pseudo-terminal, as over SSH."""

    def __init__(self, *args: str, rows: int = 40, columns: int = 140) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        self.before = termios.tcgetattr(slave)
        self.slave = slave
        env = {k: v for k, v in os.environ.items() if not k.startswith("DATABASE_URL")}
        env.update(PYTHONPATH=str(ROOT), TERM="xterm", LINES=str(rows), COLUMNS=str(columns))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "brooq", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
        self.screen = b""

    def read_until(self, *needles: bytes, timeout: float = 20) -> bytes:
        deadline = time.monotonic() + timeout
        while not all(n in self.screen for n in needles):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"not shown within {timeout}s: {needles!r}\n{self.screen!r}")
            if select.select([self.master], [], [], left)[0]:
                try:
                    self.screen += os.read(self.master, 65536)
                except OSError:  # the child closed the terminal
                    break
        return self.screen

    def wait_frames(self, count: int, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while self.screen.count(b"\x1b[H") < count:
            assert time.monotonic() < deadline, f"fewer than {count} frames: {self.screen!r}"
            if select.select([self.master], [], [], 0.5)[0]:
                self.screen += os.read(self.master, 65536)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)
        os.close(self.slave)


def test_top_live_in_a_terminal_quits_on_q(dsn: str, world: Jobs) -> None:
    term = Terminal("--database", dsn, "top", "--interval", "200ms")
    try:
        screen = term.read_until(
            b"brooq top",
            b"IN FLIGHT  3 processing, 1 lease expired",
            world.report_busy.encode(),
            b"web2:7/child-4",
        )
        assert b"\x1b[?1049h" in screen  # the alternate screen
        term.wait_frames(screen.count(b"\x1b[H") + 2)  # and it refreshes
        os.write(term.master, b"q")
        assert term.proc.wait(timeout=10) == 0
        term.read_until(b"\x1b[?1049l", timeout=5)  # the screen is given back
        assert termios.tcgetattr(term.slave) == term.before  # cbreak undone
    finally:
        term.close()


def test_top_live_stops_on_ctrl_c(dsn: str, world: Jobs) -> None:
    term = Terminal("--database", dsn, "top")
    try:
        term.read_until(b"web1:100/child-1")
        term.proc.send_signal(2)
        assert term.proc.wait(timeout=10) == 0
        assert termios.tcgetattr(term.slave) == term.before
    finally:
        term.close()


# -- top rendering, without a database ------------------------------------------------------


def snapshot(in_flight: int, processing: int | None = None) -> top.Snapshot:
    now = datetime(2030, 1, 1, 12, tzinfo=timezone.utc)
    jobs = [
        InFlight(
            id=uuid.UUID(int=n),
            topic="render",
            attempts=1,
            locked_by=f"host:1/child-{n}",
            locked_until=now,
            running_for=float(n),
            lease_left=10.0,
        )
        for n in range(in_flight)
    ]
    stats = TopicStats(
        topic="render", processing=in_flight if processing is None else processing, busy=in_flight
    )
    return top.Snapshot(
        taken_at=now,
        database="db",
        topics=[stats],
        finished={("default", "render"): 4, ("default", "gone"): 2, ("bulk", "render"): 1},
        in_flight=jobs,
    )


def test_render_lists_topics_that_only_finished_jobs() -> None:
    lines = top.render(snapshot(0))
    assert lines[3:6] == [  # by queue, then topic
        "bulk     render        0          0      0     0         0       0        0           0"
        "     0             1             -",
        "default  gone          0          0      0     0         0       0        0           0"
        "     0             2             -",
        "default  render        0          0      0     0         0       0        0           0"
        "     0             4             -",
    ]
    assert lines[-1] == "IN FLIGHT  0 processing"
    expired = top.render(
        dataclasses.replace(snapshot(0), topics=[TopicStats("render", processing=3, busy=1)])
    )
    assert "IN FLIGHT  3 processing, 2 leases expired" in expired  # the reaper gives them back


def test_render_fits_the_terminal() -> None:
    lines = top.render(snapshot(50), width=40, height=20)
    assert len(lines) == 20 and all(len(line) <= 40 for line in lines)
    assert lines[-1] == "… 40 more in flight"
    assert lines[-2] == str(uuid.UUID(int=9)) + "  re"  # cut at 40 columns

    everything = top.render(snapshot(50, processing=300))
    assert everything[-1] == "… 250 more in flight"  # beyond what was read


def test_render_cuts_the_children_after_the_jobs_in_flight() -> None:
    holders = [HolderStats(f"host:1/child-{n}", 10 - n, 60.0 * n + 3) for n in range(6)]
    snap = dataclasses.replace(snapshot(5), children=holders)
    whole = top.render(snap)
    start = whole.index("CHILDREN  6 holding jobs")
    assert whole[start + 1 : start + 3] == [
        "HOLDER          PROCESSING  LONGEST",
        "host:1/child-0          10     3.0s",
    ]
    assert whole[start + 8] == "" and whole[start + 9].startswith("IN FLIGHT")

    # 18 lines: every holder, no job in flight but the line saying how many are hidden.
    tall = top.render(snap, height=18)
    assert tall[start : start + 8] == whole[start : start + 8]
    assert tall[-2:] == ["IN FLIGHT  5 processing", "… 5 more in flight"]
    # 14 lines: the holders give way too, with their own line.
    short = top.render(snap, height=14)
    assert short[start:] == [
        "CHILDREN  6 holding jobs",
        "HOLDER          PROCESSING  LONGEST",
        "host:1/child-0          10     3.0s",
        "… 5 more holders",
        "",
        "IN FLIGHT  5 processing",
        "… 5 more in flight",
    ]

    read_to_the_limit = [HolderStats(f"h:{n}/child-1", 1, 1.0) for n in range(top.CHILDREN_LIMIT)]
    many = top.render(dataclasses.replace(snap, children=read_to_the_limit))
    assert f"CHILDREN  {top.CHILDREN_LIMIT} or more holding jobs" in many


def test_render_shows_a_read_error() -> None:
    lines = top.render(snapshot(1), error="cannot reach the database db")
    assert lines[1] == "! cannot reach the database db (showing the last good read)"


def test_run_shows_a_failed_read_and_gives_the_screen_back() -> None:
    reads: list[top.Snapshot | BaseException] = [
        snapshot(1),
        brooq.DatabaseUnavailable("cannot reach the database db: gone"),
        KeyboardInterrupt(),
    ]

    def take() -> top.Snapshot:
        value = reads.pop(0)
        if isinstance(value, BaseException):
            raise value
        return value

    out = io.StringIO()
    top.run(take, interval=0.01, out=out, stdin=io.StringIO())
    screen = out.getvalue()
    assert screen.startswith("\x1b[?1049h") and screen.endswith("\x1b[?25h\x1b[?1049l")
    frames = screen.split("\x1b[H")[1:]
    assert len(frames) == 2 and reads == []
    assert "! cannot reach the database db: gone (showing the last good read)" in frames[1]
    assert "host:1/child-0" in frames[1]  # the last good read is still drawn
