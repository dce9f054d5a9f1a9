"""After SIGHUP the master acts on the reloaded application's handler options: the
failed attempt it writes for a child killed in a job (max_execution_timeout) is dead or
retried under the new max_attempts, a handler added by the reload included, and its row
in brooq_master (`brooq fleet`) names the new topics and queues."""

from __future__ import annotations

import os
import signal
import textwrap
import time
from pathlib import Path
from typing import Any

import psycopg

import brooq
from tests.db.test_cli import as_json
from tests.harness import StartMaster, wait_for

HANG = """
@queue.handler({topic!r}, max_attempts={attempts}, attempt_timeout="300ms",
               max_execution_timeout="800ms", backoff_base="20ms", backoff_max="50ms"{queue})
def {name}(claim):
    while True:  # past every limit: only the master's kill ends it
        try:
            time.sleep(0.05)
        except BaseException:
            continue
"""


def write_app(path: Path, handlers: list[tuple[str, int, str | None]]) -> None:
    body = "import time, brooq\nqueue = brooq.Queue()\n"
    for i, (topic, attempts, queue) in enumerate(handlers):
        extra = f", queue={queue!r}" if queue else ""
        body += HANG.format(topic=topic, attempts=attempts, queue=extra, name=f"h{i}")
    path.write_text(textwrap.dedent(body))
    bump = time.time() + 2 * len(handlers)  # defeat the .pyc's mtime check
    os.utime(path, (bump, bump))


def row(db: psycopg.Connection[Any], job_id: object) -> tuple[Any, ...]:
    found = db.execute("SELECT state, attempts FROM job_all WHERE id = %s", (job_id,)).fetchone()
    assert found is not None
    return tuple(found)


def fleet_row(dsn: str, pid: int) -> dict[str, Any] | None:
    return next((m for m in as_json(dsn, "fleet")["masters"] if m["pid"] == pid), None)


def test_a_reload_gives_the_master_the_new_handler_options(
    queue: brooq.Queue,
    db: psycopg.Connection[Any],
    dsn: str,
    start_master: StartMaster,
    tmp_path: Path,
) -> None:
    app = tmp_path / "options_app.py"
    write_app(app, [("t.changed", 2, None)])
    env = {"QUEUE_FLEET_BEAT": "300ms"}
    m = start_master(workers=2, app="options_app:queue", cwd=tmp_path, env=env)
    m.wait_ready(2)
    first = wait_for(lambda: fleet_row(dsn, m.pid), what="the master's row")
    assert (first["topics"], first["queues"]) == (["t.changed"], ["default"])

    write_app(app, [("t.changed", 3, None), ("t.new", 2, "extra")])
    m.signal(signal.SIGHUP)
    wait_for(lambda: "event=reload_done" in m.log(), what="reload done")
    changed, _ = queue.enqueue(brooq.Job("t.changed"))
    new, _ = queue.enqueue(brooq.Job("t.new", queue="extra"))
    wait_for(lambda: row(db, new)[0] == "dead", timeout=60, what="the new handler's job dead")
    wait_for(lambda: row(db, changed)[0] == "dead", timeout=60, what="the changed one dead")
    assert row(db, new) == ("dead", 2)  # its own max_attempts, not the default 5
    assert row(db, changed) == ("dead", 3)  # the new max_attempts, not the old 2
    shown = wait_for(
        lambda: (r := fleet_row(dsn, m.pid)) and r["topics"] == ["t.changed", "t.new"] and r,
        what="the fleet row's new topics",
    )
    assert shown["queues"] == ["default", "extra"]
    m.signal(signal.SIGTERM)
    assert m.wait() == 0
