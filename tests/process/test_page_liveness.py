"""The page process is bounded between requests too, and a bulk action does not hold it:
a page process stopped while idle is killed once it leaves a handed request unstarted
(503 to that client, event=page_process_killed, a new process for the next page); a bulk
retry waiting on a lock runs in a helper process while every other page is answered."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

import brooq
from brooq.supervisor.pagekeeper import START_LIMIT
from tests.harness import StartMaster, process_alive, wait_for
from tests.process.test_ops_sessions import OLD, csrf_of, sign_in
from tests.process.test_ops_slow_clients import ops_addr
from tests.process.test_status_page import get, page_pid, request

# select's (and pselect6's) numbers, by machine: between requests the page process waits
# in it for the master's next message (brooq.page.process), its last request reported.
WAITING = {"x86_64": {"23", "270"}, "aarch64": {"72"}}.get(os.uname().machine)


def between_requests(pid: int) -> bool:
    """Whether the process is blocked in select (/proc/PID/syscall's first field). True
    where that cannot be read: the test then stops it at once."""
    try:
        first = Path(f"/proc/{pid}/syscall").read_text().split()[0]
    except (OSError, IndexError):
        return True
    return WAITING is None or first in WAITING


def test_a_page_process_stopped_between_requests_is_killed_and_replaced(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    m = start_master(workers=1)
    addr = ops_addr(m)
    assert get(addr, "/")[0] == 200
    first = page_pid(m.pid)
    assert first is not None
    # The client sees the end of its answer before the page process reports the request
    # ended: stopped in between, it would hold a request the master thinks is running.
    wait_for(lambda: between_requests(first), timeout=5, what="the page process idle")
    os.kill(first, signal.SIGSTOP)  # idle: no request of its own is running
    started = time.monotonic()
    status, _, body = get(addr, "/", timeout=START_LIMIT + 15)
    waited = time.monotonic() - started
    assert status == 503 and b"did not answer" in body, (status, body)
    found = re.search(
        r"event=page_process_killed reason=request_not_started pid=(\d+) path='/' took=([\d.]+)s",
        m.log(),
    )
    assert found is not None and int(found.group(1)) == first, m.log()[-3000:]
    wait_for(lambda: not process_alive(first), timeout=5, what="the stopped process gone")
    assert get(addr, "/")[0] == 200  # a new one, forked for this request
    second = page_pid(m.pid)
    assert second is not None and second != first
    print(f"\n[stopped page process] killed after {found.group(2)} s; 503 after {waited:.1f} s")


def test_pages_are_answered_while_a_bulk_action_waits_on_a_lock(
    queue: brooq.Queue,
    db: psycopg.Connection,
    start_master: StartMaster,
    tmp_path: Path,
    connect: Any,
) -> None:
    (tmp_path / "token").write_text(OLD)
    m = start_master(
        workers=1,
        app="brooq_opsslow:queue",
        env={"QUEUE_ADMIN_TOKEN_FILE": str(tmp_path / "token")},
    )
    addr = ops_addr(m)
    ids = [queue.enqueue(brooq.Job("ops.none", {"n": n}))[0] for n in range(30)]
    db.execute("UPDATE job SET state = 'dead' WHERE id = ANY(%s)", (ids,))
    db.commit()
    _, cookie = sign_in(addr, OLD)
    csrf = csrf_of(addr, cookie)
    pages = page_pid(m.pid)
    # SHARE mode: reads go on, the bulk retry's UPDATE waits until it is released.
    locker = connect(autocommit=False)
    locker.execute("LOCK TABLE job IN SHARE MODE")
    answer: list[tuple[int, str, bytes]] = []
    form = f"topic=ops.none&state=dead&csrf={csrf}"
    bulk = threading.Thread(
        target=lambda: answer.append(request(addr, "POST", "/bulk/retry", form, cookie, timeout=60))
    )
    bulk.start()
    try:
        wait_for(
            lambda: db.execute(
                # The statement's first words: pg_stat_activity keeps its first 1 kB.
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%%One batch of a bulk retry%%'"
            ).fetchone(),
            what="the bulk retry waiting on the lock",
        )
        # Past the page process's silence bound, every page is answered and it lives.
        until = time.monotonic() + START_LIMIT + 1
        answered = 0
        while time.monotonic() < until:
            for target in ("/", "/dead", "/actions"):
                status, _, _ = request(addr, "GET", target, cookie=cookie, timeout=5)
                assert status == 200, target
                answered += 1
            time.sleep(0.2)
        # A second bulk action waits for the first to end.
        status, _, body = request(addr, "POST", "/bulk/cancel", form, cookie, timeout=5)
        assert status == 503 and b"bulk action has been running" in body
        assert bulk.is_alive() and not answer  # still waiting: the pages did not
        assert page_pid(m.pid) == pages and "event=page_process_killed" not in m.log()
    finally:
        locker.rollback()
    bulk.join(30)
    status, _, body = answer[0]
    assert status == 200 and b"30 matched, 30 changed" in body, body
    assert db.execute("SELECT count(*) FROM job WHERE state = 'pending'").fetchone() == (30,)
    # The helper ends (reaped by the page process, which stays the same).
    wait_for(lambda: not _children_of(pages), timeout=5, what="the bulk helper reaped")
    assert page_pid(m.pid) == pages
    print(f"\n[bulk action under a lock] {answered} pages answered while it waited")


def _children_of(ppid: int | None) -> list[int]:
    """Processes whose parent is ppid (zombies included: a helper not reaped yet)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == ppid:
            found.append(int(entry))
    return found
