"""The application's own log records next to brooq's: brooq-master formats every
logger's records at its level, a handler's naming the job it ran; ``--log-config own``
leaves the application's loggers alone; a file configures them (dictConfig)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

import brooq
from tests.harness import APPS, StartMaster, wait_for

APP = "brooq_logapp:queue"


def _done(db: psycopg.Connection[Any], n: int) -> bool:
    row = db.execute("SELECT count(*) FROM job_all WHERE state = 'done'").fetchone()
    return row is not None and row[0] == n


def test_a_handlers_log_lines_come_out_with_its_job(
    start_master: StartMaster, queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    sync_id, _ = queue.enqueue(brooq.Job("l.sync", {"cents": 250}))
    async_id, _ = queue.enqueue(brooq.Job("l.async", {"host": "api.example"}))
    m = start_master(workers=2, app=APP)
    wait_for(lambda: _done(db, 2), what="both done")
    wait_for(lambda: "slow answer" in m.log(), what="the async line")
    log = m.log()
    assert re.search(
        rf"level=info logger=myapp\.jobs pid=\d+ job={sync_id} topic=l\.sync charged 250 cents",
        log,
    ), log
    assert re.search(
        rf"level=warning logger=myapp\.jobs pid=\d+ job={async_id} topic=l\.async "
        r"slow answer from api\.example",
        log,
    ), log
    assert "a detail below INFO" not in log  # QUEUE_LOG_LEVEL holds for them too
    assert re.search(rf"logger=py\.warnings pid=\d+ job={sync_id} .*a deprecated call", log)


def test_json_lines_carry_the_job_as_fields(
    start_master: StartMaster, queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    job_id, _ = queue.enqueue(brooq.Job("l.sync", {"cents": 7}))
    m = start_master(workers=1, app=APP, args=("--log-format", "json"))
    wait_for(lambda: _done(db, 1), what="done")
    wait_for(lambda: "charged 7 cents" in m.log(), what="the line")
    lines = [json.loads(line) for line in m.log().splitlines() if "charged 7" in line]
    assert lines == [
        {
            "level": "info",
            "logger": "myapp.jobs",
            "pid": lines[0]["pid"],
            "time": lines[0]["time"],
            "job": str(job_id),
            "topic": "l.sync",
            "message": "charged 7 cents",
        }
    ]


def test_own_leaves_the_applications_loggers_alone(
    start_master: StartMaster, queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    queue.enqueue(brooq.Job("l.sync", {"cents": 1}))
    m = start_master(workers=1, app=APP, env={"QUEUE_LOG_CONFIG": "own"})
    wait_for(lambda: _done(db, 1), what="done")
    wait_for(lambda: "event=job_done" in m.log(), what="brooq's own line")
    assert "charged 1 cents" not in m.log()  # nobody configured myapp: INFO goes nowhere


def test_a_dictconfig_file_configures_them(
    start_master: StartMaster, queue: brooq.Queue, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    config = tmp_path / "logging.json"
    config.write_text(
        json.dumps(
            {
                "version": 1,
                "formatters": {"plain": {"format": "APP %(name)s %(levelname)s %(message)s"}},
                "handlers": {"err": {"class": "logging.StreamHandler", "formatter": "plain"}},
                "loggers": {"myapp": {"handlers": ["err"], "level": "INFO"}},
            }
        )
    )
    queue.enqueue(brooq.Job("l.sync", {"cents": 3}))
    m = start_master(workers=1, app=APP, args=("--log-config", str(config)))
    wait_for(lambda: _done(db, 1), what="done")
    wait_for(lambda: "APP myapp.jobs INFO charged 3 cents" in m.log(), what="the file's format")
    # brooq's loggers still enabled (the line follows the done's commit: waited for).
    wait_for(lambda: "event=job_done" in m.log(), what="brooq's job_done line")


def test_a_bad_log_config_is_refused_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"handlers": {}}')
    for value, words in (
        (str(tmp_path / "missing.ini"), "no such file"),
        (str(bad), '"version": 1'),
    ):
        out = subprocess.run(
            [sys.executable, "-m", "brooq.master_cli", "--app", APP, "--log-config", value],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=APPS,
        )
        assert out.returncode == 2, out.stderr
        assert words in out.stderr and "Traceback" not in out.stderr, out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "brooq.master_cli", "--app", APP, "--log-level", "LOUD"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=APPS,
    )
    assert out.returncode == 2 and "LOUD" in out.stderr and "Traceback" not in out.stderr


def test_a_real_childs_json_line_keeps_its_keys_and_the_error(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    text = 'say "hi", it\'s pid=1 level=x event=y \\ back\\slash é'
    job_id, _ = queue.enqueue(brooq.Job("t.says", {"message": text}))
    m = start_master(app="brooq_cli_app:queue", workers=1, args=("--log-format", "json"))
    wait_for(
        lambda: (
            db.execute("SELECT state FROM job_all WHERE id = %s", (job_id,)).fetchone() == ("dead",)
        ),
        what="the job dead",
    )

    def dead_line() -> dict[str, Any] | None:
        for line in m.log().splitlines():
            if line.startswith("{") and '"job_dead"' in line:
                return dict(json.loads(line))
        return None

    out = wait_for(dead_line, what="the job_dead line")
    assert out["event"] == "job_dead" and out["job"] == str(job_id)
    assert out["level"] == "error" and out["logger"] == "brooq.child"
    assert out["pid"] in m.children() and out["pid"] != m.pid
    assert out["error"] == f"ValueError: {text}"
    assert "msg_pid" not in out  # inside the quoted error: not a key of the line
    assert "Traceback" in out["detail"]
