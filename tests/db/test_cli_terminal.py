"""Text from jobs and masters carrying terminal escapes (ESC sequences, OSC 52, CR, C1
controls, bidi overrides), printed by the `brooq` commands as a subprocess: nothing of it
reaches the terminal raw; --json keeps it whole."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import psycopg
import pytest

from brooq.cli.terminal import one_line, visible
from tests.db.test_cli import Jobs, ok, world  # noqa: F401  (a fixture)

# Window title, clear screen, a clipboard write (OSC 52), CR over the line, a C1 CSI,
# a bidi override, a status query, DEL.
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b]52;c;cHduZWQ=\x07\roops\x9b31m\u202eevil\x1b[6n\x7f"
# What a terminal may act on: C0 controls but newline, DEL, C1, bidi marks and overrides.
RAW = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
LAST_ERROR = "Traceback (most recent call last):\nValueError: " + HOSTILE


def _no_raw(text: str) -> None:
    found = RAW.search(text)
    assert found is None, f"raw {found.group(0)!r} at {found.start()}: {text!r}"


@pytest.fixture
def hostile(world: Jobs, db: psycopg.Connection[Any]) -> Jobs:  # noqa: F811
    """The dead and the busy job say HOSTILE everywhere a job's text shows; a master row
    with it for a host."""
    history = [{"attempt": 1, "at": "2030-01-01T00:00:00+00:00", "worker": "w" + HOSTILE,
                "error": "E: " + HOSTILE}]  # fmt: skip
    logs = [{"attempt": 1, "at": "2030-01-01T00:00:00+00:00", "text": "line " + HOSTILE}]
    db.execute(  # finished: in job_history
        "UPDATE job_history SET last_error = %s, errors = %s, logs = %s WHERE id = %s",
        (LAST_ERROR, json.dumps(history), json.dumps(logs), world.dead),
    )
    db.execute(
        "UPDATE job SET locked_by = %s, progress = 0.5, progress_message = %s WHERE id = %s",
        ("web1" + HOSTILE, "step " + HOSTILE, world.busy),
    )
    db.execute(
        "INSERT INTO brooq_master (id, host, pid, version, app, queues, topics, children,"
        " beat_seconds, started_at) VALUES (%s, %s, 1, %s, %s, %s, %s, %s, 10, now())",
        (uuid.uuid4(), "h" + HOSTILE, "v" + HOSTILE, "a" + HOSTILE, ["q" + HOSTILE],
         ["mail", "t" + HOSTILE], json.dumps([{"pid": 2, "kind": HOSTILE, "generation": 1}])),
    )  # fmt: skip
    return world


@pytest.mark.parametrize(
    "command",
    [
        ["jobs", "list"],
        ["jobs", "show", "{dead}"],
        ["jobs", "show", "{busy}"],
        ["jobs", "logs", "{dead}"],
        ["top", "--once"],
        ["fleet"],
        ["stats"],
        ["queues"],
    ],
)
def test_job_text_reaches_the_terminal_shown_not_acted_on(
    dsn: str, hostile: Jobs, command: list[str]
) -> None:
    args = [word.format(dead=hostile.dead, busy=hostile.busy) for word in command]
    out = ok(dsn, *args)
    _no_raw(out)
    assert "^[" in out or command[0] in ("stats", "queues")  # shown, as text


def test_json_keeps_the_text_whole(dsn: str, hostile: Jobs) -> None:
    shown = json.loads(ok(dsn, "jobs", "show", hostile.dead, "--json"))
    assert shown["last_error"] == LAST_ERROR


def test_visible_shows_what_a_terminal_would_act_on() -> None:
    assert visible("a\x1b[2Jb\tc\nd\r\x7f\x9b\u202e") == "a^[[2Jb\tc\nd^M^?<U+009B><U+202E>"
    assert one_line("a\nb\tc") == "a^Jb^Ic"
    assert visible("plain text, é, 漢字") == "plain text, é, 漢字"
