"""The status page served by a real master: rendered by a process of
its own, so the master's loop keeps its timing while pages are rendered, while clients
hold half-sent page requests open, and under a burst of page requests; the page process
is forked on demand, again after it died, and never outlives its master."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

import brooq
from brooq.supervisor.pagekeeper import PAGE_LIMIT
from tests.harness import StartMaster, children_of, process_alive, wait_for
from tests.process.test_ops_slow_clients import (
    KILL_SLACK,
    PROBE_BOUND,
    hang,
    kill_lateness,
    probe_for,
    report,
    start,
    wait_for_kill,
)


def get(addr: tuple[str, int], target: str, timeout: float = 5.0) -> tuple[int, bytes, bytes]:
    """(status, head, body) of one GET; status 0 when nothing came back."""
    with socket.create_connection(addr, timeout=timeout) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/"):
        return 0, head, body
    return int(head.split()[1]), head, body


def page_pid(master_pid: int) -> int | None:
    for pid in children_of(master_pid):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"brooq-pages"):
                return pid
        except OSError:
            continue
    return None


def pipes_of(pid: int) -> set[str]:
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("pipe:"):
            found.add(target)
    return found


def test_a_job_page_through_the_master_is_escaped_and_carries_its_headers(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    m, addr = start(start_master)
    assert page_pid(m.pid) is None  # forked at the first page request, not before
    job_id, _ = queue.enqueue(brooq.Job("ops.ok", {"note": "<script>alert('x')</script>"}))
    status, head, body = get(addr, f"/jobs/{job_id}")
    assert status == 200, head
    assert b"&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in body
    assert b"<script>alert" not in body
    headers = head.decode("latin-1").lower()
    assert "content-security-policy: default-src 'none'" in headers
    assert "x-content-type-options: nosniff" in headers
    assert headers.count("cache-control") == 1
    status, _, body = get(addr, "/")
    assert status == 200 and b"<!DOCTYPE html>" in body
    assert page_pid(m.pid) is not None
    assert get(addr, "/healthz")[0] == 200  # the master's own endpoints as before


def test_pages_never_hold_the_master_under_a_burst_and_half_sent_requests(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    m, addr = start(start_master)
    assert get(addr, "/")[0] == 200  # the page process is up
    held = []
    for _ in range(50):
        s = socket.create_connection(addr)
        s.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n")  # unfinished
        held.append(s)
    statuses: list[int] = []
    stop = threading.Event()

    def burst() -> None:
        while not stop.is_set():
            for target in ("/", "/in-flight", "/failed", "/dead"):
                try:
                    statuses.append(get(addr, target)[0])
                except OSError:
                    statuses.append(-1)

    threads = [threading.Thread(target=burst, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        hang(queue)
        latencies = probe_for(addr, 6.5)
        lateness = kill_lateness(m)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        for s in held:
            s.close()
    report("page burst + 50 half-sent", latencies, lateness)
    assert max(latencies) < PROBE_BOUND, latencies
    assert wait_for_kill(m, 3.0) <= KILL_SLACK
    assert len(statuses) > 20 and statuses.count(200) > len(statuses) // 2, statuses[:50]
    assert set(statuses) <= {200, 503}, sorted(set(statuses))
    assert m.proc.poll() is None


def test_a_dead_page_process_is_forked_again_and_none_outlives_the_master(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    m, addr = start(start_master)
    assert get(addr, "/")[0] == 200
    first = page_pid(m.pid)
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: "event=pages_exited" in m.log(), what="the master saw it")
    # The next request forks it again (at most one fork a second).
    status = wait_for(lambda: get(addr, "/")[0] == 200, timeout=10, what="a page again")
    assert status
    second = page_pid(m.pid)
    assert second is not None and second != first
    m.signal(signal.SIGTERM)
    assert m.wait() == 0
    wait_for(lambda: not process_alive(second), timeout=5, what="the page process gone")


def test_the_page_process_ends_when_its_master_is_killed(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    m, addr = start(start_master)
    assert get(addr, "/")[0] == 200
    pid = page_pid(m.pid)
    assert pid is not None
    kids = m.children()
    # It holds none of the workers' pipes: a worker sees its master's end close.
    for kid in kids:
        if kid != pid:
            assert not pipes_of(pid) & pipes_of(kid), (pipes_of(pid), pipes_of(kid))
    m.proc.kill()
    m.proc.wait(5)
    wait_for(lambda: not process_alive(pid), timeout=5, what="the page process gone")
    # The workers still see their master's end of the pipe close (the page process
    # does not hold it): they leave within a renewal period.
    wait_for(
        lambda: not any(process_alive(k) for k in kids if k != pid),
        timeout=15,
        what="workers gone",
    )


def post(addr: tuple[str, int], target: str, timeout: float = 10.0) -> tuple[int, bytes]:
    with socket.create_connection(addr, timeout=timeout) as s:
        s.sendall(
            f"POST {target} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n".encode()
        )
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_the_stack_button_shows_the_running_jobs_traceback(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text(TOKEN)
    m = start_master(workers=1, env={"QUEUE_ADMIN_TOKEN_FILE": str(tmp_path / "token")})
    found = wait_for(lambda: re.search(r"event=ops_listening addr=(\S+)", m.log()), what="ops")
    host, _, port = found.group(1).rpartition(":")
    addr = (host, int(port))
    _, head, _ = request(addr, "POST", "/sign-in", f"token={TOKEN}")
    cookie = head.split("Set-Cookie: ", 1)[1].split(";", 1)[0]
    _, _, page = request(addr, "GET", "/actions", cookie=cookie)
    csrf = re.search(rb'name="csrf" value="([0-9a-f]+)"', page)
    assert csrf is not None
    signed = f"csrf={csrf.group(1).decode()}"
    job_id, _ = queue.enqueue(brooq.Job("t.ok", {"sleep": 20}))
    wait_for(
        lambda: (
            db.execute("SELECT state FROM job_all WHERE id = %s", (job_id,)).fetchone()
            == ("processing",)
        ),
        what="running",
    )

    _, _, page = request(addr, "GET", f"/jobs/{job_id}", cookie=cookie)
    assert f'action="/jobs/{job_id}/stack"' in page.decode()  # the button, signed in

    def shown() -> bytes | None:
        status, _, body = request(addr, "POST", f"/jobs/{job_id}/stack", signed, cookie)
        return body if status == 200 else None

    body = wait_for(shown, what="the stack page")
    assert b"Traceback (most recent call last):" in body
    assert (
        b"brooq_testapp.py" in body
        and b"time.sleep(float(claim.payload[&quot;sleep&quot;]))" in body
    )
    queue.cancel(job_id)
    done, _ = queue.enqueue(brooq.Job("t.ok"))
    wait_for(
        lambda: (
            db.execute("SELECT state FROM job_all WHERE id = %s", (done,)).fetchone() == ("done",)
        ),
        what="done",
    )
    status, _, body = request(addr, "POST", f"/jobs/{done}/stack", signed, cookie)
    assert status == 409 and b"is not running (state: done)" in body
    assert post(addr, f"/jobs/{done}/stack")[0] == 403  # signed out: refused


# -- sign-in and actions -------------------------------------------------------------------

TOKEN = "a-status-page-token-0123456789"


def request(
    addr: tuple[str, int],
    method: str,
    target: str,
    body: str = "",
    cookie: str = "",
    extra: str = "",
    timeout: float = 10.0,
) -> tuple[int, str, bytes]:
    head = f"{method} {target} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(body)}\r\n"
    if extra:
        head += extra + "\r\n"
    head += "Content-Type: application/x-www-form-urlencoded\r\n"
    if cookie:
        head += f"Cookie: {cookie}\r\n"
    with socket.create_connection(addr, timeout=timeout) as s:
        s.sendall((head + "\r\n" + body).encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    raw_head, _, raw_body = data.partition(b"\r\n\r\n")
    text = raw_head.decode("latin-1")
    return int(text.split()[1]), text, raw_body


def test_signing_in_with_the_token_then_acting_through_the_forms(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    m = start_master(
        workers=1, app="brooq_opsslow:queue", env={"QUEUE_ADMIN_TOKEN_FILE": str(token_file)}
    )
    found = wait_for(lambda: re.search(r"event=ops_listening addr=(\S+)", m.log()), what="ops")
    host, _, port = found.group(1).rpartition(":")
    addr = (host, int(port))
    dead = [queue.enqueue(brooq.Job("ops.none", {"n": i}))[0] for i in range(3)]
    db.execute("UPDATE job SET state = 'dead' WHERE id = ANY(%s)", (dead,))
    db.commit()
    seen: list[bytes] = []

    status, _, body = request(addr, "GET", "/sign-in")
    seen.append(body)
    assert status == 200 and b'type="password"' in body
    status, _, body = request(addr, "POST", "/sign-in", "token=wrong-token-wrong-token")
    seen.append(body)
    assert status == 401
    status, head, _ = request(addr, "POST", "/sign-in", f"token={TOKEN}")
    assert status == 303
    cookie_line = next(line for line in head.split("\r\n") if line.startswith("Set-Cookie:"))
    assert "HttpOnly" in cookie_line and "SameSite=Strict" in cookie_line
    assert "Max-Age=" in cookie_line and TOKEN not in cookie_line
    cookie = cookie_line.split(":", 1)[1].split(";", 1)[0].strip()

    # Without the form's CSRF token, or without the session, nothing changes.
    assert request(addr, "POST", "/bulk/retry", "topic=ops.none&state=dead", cookie)[0] == 403
    status, _, body = request(addr, "GET", f"/actions?job={dead[0]}", cookie=cookie)
    seen.append(body)
    csrf = re.search(rb'name="csrf" value="([0-9a-f]+)"', body)
    assert status == 200 and csrf is not None
    token_field = f"csrf={csrf.group(1).decode()}"
    assert (
        request(addr, "POST", "/bulk/retry", f"topic=ops.none&state=dead&{token_field}")[0] == 403
    )
    assert db.execute("SELECT count(*) FROM job_all WHERE state = 'dead'").fetchone() == (3,)

    # One job by its form, then the rest in bulk, then a queue paused.
    status, head, _ = request(addr, "POST", f"/jobs/{dead[0]}/retry", token_field, cookie)
    assert status == 303 and f"Location: /jobs/{dead[0]}" in head
    assert db.execute("SELECT state FROM job_all WHERE id = %s", (dead[0],)).fetchone() == (
        "pending",
    )
    status, _, body = request(
        addr, "POST", "/bulk/retry", f"topic=ops.none&state=dead&{token_field}", cookie
    )
    seen.append(body)
    assert status == 200 and b"2 matched, 2 changed" in body
    assert request(addr, "POST", "/queues/bulk/pause", token_field, cookie)[0] == 303
    assert [q.name for q in queue.queues() if q.paused] == ["bulk"]
    status, _, body = request(addr, "POST", f"/jobs/{dead[0]}/retry", token_field, cookie)
    seen.append(body)
    assert status == 409 and b"pending" in body  # refused, worded as for the CLI
    # A form posted from another site is refused, session and CSRF token or not.
    for header in ("Origin: http://evil.example", "Sec-Fetch-Site: cross-site"):
        status, _, _ = request(
            addr, "POST", "/queues/other/pause", token_field, cookie, extra=header
        )
        assert status == 403, header
    assert [q.name for q in queue.queues() if q.paused] == ["bulk"]
    assert request(addr, "POST", "/sign-out", token_field, cookie)[0] == 303
    # The token is in no page and no log line.
    assert all(TOKEN.encode() not in b for b in seen)
    assert TOKEN not in m.log()


def test_without_a_token_every_action_is_refused(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    _, addr = start(start_master)
    status, _, body = request(addr, "POST", "/sign-in", "token=anything-at-all-long-enough")
    assert status == 403 and b"No admin token is configured" in body
    status, _, body = request(addr, "GET", "/actions")
    assert status == 200 and b"Actions are off" in body
    assert request(addr, "POST", "/queues/default/pause", "csrf=x")[0] == 403
    assert not [q for q in queue.queues() if q.paused]


FORM = re.compile(
    r'<form class="inline" method="post" action="([^"]+)">'
    r'<input type="hidden" name="csrf" value="([0-9a-f]+)">'
    r'<input type="hidden" name="back" value="([^"]*)">'
)


def forms(body: bytes) -> dict[str, tuple[str, str]]:
    """The one-click buttons of a page: {action: (csrf, back)}."""
    return {a: (c, b) for a, c, b in FORM.findall(body.decode())}


def click(addr: tuple[str, int], page: bytes, action: str, cookie: str) -> tuple[int, str]:
    csrf, back = forms(page)[action]
    status, head, _ = request(addr, "POST", action, f"csrf={csrf}&back={back}", cookie)
    location = next((h for h in head.split("\r\n") if h.startswith("Location:")), "")
    return status, location.removeprefix("Location: ")


def test_the_lists_carry_one_click_buttons_when_signed_in(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    m = start_master(
        workers=1, app="brooq_opsslow:queue", env={"QUEUE_ADMIN_TOKEN_FILE": str(token_file)}
    )
    found = wait_for(lambda: re.search(r"event=ops_listening addr=(\S+)", m.log()), what="ops")
    host, _, port = found.group(1).rpartition(":")
    addr = (host, int(port))
    dead, failed, running = (queue.enqueue(brooq.Job("ops.none", {"n": i}))[0] for i in range(3))
    db.execute("UPDATE job SET state = 'dead' WHERE id = %s", (dead,))
    db.execute(
        "UPDATE job SET state = 'failed', available_at = now() + interval '1 hour' WHERE id = %s",
        (failed,),
    )
    db.execute(
        "UPDATE job SET state = 'processing', locked_by = 'elsewhere:1:x', "
        "locked_until = now() + interval '1 hour' WHERE id = %s",
        (running,),
    )
    db.execute("INSERT INTO brooq_queue (name, paused) VALUES ('stopped', true)")
    db.commit()

    # Signed out: no buttons; the page says how to get them.
    status, _, body = request(addr, "GET", "/dead")
    assert status == 200 and not forms(body) and b'href="/sign-in"' in body

    status, head, _ = request(addr, "POST", "/sign-in", f"token={TOKEN}")
    assert status == 303
    cookie = next(h for h in head.split("\r\n") if h.startswith("Set-Cookie:"))
    cookie = cookie.split(":", 1)[1].split(";", 1)[0].strip()

    _, _, page = request(addr, "GET", "/dead", cookie=cookie)
    assert b"Signed in" in page and TOKEN.encode() not in page
    assert click(addr, page, f"/jobs/{dead}/retry", cookie) == (303, "/dead")
    assert db.execute("SELECT state FROM job_all WHERE id = %s", (dead,)).fetchone() == ("pending",)

    _, _, page = request(addr, "GET", "/failed", cookie=cookie)
    assert f"/jobs/{failed}/retry" not in forms(page)  # a failed job waits for its retry
    assert click(addr, page, f"/jobs/{failed}/cancel", cookie) == (303, "/failed")
    assert db.execute("SELECT state FROM job_all WHERE id = %s", (failed,)).fetchone() == (
        "canceled",
    )

    _, _, page = request(addr, "GET", "/in-flight", cookie=cookie)
    assert click(addr, page, f"/jobs/{running}/cancel", cookie) == (303, "/in-flight")
    assert db.execute("SELECT state FROM job_all WHERE id = %s", (running,)).fetchone() == (
        "canceled",
    )

    # The overview: pause a queue from its row, resume the paused one from its list.
    _, _, page = request(addr, "GET", "/", cookie=cookie)
    assert click(addr, page, "/queues/default/pause", cookie) == (303, "/")
    assert click(addr, page, "/queues/stopped/resume", cookie) == (303, "/")
    assert [q.name for q in queue.queues() if q.paused] == ["default"]

    # A button's form is the action's own: without its CSRF token, refused; a `back`
    # that is not one of the pages is ignored (no open redirect).
    _, _, page = request(addr, "GET", "/", cookie=cookie)
    assert request(addr, "POST", "/queues/default/resume", "back=/", cookie)[0] == 403
    csrf, _ = forms(page)["/queues/default/resume"]
    status, head, _ = request(
        addr, "POST", "/queues/default/resume", f"csrf={csrf}&back=//evil.example/", cookie
    )
    assert status == 303 and "Location: /\r\n" in head + "\r\n"
    assert not [q.name for q in queue.queues() if q.paused]
    # A refusal comes back with a way back to the list.
    _, _, page = request(addr, "GET", "/in-flight", cookie=cookie)
    status, _, body = request(
        addr, "POST", f"/jobs/{running}/cancel", f"csrf={csrf}&back=/in-flight", cookie
    )
    assert status == 409 and b'href="/in-flight"' in body
    assert TOKEN not in m.log()


def test_a_job_page_holds_releases_and_cancels_with_its_buttons(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster, tmp_path: Path
) -> None:
    """Through the master and its page process: a pending job's page has hold and cancel,
    a held one's release and cancel; each click comes back to the job's page with the
    job moved; the bulk hold and release of a topic are answered by the bulk helper."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    m = start_master(
        workers=1, app="brooq_opsslow:queue", env={"QUEUE_ADMIN_TOKEN_FILE": str(token_file)}
    )
    found = wait_for(lambda: re.search(r"event=ops_listening addr=(\S+)", m.log()), what="ops")
    host, _, port = found.group(1).rpartition(":")
    addr = (host, int(port))
    job_id, _ = queue.enqueue(brooq.Job("ops.none"))  # no handler here: it stays pending
    others = [queue.enqueue(brooq.Job("ops.none", {"n": i}))[0] for i in range(3)]

    def job_state() -> str:
        row = db.execute("SELECT state FROM job_all WHERE id = %s", (job_id,)).fetchone()
        assert row is not None
        return str(row[0])

    status, head, _ = request(addr, "POST", "/sign-in", f"token={TOKEN}")
    assert status == 303
    cookie = next(h for h in head.split("\r\n") if h.startswith("Set-Cookie:"))
    cookie = cookie.split(":", 1)[1].split(";", 1)[0].strip()
    page_path = f"/jobs/{job_id}"

    _, _, page = request(addr, "GET", page_path, cookie=cookie)
    assert set(forms(page)) == {f"{page_path}/hold", f"{page_path}/cancel"}
    assert click(addr, page, f"{page_path}/hold", cookie) == (303, page_path)
    assert job_state() == "on_hold"
    _, _, page = request(addr, "GET", page_path, cookie=cookie)
    assert b'<span class="state">on_hold</span>' in page
    assert set(forms(page)) == {f"{page_path}/release", f"{page_path}/cancel"}
    assert click(addr, page, f"{page_path}/release", cookie) == (303, page_path)
    assert job_state() == "pending"
    # A held job canceled from its page.
    _, _, page = request(addr, "GET", page_path, cookie=cookie)
    assert click(addr, page, f"{page_path}/hold", cookie) == (303, page_path)
    _, _, page = request(addr, "GET", page_path, cookie=cookie)
    assert click(addr, page, f"{page_path}/cancel", cookie) == (303, page_path)
    assert job_state() == "canceled"
    _, _, page = request(addr, "GET", page_path, cookie=cookie)
    assert set(forms(page)) == {f"{page_path}/retry"}
    # Signed out: no button, and a POST is refused.
    _, _, page = request(addr, "GET", page_path)
    assert not forms(page)
    assert request(addr, "POST", f"/jobs/{others[0]}/hold", "csrf=x", cookie)[0] == 403

    # In bulk, from the forms of /actions.
    _, _, page = request(addr, "GET", "/actions", cookie=cookie)
    csrf = re.search(rb'name="csrf" value="([0-9a-f]+)"', page)
    assert csrf is not None and b'action="/bulk/hold"' in page and b'action="/bulk/release"' in page
    signed = f"csrf={csrf.group(1).decode()}"
    status, _, body = request(
        addr, "POST", "/bulk/hold", f"topic=ops.none&state=pending&{signed}", cookie
    )
    assert status == 200 and b"3 matched, 3 changed." in body
    held = db.execute("SELECT count(*) FROM job WHERE state = 'on_hold'").fetchone()
    assert held == (3,)
    _, _, page = request(addr, "GET", "/on-hold", cookie=cookie)
    assert {f"/jobs/{o}/release" for o in others} <= set(forms(page))
    status, _, body = request(addr, "POST", "/bulk/release", f"topic=ops.none&{signed}", cookie)
    assert status == 200 and b"3 matched, 3 changed." in body
    assert db.execute("SELECT count(*) FROM job WHERE state = 'pending'").fetchone() == (3,)
    assert TOKEN not in m.log()


def test_a_wedged_page_process_is_killed_and_the_next_page_has_a_new_one(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster, connect: Any
) -> None:
    """A page request that never ends (here: the page process stopped while its read
    waits behind a lock) is bounded by the master: past PAGE_LIMIT it kills the process,
    answers that client 503, and the next page request is answered by a new one; the
    master's own endpoints answer throughout, and the copies of the handed clients are
    closed after each request (the master's descriptors do not grow)."""
    m, addr = start(start_master)
    assert get(addr, "/")[0] == 200
    first = page_pid(m.pid)
    assert first is not None
    fds = len(os.listdir(f"/proc/{m.pid}/fd"))
    for _ in range(20):
        assert get(addr, "/failed")[0] == 200
    wait_for(lambda: len(os.listdir(f"/proc/{m.pid}/fd")) <= fds, what="no client copy left")

    locker = connect(autocommit=False)
    locker.execute("LOCK TABLE job IN ACCESS EXCLUSIVE MODE")
    answer: list[tuple[int, bytes, bytes]] = []
    wedged = threading.Thread(target=lambda: answer.append(get(addr, "/", timeout=30)))
    started = time.monotonic()
    wedged.start()
    try:
        wait_for(
            lambda: db.execute(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = 'brooq-pages' "
                "AND wait_event_type = 'Lock'"
            ).fetchone(),
            what="the page process waiting in its read",
        )
        os.kill(first, signal.SIGSTOP)  # wedged in the middle of a request
    finally:
        locker.rollback()
    latencies = probe_for(addr, PAGE_LIMIT - 2)
    wait_for(lambda: "event=page_process_killed" in m.log(), timeout=PAGE_LIMIT, what="killed")
    wedged.join(10)
    took = time.monotonic() - started
    report("wedged page process", latencies, None)
    assert max(latencies) < PROBE_BOUND, latencies
    assert re.search(r"event=page_process_killed reason=request_over_limit .*path='/'", m.log())
    status, _, body = answer[0]
    assert status == 503 and b"took longer than" in body, answer
    assert PAGE_LIMIT <= took < PAGE_LIMIT + 5
    wait_for(lambda: not process_alive(first), timeout=5, what="the wedged process gone")
    assert get(addr, "/")[0] == 200
    second = page_pid(m.pid)
    assert second is not None and second != first
    assert get(addr, "/healthz")[0] == 200 and m.proc.poll() is None
