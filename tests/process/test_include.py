"""An application whose handlers live in several modules (include=) under a real
brooq-master named by its module alone, and `brooq enqueue --app`: the handler's queue,
a typed payload of datetime, Decimal and UUID reaching the handler as those types,
strict_topics' refusal, an include that cannot be imported (exit 2, one line), and a
SQLAlchemy URL given as --database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from typing import Any
from urllib.parse import urlencode

import psycopg
import pytest
from psycopg import conninfo

from tests.cliproc import run_brooq
from tests.harness import APPS, FAST, StartMaster, wait_for

APP = "brooq_incapp.app:queue"


def brooq_cli(database: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_")}
    env.pop("DATABASE_URL", None)
    env["PYTHONPATH"] = os.pathsep.join([str(APPS), str(APPS.parent.parent)])
    return run_brooq(["--database", database, *args], env=env, cwd=APPS)


def enqueued(out: subprocess.CompletedProcess[str]) -> uuid.UUID:
    assert out.returncode == 0, out.stderr
    return uuid.UUID(json.loads(out.stdout)["id"])


def job(db: psycopg.Connection[Any], job_id: uuid.UUID) -> tuple[Any, ...]:
    found = db.execute(
        "SELECT topic, queue, state, result FROM job_all WHERE id = %s", (job_id,)
    ).fetchone()
    assert found is not None
    return tuple(found)


def one_line_refusal(out: subprocess.CompletedProcess[str], *expected: str) -> str:
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1, lines
    for part in expected:
        assert part in lines[0], lines[0]
    return lines[0]


def test_a_master_runs_the_handlers_of_every_included_module_and_the_cli_places_their_jobs(
    dsn: str, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    order = uuid.uuid4()
    paid = {"order": str(order), "amount": "19.90", "paid_at": "2026-12-04T23:00:01+01:00"}
    paid_id = enqueued(
        brooq_cli(
            dsn, "enqueue", "--app", APP, "shop.order.paid", "--payload", json.dumps(paid), "--json"
        )
    )
    invoice = enqueued(brooq_cli(dsn, "enqueue", "--app", APP, "shop.invoice.send", "--json"))
    refund = enqueued(brooq_cli(dsn, "enqueue", "--app", APP, "shop.refund.issue", "--json"))
    urgent = enqueued(
        brooq_cli(dsn, "enqueue", "--app", APP, "shop.invoice.send", "--queue", "urgent", "--json")
    )
    plain = enqueued(brooq_cli(dsn, "enqueue", "shop.invoice.send", "--json"))  # no --app
    assert job(db, invoice)[:3] == ("shop.invoice.send", "billing", "pending")
    assert job(db, refund)[:3] == ("shop.refund.issue", "billing", "pending")
    assert job(db, urgent)[:3] == ("shop.invoice.send", "urgent", "pending")
    assert job(db, plain)[:3] == ("shop.invoice.send", "default", "pending")

    # --app names the module alone: its one Queue is found by attribute.
    master = start_master(app="brooq_incapp.app", workers=1)
    master.wait_ready(1)
    for job_id in (paid_id, invoice, refund, plain):
        wait_for(lambda j=job_id: job(db, j)[2] == "done", what=f"{job_id} done")
    assert job(db, paid_id)[3] == {
        "types": ["UUID", "Decimal", "datetime"],
        "amount_plus_cent": "19.91",
        "utc_offset": "1:00:00",
        "order": str(order),
    }
    assert job(db, invoice)[3] == "invoiced" and job(db, refund)[3] == "refunded"
    assert job(db, urgent)[2] == "pending"  # a queue no handler declares: not worked


def test_the_cli_with_app_refuses_what_the_application_refuses(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    one_line_refusal(
        brooq_cli(dsn, "enqueue", "--app", APP, "shop.emial.send"),
        "Invalid value for TOPIC: topic 'shop.emial.send' has no handler on this Queue "
        "(strict_topics=True); did you mean 'shop.email.send' or 'shop.invoice.send'?",
    )
    one_line_refusal(
        brooq_cli(
            dsn,
            "enqueue",
            "--app",
            APP,
            "shop.order.paid",
            "--payload",
            '{"order": "x", "amount": "1", "paid_at": "2026-01-01T00:00:00Z"}',
        ),
        "Invalid value for --payload: payload.order: expected UUID (its text)",
    )
    one_line_refusal(
        brooq_cli(dsn, "enqueue", "--app", "brooq_incbroken:queue", "t.x"),
        "Invalid value for --app: cannot import 'brooq_incapp_nothing_here.tasks' (named in "
        "the Queue's include=): ModuleNotFoundError",
    )
    one_line_refusal(
        brooq_cli(dsn, "enqueue", "--app", "brooq_incapp", "t.x"),
        "'brooq_incapp' holds no brooq.Queue; name one as --app brooq_incapp:ATTR",
    )
    assert db.execute("SELECT count(*) FROM job_all").fetchone() == (0,)


def test_a_master_whose_include_cannot_be_imported_exits_2_in_one_line(dsn: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_")}
    env.update(
        FAST, DATABASE_URL=dsn, PYTHONPATH=os.pathsep.join([str(APPS), str(APPS.parent.parent)])
    )
    out = subprocess.run(
        [sys.executable, "-m", "brooq.master_cli", "--app", "brooq_incbroken:queue"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=APPS,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == [
        "brooq-master: cannot import 'brooq_incapp_nothing_here.tasks' (named in the Queue's "
        "include=): ModuleNotFoundError: No module named 'brooq_incapp_nothing_here'"
    ]


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_the_cli_takes_a_sqlalchemy_url(dsn: str, db: psycopg.Connection[Any], driver: str) -> None:
    params = conninfo.conninfo_to_dict(dsn)
    name = params.pop("dbname")
    url = f"postgresql+{driver}:///{name}?{urlencode(params)}"
    job_id = enqueued(brooq_cli(url, "enqueue", "t.x", "--json"))
    assert job(db, job_id)[:3] == ("t.x", "default", "pending")
    listed = brooq_cli(url, "jobs", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert str(job_id) in listed.stdout


def test_another_driver_in_the_url_is_one_line_naming_it(dsn: str) -> None:
    line = one_line_refusal(
        brooq_cli("postgresql+asyncpg://u:s3cret@127.0.0.1/x", "enqueue", "t.x"),
        "names the driver '+asyncpg' (postgresql+asyncpg://)",
    )
    assert "s3cret" not in line


def test_a_reload_imports_the_included_modules_again(
    dsn: str, db: psycopg.Connection[Any], start_master: StartMaster, tmp_path: Any
) -> None:
    """SIGHUP: the children import the application again, and its include= with it: a
    changed handler in an included module and a module added to an included package both
    run in the new generation."""
    import signal
    import time

    import brooq

    pkg = tmp_path / "reincluded"
    (pkg / "jobs").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "app.py").write_text(
        "import brooq\nqueue = brooq.Queue(include=['reincluded.jobs'], strict_topics=True)\n"
    )
    (pkg / "jobs" / "__init__.py").write_text("")

    def write(name: str, topic: str, version: str) -> None:
        path = pkg / "jobs" / f"{name}.py"
        path.write_text(
            "from reincluded.app import queue\n\n"
            f"@queue.handler({topic!r})\n"
            f"def handle(claim):\n    return {version!r}\n"
        )
        later = time.time() + (2 if version == "v2" else 1)
        os.utime(path, (later, later))  # defeat the .pyc mtime check

    write("versioned", "t.version", "v1")
    m = start_master(workers=1, app="reincluded.app", cwd=tmp_path)
    m.wait_ready(1)
    producer = brooq.Queue(dsn)
    try:
        first, _ = producer.enqueue(brooq.Job("t.version"))
        wait_for(lambda: job(db, first)[2] == "done", what="v1 done")
        write("versioned", "t.version", "v2")
        write("added", "t.added", "added")
        m.signal(signal.SIGHUP)
        wait_for(lambda: "event=reload_done" in m.log(), what="reload done")
        second, _ = producer.enqueue(brooq.Job("t.version"))
        added, _ = producer.enqueue(brooq.Job("t.added"))
        wait_for(lambda: job(db, second)[2] == "done", what="v2 done")
        wait_for(lambda: job(db, added)[2] == "done", what="the added module's job done")
    finally:
        producer.close()
    assert (job(db, first)[3], job(db, second)[3], job(db, added)[3]) == ("v1", "v2", "added")
