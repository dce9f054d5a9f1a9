"""A cancel of a processing job stops its handler at once, through every door.

The lease is 30 s here, so the master's periodic renewal comes every 10 s: a handler that
hears brooq.LeaseLost within a second of the cancel heard it from the cancel's
notification (the master renewing at once), never from a renewal that happened to fall
due. The times compared are the database's: the cancel's `updated_at` and the handler's
record of what it heard.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import brooq
from tests.harness import MasterProcess, children_of, wait_for
from tests.process.test_operations import get, ops_addr

APP = "brooq_cancelapp:queue"
SLOW_RENEWAL = {"QUEUE_LEASE": "30s", "QUEUE_WATCHDOG_GRACE": "30s"}
# From the cancel's commit to the handler's record: the bound the tests hold.
AT_ONCE = 1.0


def _notes(db: psycopg.Connection[Any], job_id: Any) -> list[str]:
    rows = db.execute(
        "SELECT note FROM execution WHERE job_id = %s ORDER BY at", (job_id,)
    ).fetchall()
    return [r[0] for r in rows]


def _pid_of(db: psycopg.Connection[Any], job_id: Any) -> int:
    row = db.execute(
        "SELECT pid FROM execution WHERE job_id = %s AND note = 'start'", (job_id,)
    ).fetchone()
    assert row is not None
    return int(row[0])


def _started(db: psycopg.Connection[Any], job_id: Any) -> None:
    wait_for(lambda: "start" in _notes(db, job_id), timeout=30, what="the handler started")


def _heard_after(
    db: psycopg.Connection[Any], job_id: Any, note: str = "lease_lost", since: Any = None
) -> float:
    """Seconds from the cancel (``since``, else the row's updated_at, set by the cancel's
    transaction) to the handler's record of ``note``, once it is there."""
    wait_for(lambda: note in _notes(db, job_id), timeout=15, what=f"the handler's {note}")
    row = db.execute(
        "SELECT extract(epoch FROM e.at - coalesce(%s, j.updated_at)) FROM execution e "
        "JOIN job_all j ON j.id = e.job_id WHERE e.job_id = %s AND e.note = %s",
        (since, job_id, note),
    ).fetchone()
    assert row is not None
    return float(row[0])


def _row(db: psycopg.Connection[Any], job_id: Any) -> tuple[Any, ...]:
    row = db.execute(
        "SELECT state, attempts, last_error, lease_expiries FROM job_all WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None
    return tuple(row)


def _canceled_and_kept(db: psycopg.Connection[Any], job_id: Any, m: MasterProcess) -> None:
    """The child wrote nothing over the cancel: its lease_lost line said so."""
    wait_for(
        lambda: re.search(rf"logger=brooq.child .*event=lease_lost job={job_id}", m.log()),
        what="the child's lease_lost line",
    )
    assert _row(db, job_id) == ("canceled", 1, None, 0)
    assert "end" not in _notes(db, job_id)


@pytest.mark.parametrize("topic", ["c.sleep", "c.spin"])
def test_a_canceled_sync_handler_hears_leaselost_at_once_and_its_child_goes_on(
    topic: str,
    start_master: Callable[..., MasterProcess],
    queue: brooq.Queue,
    db: psycopg.Connection[Any],
) -> None:
    m = start_master(workers=2, app=APP, env=SLOW_RENEWAL)
    job_id, _ = queue.enqueue(brooq.Job(topic))
    _started(db, job_id)
    assert queue.cancel(job_id) is True
    assert _heard_after(db, job_id) < AT_ONCE
    _canceled_and_kept(db, job_id, m)
    assert re.search(rf"event=cancel_heard job={job_id} pid=\d+", m.log())
    # The same child runs the next job: nothing was killed.
    child = _pid_of(db, job_id)
    next_id, _ = queue.enqueue(brooq.Job("c.sleep"))
    _started(db, next_id)
    assert _pid_of(db, next_id) == child
    assert "event=child_killed" not in m.log()


@pytest.mark.parametrize(
    ("topic", "next_topic"), [("c.stubborn", "c.sleep"), ("c.async_stubborn", "c.async")]
)
def test_a_handler_that_swallows_leaselost_is_killed_after_the_grace(
    topic: str,
    next_topic: str,
    start_master: Callable[..., MasterProcess],
    queue: brooq.Queue,
    db: psycopg.Connection[Any],
) -> None:
    m = start_master(workers=2, app=APP, env={**SLOW_RENEWAL, "QUEUE_WATCHDOG_GRACE": "1s"})
    job_id, _ = queue.enqueue(brooq.Job(topic))
    _started(db, job_id)
    child = _pid_of(db, job_id)
    assert queue.cancel(job_id) is True
    assert _heard_after(db, job_id, "swallowed") < AT_ONCE
    # Killed once the grace has passed since the master told it, and replaced.
    wait_for(
        lambda: re.search(
            rf"event=child_killed pid={child} .*reason=hung_after_lease_lost", m.log()
        ),
        timeout=10,
        what="the stubborn child killed",
    )
    wait_for(lambda: child not in children_of(m.pid), what="the killed child gone")
    # The kill wrote nothing over the cancel: no attempt charged, no error.
    assert _row(db, job_id) == ("canceled", 1, None, 0) and "end" not in _notes(db, job_id)
    next_id, _ = queue.enqueue(brooq.Job(next_topic))
    _started(db, next_id)
    assert _pid_of(db, next_id) != child
    assert _row(db, job_id)[0] == "canceled"


def test_a_canceled_async_handler_is_cancelled_at_once_and_its_child_goes_on(
    start_master: Callable[..., MasterProcess],
    queue: brooq.Queue,
    db: psycopg.Connection[Any],
) -> None:
    m = start_master(workers=2, app=APP, env=SLOW_RENEWAL)
    job_id, _ = queue.enqueue(brooq.Job("c.async"))
    _started(db, job_id)
    assert queue.cancel(job_id) is True
    assert _heard_after(db, job_id) < AT_ONCE
    _canceled_and_kept(db, job_id, m)
    child = _pid_of(db, job_id)
    next_id, _ = queue.enqueue(brooq.Job("c.async"))
    _started(db, next_id)
    assert _pid_of(db, next_id) == child
    assert "event=child_killed" not in m.log()


def test_the_cli_the_admin_endpoint_cancel_async_and_the_callers_transaction_cancel_at_once(
    start_master: Callable[..., MasterProcess],
    queue: brooq.Queue,
    db: psycopg.Connection[Any],
    dsn: str,
    tmp_path: Path,
) -> None:
    token = "t0k3n-" + "x" * 26
    token_file = tmp_path / "admin-token"
    token_file.write_text(token + "\n")
    m = start_master(
        workers=2, app=APP, env={**SLOW_RENEWAL, "QUEUE_ADMIN_TOKEN_FILE": str(token_file)}
    )
    # `brooq cancel ID`
    by_cli, _ = queue.enqueue(brooq.Job("c.sleep"))
    _started(db, by_cli)
    done = subprocess.run(
        [sys.executable, "-m", "brooq", "--database", dsn, "cancel", str(by_cli)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert _heard_after(db, by_cli) < AT_ONCE
    _canceled_and_kept(db, by_cli, m)
    # POST /admin/jobs/<id>/cancel: the master's own connection sends what it hears.
    by_admin, _ = queue.enqueue(brooq.Job("c.sleep"))
    _started(db, by_admin)
    status, body = get(ops_addr(m), f"/admin/jobs/{by_admin}/cancel", token=token, method="POST")
    assert status == 200 and json.loads(body)["ok"] is True
    assert _heard_after(db, by_admin) < AT_ONCE
    _canceled_and_kept(db, by_admin, m)
    # queue.cancel_async, on the async pool.
    by_async, _ = queue.enqueue(brooq.Job("c.sleep"))
    _started(db, by_async)
    assert asyncio.run(_cancel_async(queue, by_async)) is True
    assert _heard_after(db, by_async) < AT_ONCE
    _canceled_and_kept(db, by_async, m)
    # brooq.cancel in the caller's own transaction: nothing until it commits, a rollback
    # stops nothing.
    in_tx, _ = queue.enqueue(brooq.Job("c.sleep"))
    _started(db, in_tx)
    with psycopg.connect(dsn) as conn:
        assert brooq.cancel(conn, in_tx) is True
        conn.rollback()
    with psycopg.connect(dsn) as conn:
        assert brooq.cancel(conn, in_tx) is True
        # Not committed yet: the handler runs on (the notification waits for the commit).
        wait_for(lambda: _row(db, in_tx)[0] == "processing", what="still processing")
        assert "lease_lost" not in _notes(db, in_tx)
        conn.commit()
        committed = db.execute("SELECT clock_timestamp()").fetchone()
    assert committed is not None
    assert _heard_after(db, in_tx, since=committed[0]) < AT_ONCE
    _canceled_and_kept(db, in_tx, m)


async def _cancel_async(queue: brooq.Queue, job_id: Any) -> bool:
    try:
        return await queue.cancel_async(job_id)
    finally:
        await queue.close_async()


def test_with_two_masters_the_cancel_reaches_the_child_of_the_one_holding_the_job(
    start_master: Callable[..., MasterProcess],
    queue: brooq.Queue,
    db: psycopg.Connection[Any],
) -> None:
    masters = [start_master(workers=2, app=APP, env=SLOW_RENEWAL) for _ in range(2)]
    for m in masters:
        m.wait_ready(2)
    jobs = [queue.enqueue(brooq.Job("c.sleep"))[0] for _ in range(2)]
    for job_id in jobs:
        _started(db, job_id)
    owner = {
        job_id: next(m for m in masters if _pid_of(db, job_id) in m.children()) for job_id in jobs
    }
    assert owner[jobs[0]] is not owner[jobs[1]]  # one sync child each
    target, other = jobs
    assert queue.cancel(target) is True
    assert _heard_after(db, target) < AT_ONCE
    _canceled_and_kept(db, target, owner[target])
    assert f"event=cancel_heard job={target}" in owner[target].log()
    assert "event=cancel_heard" not in owner[other].log()
    # The other master's job runs on.
    assert _row(db, other)[0] == "processing" and _notes(db, other) == ["start"]


def test_the_pages_cancel_button_stops_a_running_handler_at_once(
    start_master: Callable[..., MasterProcess],
    queue: brooq.Queue,
    db: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    from tests.process.test_status_page import TOKEN, click, request

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    m = start_master(
        workers=2, app=APP, env={**SLOW_RENEWAL, "QUEUE_ADMIN_TOKEN_FILE": str(token_file)}
    )
    host, _, port = ops_addr(m).rpartition(":")
    addr = (host, int(port))
    job_id, _ = queue.enqueue(brooq.Job("c.spin"))
    _started(db, job_id)
    status, head, _ = request(addr, "POST", "/sign-in", f"token={TOKEN}")
    assert status == 303
    cookie = next(h for h in head.split("\r\n") if h.startswith("Set-Cookie:"))
    cookie = cookie.split(":", 1)[1].split(";", 1)[0].strip()
    _, _, page = request(addr, "GET", "/in-flight", cookie=cookie)
    assert b"interrupted at once" in page  # the button's title says what it does
    assert click(addr, page, f"/jobs/{job_id}/cancel", cookie) == (303, "/in-flight")
    assert _heard_after(db, job_id) < AT_ONCE
    _canceled_and_kept(db, job_id, m)
