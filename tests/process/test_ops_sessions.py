"""The status page's sessions under a real master: a new admin token (SIGHUP, or its
file changed) signs everyone out and works at once, in the master and the page process;
sign-out ends the session on the server, across a new page process too; the stack
button needs a session and a request from this site; a wrong token keeps no one out."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import psycopg
import pytest

import brooq
from tests.harness import MasterProcess, StartMaster, wait_for
from tests.process.test_ops_slow_clients import ops_addr
from tests.process.test_status_page import page_pid, request

OLD = "the-first-admin-token-0123456789"
NEW = "the-second-admin-token-987654321"
NOBODY = "00000000-0000-4000-8000-000000000000"


def bearer(addr: tuple[str, int], token: str) -> int:
    """The status of an admin POST for an unknown job: 404 once the token is taken."""
    extra = f"Authorization: Bearer {token}"
    return request(addr, "POST", f"/admin/jobs/{NOBODY}/cancel", extra=extra)[0]


def sign_in(addr: tuple[str, int], token: str) -> tuple[int, str]:
    """(status, the session cookie or "")."""
    status, head, _ = request(addr, "POST", "/sign-in", f"token={token}")
    found = re.search(r"Set-Cookie: (brooq_session=[^;]+)", head)
    return status, found.group(1) if found else ""


def csrf_of(addr: tuple[str, int], cookie: str) -> str:
    _, _, body = request(addr, "GET", "/actions", cookie=cookie)
    found = re.search(rb'name="csrf" value="([0-9a-f]+)"', body)
    return found.group(1).decode() if found else ""


def pause(addr: tuple[str, int], cookie: str, csrf: str, queue: str = "q1") -> int:
    return request(addr, "POST", f"/queues/{queue}/pause", f"csrf={csrf}", cookie)[0]


def start(start_master: StartMaster, token_file: Path) -> tuple[MasterProcess, tuple[str, int]]:
    token_file.write_text(OLD + "\n")
    m = start_master(
        workers=1, app="brooq_opsslow:queue", env={"QUEUE_ADMIN_TOKEN_FILE": str(token_file)}
    )
    return m, ops_addr(m)


@pytest.mark.parametrize("how", ["sighup", "file"])
def test_a_new_token_signs_everyone_out_and_works_at_once(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster, tmp_path: Path, how: str
) -> None:
    token_file = tmp_path / "token"
    m, addr = start(start_master, token_file)
    status, cookie = sign_in(addr, OLD)
    assert status == 303 and cookie
    csrf = csrf_of(addr, cookie)
    assert csrf and bearer(addr, OLD) == 404 and bearer(addr, NEW) == 401
    assert page_pid(m.pid) is not None  # the page process runs: it must be told

    if how == "sighup":
        # The same size, inode and modification time: only the signal can show it.
        st = token_file.stat()
        with open(token_file, "r+") as f:
            f.write(NEW[: len(OLD)].ljust(len(OLD), "x") + "\n")
        os.utime(token_file, ns=(st.st_atime_ns, st.st_mtime_ns))
        new = NEW[: len(OLD)].ljust(len(OLD), "x")
        m.signal(signal.SIGHUP)
    else:
        new = NEW
        (tmp_path / "token.next").write_text(NEW + "\n")
        (tmp_path / "token.next").rename(token_file)  # as a deploy tool writes it
    wait_for(lambda: bearer(addr, new) == 404, timeout=10, what="the new bearer token taken")
    assert "event=admin_token_changed" in m.log()
    # The old token is refused everywhere; its session is gone; the new one signs in.
    assert bearer(addr, OLD) == 401
    assert csrf_of(addr, cookie) == ""
    assert pause(addr, cookie, csrf) == 403
    assert sign_in(addr, OLD)[0] == 401
    status, fresh = sign_in(addr, new)
    assert status == 303
    assert pause(addr, fresh, csrf_of(addr, fresh)) == 303
    assert [q.name for q in queue.queues() if q.paused] == ["q1"]
    assert OLD not in m.log() and new not in m.log()


def test_sign_out_ends_the_session_on_the_server_even_in_a_new_page_process(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster, tmp_path: Path
) -> None:
    m, addr = start(start_master, tmp_path / "token")
    _, leaving = sign_in(addr, OLD)
    _, staying = sign_in(addr, OLD)
    leaving_csrf, staying_csrf = csrf_of(addr, leaving), csrf_of(addr, staying)
    assert request(addr, "POST", "/sign-out", f"csrf={leaving_csrf}", leaving)[0] == 303
    # A copy of the signed-out cookie (the browser dropped its own) acts no more.
    assert csrf_of(addr, leaving) == ""
    assert pause(addr, leaving, leaving_csrf) == 403
    # The master keeps it for the next page process.
    first = page_pid(m.pid)
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: "event=pages_exited" in m.log(), what="the master saw it go")
    wait_for(lambda: request(addr, "GET", "/")[0] == 200, timeout=10, what="a new one")
    assert page_pid(m.pid) not in (None, first)
    assert pause(addr, leaving, leaving_csrf) == 403
    # Another session is not touched.
    assert pause(addr, staying, staying_csrf) == 303
    assert [q.name for q in queue.queues() if q.paused] == ["q1"]


def test_the_stack_button_needs_a_session_and_this_site(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster, tmp_path: Path
) -> None:
    m, addr = start(start_master, tmp_path / "token")
    job_id, _ = queue.enqueue(brooq.Job("ops.none"))
    target = f"/jobs/{job_id}/stack"
    status, _, body = request(addr, "POST", target)
    assert status == 403 and b"Sign in first" in body
    _, cookie = sign_in(addr, OLD)
    csrf = csrf_of(addr, cookie)
    for extra in ("Sec-Fetch-Site: cross-site", "Origin: http://evil.example"):
        status, _, body = request(addr, "POST", target, f"csrf={csrf}", cookie, extra=extra)
        assert status == 403 and b"another site" in body, extra
    assert request(addr, "POST", target, "csrf=0", cookie)[0] == 403
    # Signed in, from here: asked (the job is not running: the refusal of `brooq jobs stack`).
    status, _, body = request(addr, "POST", target, f"csrf={csrf}", cookie)
    assert status == 409 and b"is not running" in body
    assert "event=stack_requested" not in m.log()


def test_a_wrong_token_keeps_no_one_out(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster, tmp_path: Path
) -> None:
    m, addr = start(start_master, tmp_path / "token")
    assert sign_in(addr, "a-wrong-token-a-wrong-token")[0] == 401
    # From the same address, at once: the right token signs in.
    assert sign_in(addr, OLD)[0] == 303
    assert "event=page_sign_in_failed" in m.log()
