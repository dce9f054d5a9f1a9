"""The documentation's sample outputs are what brooq prints: `brooq stats`, `queues`, `top`,
`jobs list/show/logs`, `cancel`, `retry` (one and in bulk), `purge`, `enqueue`,
`periodic`, `fleet`, `keys`, `migrate status`, brooq-master's refusals and the error lines;
each is run again, on a database seeded with the jobs the sample shows.

A sample is a fenced block right after a marker comment naming its scene (the jobs seeded,
one function of SCENES below) and, when the block holds only what one command printed, that
command:

    <!-- sample: operator -->              a transcript: "$ brooq ..." lines, each followed
                                           by what it printed (run in order, on one database)
    <!-- sample: typo | brooq stats -->     the output of `brooq stats` alone

A command line is run by bash (pipes, redirections and `python -c` included), with stdin
not a terminal, but when the sample answers a prompt ("[y/N]: y"): then a terminal types
the answer.

Compared exactly, but for what a run cannot reproduce: ages (4.2s, 12.0m: the digits may
differ, not the unit nor the width), job ids, times ("2026-12-01 11:28:07 UTC", ISO 8601),
`brooq top`'s database and clock, the times of its JSON, and a read target's last line
("read from ..."), which only a standby prints. In a text sample a line "..." stands for
any lines (the rest of the output, left out) and a line ending with "..." for any end of
it; in a JSON sample a list may end with "..." (the rest left out). Every block of the
documentation that shows one of these outputs must be marked, or say why it is not checked
in a `<!-- sample not checked: why -->` comment, which only UNCHECKED may
(test_every_table_sample_is_marked).
"""

from __future__ import annotations

import json
import os
import pty
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

import brooq
from brooq.operator.records import COUNTS, SPLIT

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"<!--\s*sample:\s*(?P<scene>[\w-]+)\s*(?:\|\s*(?P<command>[^>]*?))?\s*-->")
FENCE = re.compile(r"^```[^\n]*\n(?P<body>.*?)^```", re.S | re.M)
# A block showing one of the count tables: it must be marked.
TABLE_HEADER = re.compile(
    r"^(\$ brooq (stats|queues|top)( --json| --once)?\s*|QUEUE +(TOPIC|PAUSED) .*READY.*"
    r"|\(no (unfinished|waiting|queues|jobs)\b.*)$"
)
# A block showing what one of the other commands a sample runs prints: it must be marked
# too, or say why it is not checked (UNCHECKED).
COMMAND_OUTPUT = re.compile(
    r"^(\$ (.*\| *)?brooq( --[\w-]+ \S+)* (stats|queues|top|jobs|cancel|retry|purge|enqueue"
    r"|periodic|fleet|keys|migrate status)\b"
    r"|ID +TOPIC +QUEUE +PRIORITY +STATE\b|NAME +SCHEDULE +TZ\b|TOPIC +QUEUE +GLOBAL LIMIT\b"
    r"|id: +[0-9a-f-]{36}$|errors \(\d+, oldest first\):|== attempt \d+, ended "
    r"|\S+ pid \d+: brooq \S+, app |\d{4}_\w+ +\d{4}-\d\d-\d\dT"
    r"|(brooq-master: cannot start|error): .*(cannot reach the database|read-only standby"
    r"|the brooq schema|is not brooq's))"
)
NOT_CHECKED = re.compile(r"<!--\s*sample not checked:\s*(?P<why>[^>]*?)\s*-->\s*\Z")
# The samples left unchecked, each for what the suite cannot make here: page, the first
# 60 characters of the block.
UNCHECKED = {
    # A read-only standby: the suite runs one PostgreSQL server, a primary.
    (
        "docs/how-to/high-availability.md",
        "brooq-master: cannot start: the database server app@db2:5432",
    ),
}

# An output the tutorial's own test runs (tests/docs/test_tutorial.py), right before a block.
TUTORIAL_OUTPUT = re.compile(r"<!--\s*tutorial:\s*output\s*-->\s*\Z")
AGE = re.compile(r"(?<![\w.])\d+\.\d(?=[smhd](?!\w))")
ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
TOP_TITLE = re.compile(r"^brooq top  \S+  \d\d:\d\d:\d\d UTC  \(q quits\)$", re.M)
READ_FROM = re.compile(r"^read from \S+, .+\n?", re.M)
ISO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00$")
WORKER = re.compile(r"\bworker [\w.-]+:\d+:[0-9a-f]+\)")
UTC_TIME = re.compile(r"\b\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\b")
ISO_IN_TEXT = re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00")


def documents() -> list[Path]:
    return sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])


@dataclass(frozen=True)
class Sample:
    page: str
    line: int
    scene: str
    command: str | None  # None: the block is a transcript
    text: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def samples() -> list[Sample]:
    found = []
    for path in documents():
        text = path.read_text()
        for marker in MARKER.finditer(text):
            block = FENCE.search(text, marker.end())
            page = str(path.relative_to(ROOT))
            line = text.count("\n", 0, marker.start()) + 1
            between = text[marker.end() : block.start()] if block else "no block"
            assert block and not between.strip(), f"{page}:{line}: the marker is not before a block"
            command = marker.group("command")
            found.append(Sample(page, line, marker.group("scene"), command, block.group("body")))
    return found


def normal(text: str) -> str:
    """``text`` without what a run cannot reproduce (the module docstring lists it)."""
    text = READ_FROM.sub("", text)
    text = TOP_TITLE.sub("brooq top  DATABASE  CLOCK  (q quits)", text)
    text = ID.sub("ID", text)
    text = UTC_TIME.sub("YYYY-MM-DD HH:MM:SS UTC", text)
    text = ISO_IN_TEXT.sub("ISO-TIME", text)
    text = WORKER.sub("worker HOST:PID:TAG)", text)
    return AGE.sub(lambda m: "#" * len(m.group()), text)


def matches(shown: str, printed: str) -> bool:
    """Whether ``printed`` is the sample ``shown``, both normal(): a line of the sample
    that is "..." stands for any lines (none included), one that ends with "..." for any
    end of its line; blank lines at the end (between a transcript's commands) are left out."""
    pattern = []
    for line in normal(shown).rstrip("\n").splitlines():
        if line == "...":
            pattern.append(r"(?:[^\n]*\n)*?")
        elif line.endswith("..."):
            pattern.append(re.escape(line[:-3]) + r"[^\n]*\n")
        else:
            pattern.append(re.escape(line) + r"\n")
    text = normal(printed).rstrip("\n") + "\n"
    return re.fullmatch("".join(pattern), text) is not None


def same_json(sample: Any, actual: Any, where: str = "") -> list[str]:
    """Where ``sample`` (its keys, their order, its values) is not ``actual``'s; floats,
    times, ids and the database name are compared by kind only."""
    if isinstance(sample, dict) and isinstance(actual, dict):
        if list(sample) != list(actual):
            return [f"{where or '/'}: keys {list(sample)} != {list(actual)}"]
        return [p for k in sample for p in same_json(sample[k], actual[k], f"{where}/{k}")]
    if isinstance(sample, list) and isinstance(actual, list):
        more = bool(sample) and sample[-1] == "..."
        shown = sample[:-1] if more else sample
        if len(shown) > len(actual) or (not more and len(shown) != len(actual)):
            return [f"{where}: {len(sample)} items shown, {len(actual)} printed"]
        return [p for n, s in enumerate(shown) for p in same_json(s, actual[n], f"{where}/{n}")]
    if isinstance(sample, float) and isinstance(actual, (float, int)):
        return []
    if isinstance(sample, str) and isinstance(actual, str):
        if where.endswith("/database") or (ISO_TIME.match(sample) and ISO_TIME.match(actual)):
            return []
        if ID.fullmatch(sample) and ID.fullmatch(actual):
            return []
    if sample != actual or type(sample) is not type(actual):
        return [f"{where}: {sample!r} != {actual!r}"]
    return []


PROMPT = re.compile(r"^(?P<prompt>.*\? \[y/N\]: )(?P<answer>\w*)$", re.M)
# The files a transcript reads (`--payload-file report.json`), in its working directory.
FILES = {"report.json": '{"report": "daily"}', "broken.json": '{"to": ,}'}


def run(dsn: str, line: str, shown: str = "") -> str:
    """The command line ``line`` (``$ brooq ...``, pipes and redirections included) run by
    bash, ``brooq`` being this brooq with DATABASE_URL=``dsn`` and none of the caller's
    settings (none at all for a line commented ``# nothing configured``), in a directory
    holding FILES: what it printed, stdout then stderr. Stdin is not a terminal, but for a
    line whose sample answers a prompt (``[y/N]: y``): then a terminal that types it."""
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CRED", "QUEUE_"))
    }
    environ.pop("PGOPTIONS", None)
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "examples")])
    if "# nothing configured" not in line:
        environ["DATABASE_URL"] = dsn
    with tempfile.TemporaryDirectory() as workdir:
        bin_dir = Path(workdir, "bin")
        bin_dir.mkdir()
        for name, args in (
            ("brooq", " -m brooq"),
            ("brooq-master", " -m brooq.master_cli"),
            ("python", ""),
        ):
            shim = bin_dir / name
            shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)}{args} "$@"\n')
            shim.chmod(0o755)
        environ["PATH"] = f"{bin_dir}{os.pathsep}{environ.get('PATH', '')}"
        for name, content in FILES.items():
            Path(workdir, name).write_text(content)
        prompt = PROMPT.search(shown)
        if prompt is None:
            done = subprocess.run(
                ["bash", "-c", line],
                capture_output=True,
                text=True,
                timeout=60,
                env=environ,
                cwd=workdir,
                stdin=subprocess.DEVNULL,
            )
            return done.stdout + done.stderr
        typist, terminal = pty.openpty()
        try:
            os.write(typist, prompt.group("answer").encode() + b"\n")
            done = subprocess.run(
                ["bash", "-c", line],
                capture_output=True,
                text=True,
                timeout=60,
                env=environ,
                cwd=workdir,
                stdin=terminal,
            )
        finally:
            os.close(typist)
            os.close(terminal)
        # What the terminal echoed of the answer, where the reader sees it.
        out = done.stdout.replace(prompt.group("prompt"), prompt.group(0) + "\n", 1)
        return out + done.stderr


def steps(sample: Sample) -> Iterator[tuple[str, str]]:
    """(the command line, what the sample shows it printed)."""
    if sample.command is not None:
        yield sample.command, sample.text
        return
    command: str | None = None
    shown: list[str] = []
    for line in sample.text.splitlines(keepends=True):
        if line.startswith("$ "):
            if command is not None:
                yield command, "".join(shown)
            command, shown = line[2:].rstrip("\n"), []
        else:
            assert command is not None, f"{sample}: output before any '$ brooq' line"
            shown.append(line)
    assert command is not None, f"{sample}: no '$ brooq' line"
    yield command, "".join(shown)


# -- the scenes: the jobs each sample shows ---------------------------------------------------


Connection = psycopg.Connection[Any]


def _master(db: Connection, queues: list[str], topics: list[str], limits: Any = None) -> None:
    """A live master's row: it handles ``queues`` x ``topics``, publishes ``limits``."""
    db.execute(
        "INSERT INTO brooq_master (id, host, pid, version, app, queues, topics, beat_seconds,"
        " started_at, limits) VALUES (%s, 'app1', 31337, %s, 'myapp:queue', %s, %s, 10, now(),"
        " %s)",
        (uuid.uuid4(), brooq.__version__, queues, topics, json.dumps(limits or {})),
    )


def _job(q: brooq.Queue, db: Connection, topic: str, set_: str, **options: Any) -> uuid.UUID:
    """A job of ``topic`` enqueued, then given its state and times (``set_``, SQL)."""
    job_id, _ = q.enqueue(brooq.Job(topic, {"n": 1}, **options))
    db.execute(f"UPDATE job SET {set_} WHERE id = %s", (job_id,))
    return job_id


def _write(db: Connection, job_id: str, set_: str, *params: Any) -> None:
    """``set_`` (SQL, with ``params``) written to the job where it is: job, or job_history
    once it has finished (the UPDATE that ended it moved it there)."""
    for table in ("job", "job_history"):
        db.execute(f"UPDATE {table} SET {set_} WHERE id = %s", (*params, job_id))


def empty(queue: brooq.Queue, db: Connection) -> None:
    """No job at all."""


def typo(queue: brooq.Queue, db: Connection) -> None:
    """A producer's typo: calc.hsah, a topic no live master handles."""
    _master(db, ["default"], ["calc.hash"])
    _job(queue, db, "calc.hash", "available_at = now()")
    for _ in range(2):
        _job(queue, db, "calc.hsah", "available_at = now() - interval '32 s'")


def operator(queue: brooq.Queue, db: Connection) -> None:
    """Every count: email.send in the default queue, report.render in bulk (global_limit
    1, at its limit: its ready jobs are held back), three children holding jobs, one
    lease expired."""
    _master(
        db,
        ["default", "bulk"],
        ["email.send", "report.render"],
        {"report.render": {"global_limit": 1, "queue": "bulk"}},
    )
    mail = "email.send"
    _job(queue, db, mail, "available_at = now() - interval '12 min'")
    _job(queue, db, mail, "available_at = now() - interval '30 s'")
    _job(queue, db, mail, "available_at = now() + interval '1 hour'")
    _job(
        queue,
        db,
        mail,
        "state = 'failed', attempts = 1, last_error = 'SMTP 451', "
        "available_at = now() + interval '40 s', updated_at = now() - interval '5 min'",
    )
    _job(
        queue,
        db,
        mail,
        "state = 'processing', attempts = 1, locked_by = 'app2:4711/child-1', "
        "locked_until = now() - interval '14 s', updated_at = now() - interval '72 s'",
    )
    _job(
        queue,
        db,
        mail,
        "state = 'processing', attempts = 2, locked_by = 'app1:31337/child-2', "
        "locked_until = now() + interval '45 s', updated_at = now() - interval '25 s'",
    )
    _job(queue, db, mail, "state = 'dead', attempts = 5, updated_at = now() - interval '20 min'")
    for _ in range(2):
        _job(queue, db, mail, "state = 'done', attempts = 1, updated_at = now() - interval '10 s'")
    render = "report.render"
    bulk = {"queue": "bulk"}
    _job(
        queue,
        db,
        render,
        "state = 'processing', attempts = 1, locked_by = 'app1:31337/child-1', "
        "locked_until = now() + interval '40 s', updated_at = now() - interval '15 s'",
        **bulk,
    )
    first = _job(queue, db, render, "available_at = now() - interval '10 min'", **bulk)
    _job(queue, db, render, "available_at = now() - interval '4 min'", **bulk)
    _job(queue, db, render, "state = 'waiting'", after=[first], **bulk)
    _job(queue, db, render, "parked = 'sleep', available_at = now() + interval '10 min'", **bulk)
    _job(
        queue,
        db,
        render,
        "state = 'done', attempts = 1, updated_at = now() - interval '20 s'",
        **bulk,
    )


def _errors(*entries: tuple[int, str, str, str]) -> str:
    """job.errors, as a child writes it: (attempt, how long ago (SQL), worker, error)."""
    return (
        "jsonb_build_array("
        + ", ".join(
            f"jsonb_build_object('attempt', {attempt}, 'at', now() - interval '{ago}', "
            f"'worker', '{worker}', 'error', '{error}')"
            for attempt, ago, worker, error in entries
        )
        + ")"
    )


def _keyed(queue: brooq.Queue, db: Connection) -> None:
    """search.reindex: three dead jobs, one of them keyed doc-9, a key a pending job holds."""
    _job(
        queue,
        db,
        "search.reindex",
        "id = '01a23c5e-0f6b-7a51-a9f2-5b0c4d1e2f37', state = 'dead', attempts = 5",
        unique_key="doc-9",
    )
    _job(
        queue,
        db,
        "search.reindex",
        "id = '01a23c61-77d0-70c2-8e41-9a3b2c1d0e5f'",
        unique_key="doc-9",
    )
    for _ in range(2):
        _job(queue, db, "search.reindex", "state = 'dead', attempts = 5")


def jobs(queue: brooq.Queue, db: Connection) -> None:
    """The jobs `brooq jobs list/show/logs`, `brooq cancel` and `brooq retry` show, with
    their ids."""
    for ago in ("9 min", "16 min", "20 min"):
        _job(
            queue,
            db,
            "report.render",
            f"created_at = now() - interval '{ago}', updated_at = now() - interval '{ago}'",
            queue="bulk",
        )
    smtp = "smtplib.SMTPServerDisconnected: Connection unexpectedly closed"
    _job(
        queue,
        db,
        "email.send",
        "id = '60fffff8-beb0-4282-a141-817b77c0a9f9', state = 'processing', attempts = 2, "
        "created_at = now() - interval '10.1 min', updated_at = now() - interval '15.7 s', "
        "available_at = now() - interval '36.7 s', locked_by = 'app1:31337:9f0c2e', "
        "started_at = now() - interval '15.7 s', "
        f"locked_until = now() + interval '14.3 s', last_error = '{smtp}', "
        f"errors = {_errors((1, '37.7 s', 'app1:31337:9f0c2e', smtp))}",
    )
    db.execute(
        "UPDATE job SET payload = %s WHERE id = '60fffff8-beb0-4282-a141-817b77c0a9f9'",
        (json.dumps({"to": "dee@example.org", "invoice": 1042, "template": "invoice"}),),
    )
    refused = "ConnectionRefusedError: smtp.example.org:25 refused the connection (attempt {})"
    _job(
        queue,
        db,
        "email.send",
        "id = '01a231e3-b1fb-727d-86cd-f1638fd45e5e', state = 'dead', attempts = 3, "
        "created_at = now() - interval '2.6 s', updated_at = now() - interval '0.2 s', "
        "available_at = now() + interval '5.4 s', locked_by = 'vm:15146:0b2b77', "
        "started_at = now() - interval '0.3 s', "
        f"locked_until = now() + interval '29 s', last_error = '{refused.format(3)}', "
        "errors = "
        + _errors(
            (1, "2.2 s", "vm:15146:0b2b77", refused.format(1)),
            (2, "1.2 s", "vm:15145:6f12aa", refused.format(2)),
            (3, "0.2 s", "vm:15146:0b2b77", refused.format(3)),
        ),
    )
    _write(
        db,
        "01a231e3-b1fb-727d-86cd-f1638fd45e5e",
        "payload = %s",
        json.dumps({"to": "dee@example.org", "invoice": 1042}),
    )
    lines = [
        "level=info logger=billing pid=19494 charging card visa-4242, attempt {}",
        "level=warning logger=billing pid=19494 the gateway answered 502",
    ]
    logs = [
        {
            "attempt": attempt,
            "at": "2026-12-03T15:26:48.7+00:00",
            "text": "\n".join(
                f"time=2026-12-03T15:26:48.{ms}+00:00 {line.format(attempt)}" for line in lines
            ),
        }
        for attempt, ms in ((1, 703), (2, 747))
    ]
    _job(
        queue,
        db,
        "billing.charge",
        "id = '01a23c84-117c-7383-8678-89c60d1baee8', state = 'dead', attempts = 2",
    )
    _write(db, "01a23c84-117c-7383-8678-89c60d1baee8", "logs = %s", json.dumps(logs))
    _job(queue, db, "email.send", "id = '2f2569c2-a34d-4fdc-a27c-a050cae4e71e'")
    _job(queue, db, "email.send", "id = '6e4b0de5-0db2-4be6-bccb-5e695a325999', state = 'done'")
    _job(
        queue,
        db,
        "email.send",
        "id = '419b15c6-4118-4699-a555-0cbe1cc10132', state = 'dead', attempts = 5",
    )
    _job(queue, db, "email.send", "id = '636c1ebc-b762-4daf-87c3-988fa3deab99'")
    _keyed(queue, db)
    # docs/how-to/handlers.md: a handler that raised twice, its tracebacks kept.
    raised = "ZeroDivisionError: division by zero"
    trace = (
        "Traceback (most recent call last):\n"
        '  File "/srv/app/tasks.py", line 12, in price\n'
        '  File "/srv/app/tasks.py", line 8, in per_item\n' + raised
    )
    history = [
        {
            "attempt": n,
            "at": at,
            "worker": worker,
            "error": raised,
            "kind": "raised",
            "traceback": trace,
        }
        for n, at, worker in (
            (1, "2026-12-04T10:00:00.1+00:00", "web-1:4242:a1b2c3"),
            (2, "2026-12-04T10:00:01.2+00:00", "web-1:4243:d4e5f6"),
        )
    ]
    _job(
        queue,
        db,
        "shop.price",
        "id = '01a2397e-5b1c-7d2a-9e44-2c6f0b8a1d35', state = 'dead', attempts = 2, "
        f"last_error = '{raised}'",
    )
    _write(db, "01a2397e-5b1c-7d2a-9e44-2c6f0b8a1d35", "errors = %s", json.dumps(history))
    # docs/how-to/results.md: one failed attempt.
    revoked = "PermissionError: the partner revoked our key"
    _job(
        queue,
        db,
        "partner.sync",
        "id = '01a23a10-4d2e-7f31-b5c8-0e9a7d6c4b21', state = 'failed', attempts = 1, "
        f"last_error = '{revoked}', errors = {_errors((1, '5 s', 'vm:20114:5b61d0', revoked))}",
    )


def limits(queue: brooq.Queue, db: Connection) -> None:
    """Two limited topics of the default queue: crm.call's rate_limit window full, and
    report.build running one job in each of three groups, at their group_limit 1."""
    _master(
        db,
        ["default"],
        ["crm.call", "report.build"],
        {
            "crm.call": {"queue": "default", "rate_limit": {"limit": 20, "text": "20/s"}},
            "report.build": {
                "queue": "default",
                "group_limit": 1,
                "group_rate_limit": {"limit": 30, "text": "30/m"},
            },
        },
    )
    db.execute(
        "INSERT INTO brooq_rate_slot (topic, group_key, slot, free_at)"
        " SELECT 'crm.call', '', n, now() + interval '30 s' FROM generate_series(1, 20) AS n"
    )
    for group in ("acme", "globex", "initech"):
        _job(
            queue,
            db,
            "report.build",
            f"state = 'processing', attempts = 1, group_key = '{group}', "
            "locked_by = 'app1:31337:9f0c2e', locked_until = now() + interval '40 s'",
        )


def schemas(queue: brooq.Queue, db: Connection) -> None:
    """Beside brooq's schema (public): older, brooq's schema one migration behind, and
    foreign_app, whose table job is not brooq's."""
    db.execute("CREATE SCHEMA older")
    migrated = run(
        db.info.dsn, 'brooq --database "$DATABASE_URL options=-csearch_path=older" migrate up'
    )
    last = int(migrated.split()[-1].split("_")[0])
    run(db.info.dsn, 'brooq --database "$DATABASE_URL options=-csearch_path=older" migrate down')
    assert last > 1, migrated
    db.execute("CREATE SCHEMA foreign_app")
    db.execute("CREATE TABLE foreign_app.job (id integer PRIMARY KEY, topic text)")


# The application of `brooq jobs stack`'s sample, as the reader's: /srv/app.
APP_DIR = "/srv/app"
STACK_APP = {
    "jobs.py": """import brooq

import render as renderer

queue = brooq.Queue()


@queue.handler("report.render")
def render(claim: brooq.Claim) -> None:
    report = claim.payload
    pdf = renderer.render(report)
    print(pdf)
""",
    "render.py": """import time


def render(report: dict) -> bytes:
    time.sleep(float(report["sleep"]))
    return b"%PDF"
""",
}


@dataclass
class Master:
    """A brooq-master a scene started: stopped when the sample is done; ``where`` is the
    directory of its application, shown as APP_DIR."""

    process: subprocess.Popen[bytes]
    where: str

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.where, ignore_errors=True)


def stack(queue: brooq.Queue, db: Connection) -> Master:
    """A master of STACK_APP running one report.render, asleep in render.py."""
    job = "01a2329c-1656-700b-9488-75fd64156e28"
    _job(queue, db, "report.render", f"id = '{job}', payload = '{{\"sleep\": 60}}'")
    where = tempfile.mkdtemp(prefix="brooq-sample-app-")
    for name, source in STACK_APP.items():
        Path(where, name).write_text(source)
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CRED", "QUEUE_"))
    }
    environ.pop("PGOPTIONS", None)
    environ.update(PYTHONPATH=os.pathsep.join([where, str(ROOT)]), DATABASE_URL=db.info.dsn)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "brooq.master_cli",
            "--app",
            "jobs:queue",
            "--workers",
            "1",
            "--graceful-timeout",
            "1s",
        ],
        cwd=where,
        env=environ,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    master = Master(process, where)
    deadline = time.monotonic() + 30
    while db.execute("SELECT state <> 'processing' FROM job WHERE id = %s", (job,)).fetchone() != (
        False,
    ):
        if time.monotonic() > deadline or process.poll() is not None:
            master.stop()
            raise AssertionError("the master did not take the job within 30 s")
        time.sleep(0.05)
    return master


def _many(db: Connection, n: int, topic: str, state: str, queue_name: str) -> None:
    db.execute(
        "INSERT INTO job (topic, payload, state, queue, attempts)"
        " SELECT %s, '{}', %s, %s, CASE WHEN %s = 'dead' THEN 5 ELSE 0 END"
        " FROM generate_series(1, %s)",
        (topic, state, queue_name, state, n),
    )


def bulk(queue: brooq.Queue, db: Connection) -> None:
    """Many jobs: email.send dead (120 in default, 1222 in bulk) and pending (1200 in
    bulk, 190 in default), report.render pending in bulk (34), and the search.reindex of _keyed."""
    _many(db, 120, "email.send", "dead", "default")
    _many(db, 1222, "email.send", "dead", "bulk")
    _many(db, 1200, "email.send", "pending", "bulk")
    _many(db, 190, "email.send", "pending", "default")
    _many(db, 34, "report.render", "pending", "bulk")
    _keyed(queue, db)


def fleet(queue: brooq.Queue, db: Connection) -> None:
    """One master on host vm, two children, seen 0.2 s ago."""
    children = [
        {"pid": pid, "kind": "sync", "generation": 0, "started_at": "2026-12-03T09:25:57.46+00:00"}
        for pid in (24800, 24801)
    ]
    db.execute(
        "INSERT INTO brooq_master (id, host, pid, version, app, queues, topics, children,"
        " beat_seconds, started_at, seen_at) VALUES (%s, 'vm', 24781, %s, 'myapp.jobs:queue',"
        " '{default}', '{calc.hash,email.send}', %s, 10, now() - interval '10 s',"
        " now() - interval '0.2 s')",
        (uuid.uuid4(), brooq.__version__, json.dumps(children)),
    )


def keys(queue: brooq.Queue, db: Connection) -> None:
    """Two ordered keys blocked: acct-42 of billing.sync by a dead job two hours ago (two
    jobs waiting their turn), cust-7 of crm.push by a job awaiting its retry (one waiting);
    a report.render in bulk."""
    _job(queue, db, "billing.sync", "state = 'dead', attempts = 5", ordering_key="acct-42")
    db.execute("UPDATE brooq_key_block SET blocked_at = now() - interval '2 hours'")
    for _ in range(2):
        _job(queue, db, "billing.sync", "attempts = 0", ordering_key="acct-42")
    _job(
        queue,
        db,
        "crm.push",
        "state = 'failed', attempts = 1, last_error = 'HTTP 503', "
        "updated_at = now() - interval '5 min', available_at = now() + interval '25 min'",
        ordering_key="cust-7",
    )
    _job(queue, db, "crm.push", "attempts = 0", ordering_key="cust-7")
    _job(queue, db, "report.render", "available_at = now() - interval '3 min'", queue="bulk")


def periodic(queue: brooq.Queue, db: Connection) -> None:
    """The demo's heartbeat, its last tick claimed a few seconds ago, its job done."""
    tick = _job(queue, db, "demo.notify", "state = 'done', attempts = 1")
    db.execute(
        "INSERT INTO brooq_periodic (name, last_tick, last_job)"
        " VALUES ('heartbeat', date_trunc('second', now()) - interval '6 s', %s)",
        (tick,),
    )


SCENES: dict[str, Callable[[brooq.Queue, Connection], Master | None]] = {
    "empty": empty,
    "typo": typo,
    "operator": operator,
    "jobs": jobs,
    "bulk": bulk,
    "fleet": fleet,
    "periodic": periodic,
    "keys": keys,
    "limits": limits,
    "schemas": schemas,
    "stack": stack,
}
SAMPLES = samples()


def test_samples_are_found() -> None:
    pages = {s.page for s in SAMPLES}
    assert {"docs/operator.md", "docs/how-to/read-replica.md"} <= pages
    assert {s.scene for s in SAMPLES} == set(SCENES)


def test_every_table_sample_is_marked() -> None:
    """A block showing a count table, or what another command a sample runs prints, is a
    sample here, or an output of the tutorial's, which tests/docs/test_tutorial.py checks
    against its own run, or one of UNCHECKED, which says why in the page."""
    marked = {(s.page, s.text) for s in SAMPLES}
    unmarked, unchecked = [], set()
    for path in documents():
        page = str(path.relative_to(ROOT))
        text = path.read_text()
        for block in FENCE.finditer(text):
            body = block.group("body")
            shows = [
                line
                for line in body.splitlines()
                if TABLE_HEADER.match(line) or COMMAND_OUTPUT.match(line)
            ]
            before = text[: block.start()]
            not_checked = NOT_CHECKED.search(before)
            if not_checked:
                assert not_checked.group("why"), f"{page}: a sample not checked says why"
                first = body.splitlines()[0]
                unchecked.add((page, first[:60]))
            elif shows and (page, body) not in marked and not TUTORIAL_OUTPUT.search(before):
                unmarked.append(f"{page}: {shows[0]}")
    assert unmarked == []
    assert unchecked == UNCHECKED


@pytest.mark.parametrize("sample", SAMPLES, ids=str)
def test_sample_is_what_brooq_prints(
    sample: Sample, dsn: str, queue: brooq.Queue, db: Connection
) -> None:
    master = SCENES[sample.scene](queue, db)
    try:
        for line, shown in steps(sample):
            printed = run(dsn, line, shown)
            if master is not None:
                printed = printed.replace(master.where, APP_DIR)
            json_sample = shown.lstrip().startswith(("{", "["))
            if "--json" in shlex.split(line, comments=True) and json_sample:
                expected, found = json.loads(shown), json.loads(printed)
                if isinstance(found, dict) and "read_from" not in found:
                    expected.pop("read_from", None)  # only a read target prints it
                assert same_json(expected, found) == [], (line, printed)
            else:
                assert matches(shown, printed), f"$ {line}\n{printed}"
    finally:
        if master is not None:
            master.stop()


def test_the_counts_split_the_jobs(queue: brooq.Queue, db: Connection) -> None:
    """Each unfinished job is in exactly one count but held (part of ready), dead ones in
    dead; a queue's counts are its topics' summed; the JSON lists the counts first."""
    operator(queue, db)
    # A sleep that has ended is ready; a job waiting for an event without a deadline is parked.
    _job(queue, db, "report.render", "parked = 'sleep', available_at = now()", queue="bulk")
    _job(queue, db, "email.send", "state = 'waiting', parked = 'event'")
    _job(queue, db, "email.send", "state = 'on_hold'")  # held by an operator
    rows = {(r.queue, r.topic): r for r in queue.stats()}
    counted = {
        (queue_name, topic): n
        for queue_name, topic, n in db.execute(
            "SELECT queue, topic, count(*) FROM job_all WHERE state NOT IN ('done', 'canceled') "
            "GROUP BY queue, topic"
        )
    }
    assert {key: sum(getattr(r, name) for name in SPLIT) for key, r in rows.items()} == counted
    mail, render = rows[("default", "email.send")], rows[("bulk", "report.render")]
    assert [getattr(mail, name) for name in COUNTS] == [0, 1, 2, 0, 1, 1, 1, 2, 1]
    assert [getattr(render, name) for name in COUNTS] == [1, 0, 3, 3, 0, 1, 0, 1, 0]
    assert (mail.pending, mail.failed, mail.busy) == (3, 1, 1)  # the state counts, kept
    for stats in queue.queues():
        topics = [r for r in rows.values() if r.queue == stats.name]
        assert [getattr(stats, name) for name in COUNTS] == [
            sum(getattr(r, name) for r in topics) for name in COUNTS
        ]
    assert list(mail.to_dict())[2 : 2 + len(COUNTS)] == list(COUNTS)
    assert list(queue.queues()[0].to_dict())[2 : 2 + len(COUNTS)] == list(COUNTS)
