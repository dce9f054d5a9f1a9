"""Stored schedules on the status page, against a real PostgreSQL: /schedules lists them
(when, the job of a tick, paused or the next tick, the last tick and its job linked),
signed in each row carries pause or resume, run now and remove, and the page's actions
(brooq.page.actions, as the page process answers them) do each through
brooq.operator.schedules, refusals worded as for the CLI."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import brooq
from brooq.page import signin
from brooq.page.actions import Actions
from brooq.page.routes import serve
from tests.db.test_page import ESCAPED, HOSTILE, get, text
from tests.db.test_page_hold import CSRF, TOKEN, Request, post

Conn = psycopg.Connection[Any]


@pytest.fixture
def db(connect: Callable[..., Conn]) -> Conn:
    return connect()


def rows(body: str) -> dict[str, list[str]]:
    """The schedules table's rows by name: each row's cells, as HTML."""
    found = {}
    for row in re.findall(r"<tr>(<td>.*?)</tr>", body):
        cells = re.findall(r"<td>(.*?)</td>", row)
        found[cells[0]] = cells
    return found


def buttons(body: str) -> list[tuple[str, str]]:
    """(schedule as written in the form's action, action) of the one-click buttons."""
    return re.findall(r'<form class="inline" method="post" action="/schedules/(.+?)/(\w+)"', body)


def test_the_schedules_page_lists_the_stored_schedules(queue: brooq.Queue, db: Conn) -> None:
    queue.add_schedule("nightly", "report.build", {"kind": "daily"}, cron="0 3 * * *",
                       tz="Europe/Paris", queue="low")  # fmt: skip
    queue.add_schedule("heartbeat", "ping", every="30s")
    queue.add_schedule("weekly", "report.render", every="7d", paused=True)
    job_id = uuid.uuid4()
    db.execute(
        "INSERT INTO brooq_periodic (name, last_tick, last_job) "
        "VALUES ('heartbeat', '2026-12-01T10:00:00Z', %s)",
        [job_id],
    )
    response = get(db, "/schedules")
    assert response.status == 200
    body = text(response)
    assert "<h1>Schedules</h1>" in body and 'href="/schedules"' in body  # in the nav
    headers = re.findall(r"<th>([^<]*)</th>", body)
    assert headers == ["name", "schedule", "tz", "topic", "payload", "queue", "next tick",
                       "last tick", "last job", ""]  # fmt: skip
    table = rows(body)
    assert list(table) == ["heartbeat", "nightly", "weekly"]  # by name
    nightly = table["nightly"]
    payload = "<code>{&quot;kind&quot;: &quot;daily&quot;}</code>"
    assert nightly[1:6] == ["<code>0 3 * * *</code>", "Europe/Paris", "report.build", payload,
                            "low"]  # fmt: skip
    assert re.fullmatch(r"\d{4}-\d\d-\d\d 0[12]:00:00\+00:00", nightly[6]), nightly[6]
    assert nightly[7:9] == ["—", "—"]  # never ticked
    heartbeat = table["heartbeat"]
    assert heartbeat[1] == "<code>every 30s</code>" and heartbeat[5] == "—"
    assert heartbeat[7] == "2026-12-01 10:00:00+00:00"
    assert heartbeat[8] == f'<a href="/jobs/{job_id}">{job_id}</a>'
    assert table["weekly"][6] == "<strong>paused</strong>"
    # Actions off: no buttons; on but signed out: the way to sign in; signed in: a row's
    # buttons, pause or resume as it stands.
    assert not buttons(body) and "sign in…" not in body
    signed_out = text(serve(db, "GET", "/schedules", actions_enabled=True))
    assert not buttons(signed_out) and 'href="/sign-in">sign in…</a>' in signed_out
    signed = text(serve(db, "GET", "/schedules", actions_enabled=True, csrf=CSRF))
    assert buttons(signed) == [
        ("heartbeat", "pause"), ("heartbeat", "run"), ("heartbeat", "remove"),
        ("nightly", "pause"), ("nightly", "run"), ("nightly", "remove"),
        ("weekly", "resume"), ("weekly", "run"), ("weekly", "remove"),
    ]  # fmt: skip
    assert '<input type="hidden" name="back" value="/schedules">' in signed
    assert get(db, "/schedules", method="POST").status == 405
    assert get(db, "/schedules/nightly").status == 404


def test_an_empty_list_and_a_row_the_masters_refuse(db: Conn) -> None:
    assert "none</td>" in text(get(db, "/schedules"))
    # Written by hand: a time zone no master knows. Listed, saying it never ticks.
    db.execute(
        "INSERT INTO brooq_schedule (name, every_seconds, tz, topic) "
        "VALUES ('odd', 60, 'Mars/Olympus', 'ping')"
    )
    cells = rows(text(get(db, "/schedules")))["odd"]
    assert cells[6].startswith('<span class="muted">never: ') and "Mars/Olympus" in cells[6]


def test_hostile_names_and_payloads_are_shown_as_text(db: Conn) -> None:
    db.execute(
        "INSERT INTO brooq_schedule (name, every_seconds, topic, payload) "
        "VALUES (%s, 60, 'ping', %s)",
        [HOSTILE, psycopg.types.json.Jsonb({"html": HOSTILE})],
    )
    db.execute(
        "INSERT INTO brooq_schedule (name, cron, tz, topic) VALUES ('cronny', %s, %s, 'ping')",
        [HOSTILE, HOSTILE],
    )
    for csrf in (None, CSRF):
        body = text(serve(db, "GET", "/schedules", actions_enabled=True, csrf=csrf))
        assert "<script>" not in body and "alert(1)</script>" not in body
        assert ESCAPED in body
    # The buttons' action names the schedule percent-encoded, then escaped.
    assert 'action="/schedules/%3Cscript%3Ealert%281%29%3C/script%3E%22%27%26/pause"' in body


def state(db: Conn, name: str) -> bool | None:
    row = db.execute("SELECT paused FROM brooq_schedule WHERE name = %s", [name]).fetchone()
    return None if row is None else bool(row["paused"])


def test_pause_resume_run_and_remove_through_the_page_actions(
    dsn: str, queue: brooq.Queue, db: Conn
) -> None:
    actions = Actions(dsn, TOKEN)
    queue.add_schedule("nightly", "report.build", {"kind": "daily"}, cron="0 3 * * *",
                       queue="low", priority=5)  # fmt: skip
    status, answer = post(actions, "/schedules/nightly/pause", "back=/schedules")
    assert status == 303 and b"Location: /schedules\r\n" in answer
    assert state(db, "nightly") is True
    assert "<strong>paused</strong>" in rows(text(get(db, "/schedules")))["nightly"][6]
    status, answer = post(actions, "/schedules/nightly/resume")  # no back: the list
    assert status == 303 and b"Location: /schedules\r\n" in answer
    assert state(db, "nightly") is False
    # Run now: the schedule's job, at once, and its page.
    status, answer = post(actions, "/schedules/nightly/run", "back=/schedules")
    found = re.search(rb"Location: /jobs/([0-9a-f-]{36})\r\n", answer)
    assert status == 303 and found is not None, answer
    job = db.execute(
        "SELECT topic, payload, queue, priority, state FROM job WHERE id = %s",
        [uuid.UUID(found.group(1).decode())],
    ).fetchone()
    assert job is not None
    assert (job["topic"], job["payload"], job["queue"], job["priority"], job["state"]) == (
        "report.build", {"kind": "daily"}, "low", 5, "pending",
    )  # fmt: skip
    status, answer = post(actions, "/schedules/nightly/remove", "back=/schedules")
    assert status == 303 and state(db, "nightly") is None
    # Refusals, worded as for the CLI: no such schedule.
    for action in ("pause", "resume", "run", "remove"):
        status, answer = post(actions, f"/schedules/nightly/{action}")
        assert status == 409, action
        assert "no stored schedule named &#x27;nightly&#x27;" in answer.decode(), action
    # A name that is no topic (written by hand) travels percent-encoded, and back: the
    # masters refuse such a row, so a pause is refused as `brooq periodic pause` refuses
    # it, saying why; a removal takes it.
    db.execute(
        "INSERT INTO brooq_schedule (name, every_seconds, topic) VALUES ('a b/c?d%', 60, 'ping')"
    )
    status, answer = post(actions, "/schedules/a%20b/c%3Fd%25/pause")
    assert status == 409 and b"does not match" in answer and state(db, "a b/c?d%") is False
    assert post(actions, "/schedules/a%20b/c%3Fd%25/remove")[0] == 303
    assert state(db, "a b/c?d%") is None
    # A row the masters refuse cannot be changed here either (as brooq periodic change).
    db.execute(
        "INSERT INTO brooq_schedule (name, every_seconds, tz, topic) "
        "VALUES ('odd', 60, 'Mars/Olympus', 'ping')"
    )
    status, answer = post(actions, "/schedules/odd/pause")
    assert status == 409 and b"Mars/Olympus" in answer and state(db, "odd") is False
    # Without the form's CSRF token: refused, nothing changes.
    _, cookie = signin.new_session(TOKEN, time.time())
    refused = actions.answer(Request("POST", "/schedules/odd/remove", cookie), b"")
    assert b" 403 " in refused.split(b"\r\n", 1)[0] and state(db, "odd") is False
    # A back to another site is ignored: the list instead.
    queue.add_schedule("heartbeat", "ping", every="30s")
    status, answer = post(actions, "/schedules/heartbeat/pause", "back=//evil.example/")
    assert status == 303 and b"Location: /schedules\r\n" in answer
    # A GET changes nothing.
    answer = actions.answer(Request("GET", "/schedules/odd/remove", cookie), b"")
    assert b" 405 " in answer.split(b"\r\n", 1)[0] and state(db, "odd") is False
