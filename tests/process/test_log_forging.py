"""A job's text cannot forge a record in brooq-master's log: an error text (and so the
traceback of event=job_dead) or a handler's log message holding a newline and a line of
its own stays inside its record's line, key=value and JSON alike."""

from __future__ import annotations

import json
import re
from typing import Any

import psycopg
import pytest

import brooq
from tests.harness import StartMaster, wait_for

APP = "brooq_forgeapp:queue"
FORGED = "ts=2030-01-01T00:00:00Z level=error logger=brooq.master pid=1 event=master_fatal"
ERROR = f"x\n{FORGED}\r{FORGED}\x1b[2J\x85{FORGED}\u2028{FORGED}"
# The start of a record: its time (or, under systemd, its level) first.
RECORD = re.compile(r"^(time=\S+ )?level=\w+ logger=\S+ pid=")


def _settled(db: psycopg.Connection[Any]) -> bool:
    row = db.execute("SELECT count(*) FROM job_all WHERE state IN ('dead', 'done')").fetchone()
    return row is not None and row[0] == 2


@pytest.mark.parametrize("fmt", ["kv", "json"])
def test_a_job_text_stays_inside_its_record(
    start_master: StartMaster, queue: brooq.Queue, db: psycopg.Connection[Any], fmt: str
) -> None:
    queue.enqueue(brooq.Job("f.dead", {"error": ERROR}))
    queue.enqueue(brooq.Job("f.logs", {"error": ERROR}))
    m = start_master(workers=1, app=APP, args=("--log-format", fmt))
    wait_for(lambda: _settled(db), what="both jobs settled")
    wait_for(lambda: "myapp.forge" in m.log() and "job_dead" in m.log(), what="their lines")
    m.stop()
    log = m.log()
    # Every way a reader may split lines: none starts with the forged text.
    for line in log.splitlines():
        assert "master_fatal" not in line.split(" ", 1)[0], line
        assert not line.startswith(("ts=", "x")), line
        if "master_fatal" in line:
            if fmt == "json":
                record = json.loads(line)
                assert record["logger"] in ("brooq.child", "brooq.worker", "myapp.forge")
            else:
                assert RECORD.match(line), line
                assert "event=job_dead" in line or "logger=myapp.forge" in line, line
    assert "\x1b" not in log and "\x85" not in log and "\u2028" not in log
    forged = [line for line in log.splitlines() if "master_fatal" in line]
    assert len(forged) == 2, forged  # the dead job's line, the handler's line
