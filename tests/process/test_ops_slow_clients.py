"""Slow and hostile ops clients against a real master.

The ops surface shares the master's loop with the watchdog, lease renewal and the
children's pipes, so a client that does not finish its request must never hold that loop:
while such clients are connected, /healthz keeps answering within a second and the hard
timeout (max_execution_timeout) of a hung handler fires on time. And a child must never
block on its pipe to a master that does not read it.

Each scenario prints its figures (healthz latency, lateness of the hard kill); run with
`-s` to see them.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import select
import socket
import statistics
import threading
import time
import uuid
from pathlib import Path

import psycopg
from hypothesis import given, settings
from hypothesis import strategies as st

import brooq
from brooq.ipc.reasons import EXIT_MASTER_GONE
from brooq.opsport import httpmsg
from brooq.settings import Settings
from brooq.supervisor import ops
from brooq.worker.child import Child
from brooq.worker.state import ChildConfig
from tests.harness import MasterProcess, StartMaster, states, wait_for

APP = "brooq_opsslow:queue"
HANG_LIMIT = 2.0  # max_execution_timeout of ops.hang (tests/apps/brooq_opsslow.py)
KILL_SLACK = 1.5  # the hard kill may come this much after the limit, no later
PROBE_BOUND = 1.0  # /healthz answers within a second, whatever the clients do


def ops_addr(m: MasterProcess) -> tuple[str, int]:
    found = wait_for(lambda: re.search(r"event=ops_listening addr=(\S+)", m.log()), what="ops")
    host, _, port = found.group(1).rpartition(":")
    return host, int(port)


def healthz(addr: tuple[str, int], timeout: float = 2.0) -> float:
    """Seconds /healthz took to answer 200 completely; inf when it did not."""
    started = time.monotonic()
    try:
        with socket.create_connection(addr, timeout=timeout) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: brooq\r\n\r\n")
            data = b""
            while chunk := s.recv(4096):
                data += chunk
                if time.monotonic() - started > timeout:
                    return float("inf")
    except OSError:
        return float("inf")
    if not data.startswith(b"HTTP/1.0 200 ") or not data.endswith(b"\r\n\r\nok\n"):
        return float("inf")
    return time.monotonic() - started


def probe_for(addr: tuple[str, int], seconds: float, every: float = 0.5) -> list[float]:
    latencies = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        latencies.append(healthz(addr))
        time.sleep(every)
    return latencies


def kill_lateness(m: MasterProcess) -> float | None:
    """How long after its max_execution_timeout the hung job was killed (from the log)."""
    found = re.search(
        r"event=child_killed .*reason=max_execution_timeout limit=([\d.]+)s ran=([\d.]+)s",
        m.log(),
    )
    return float(found.group(2)) - float(found.group(1)) if found else None


def wait_for_kill(m: MasterProcess, timeout: float) -> float:
    lateness = kill_lateness(m)
    deadline = time.monotonic() + timeout
    while lateness is None and time.monotonic() < deadline:
        time.sleep(0.1)
        lateness = kill_lateness(m)
    assert lateness is not None, "the hung job was never killed"
    return lateness


def report(name: str, latencies: list[float], lateness: float | None) -> None:
    answered = [x for x in latencies if x != float("inf")]
    print(
        f"\n[{name}] healthz probes={len(latencies)} failed={len(latencies) - len(answered)} "
        f"max={max(latencies):.3f}s p50={statistics.median(latencies):.3f}s; "
        f"hard kill after the limit: {lateness if lateness is None else f'{lateness:.2f}s'}"
    )


def closed_by_server(s: socket.socket) -> bool:
    """True once the server closed (or reset) this connection; never blocks."""
    try:
        readable, _, _ = select.select([s], [], [], 0)
        if not readable:
            return False
        while chunk := s.recv(65536, socket.MSG_DONTWAIT):
            del chunk  # a 408, say: keep reading up to the end
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def start(start_master: StartMaster) -> tuple[MasterProcess, tuple[str, int]]:
    m = start_master(workers=2, app=APP)
    m.wait_ready(2)
    addr = ops_addr(m)
    wait_for(lambda: healthz(addr) < PROBE_BOUND, what="healthz")
    return m, addr


def hang(queue: brooq.Queue) -> uuid.UUID:
    job_id, _ = queue.enqueue(brooq.Job("ops.hang"))
    return job_id


def test_a_header_dripped_a_byte_a_second_does_not_hold_the_master(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    m, addr = start(start_master)
    drip = socket.create_connection(addr)
    drip.sendall(b"GET /healthz HTTP/1.1\r\nX-Drip: ")
    dropped_after: list[float] = []
    stop = threading.Event()

    def dripping() -> None:
        began = time.monotonic()
        while not stop.is_set() and time.monotonic() - began < 8.0:
            try:
                drip.send(b"x")
            except OSError:
                dropped_after.append(time.monotonic() - began)
                return
            if stop.wait(1.0):
                return
            if closed_by_server(drip):
                dropped_after.append(time.monotonic() - began)
                return

    dripper = threading.Thread(target=dripping, daemon=True)
    dripper.start()
    try:
        hang(queue)
        latencies = probe_for(addr, 8.0)
        lateness = kill_lateness(m)
    finally:
        stop.set()
        dripper.join(5)
        drip.close()
    report("drip", latencies, lateness)
    assert max(latencies) < PROBE_BOUND, latencies
    assert wait_for_kill(m, 3.0) <= KILL_SLACK
    # The whole request has a deadline: the dripping client was dropped.
    assert dropped_after and dropped_after[0] < ops.REQUEST_TIMEOUT + 1.5, dropped_after
    assert m.proc.poll() is None


def test_fifty_half_sent_requests_neither_block_healthz_nor_delay_the_hard_kill(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    m, addr = start(start_master)
    held = []
    try:
        for _ in range(50):
            s = socket.create_connection(addr)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: brooq\r\n")  # no blank line: unfinished
            held.append(s)
        hang(queue)
        latencies = probe_for(addr, 6.5)
        lateness = kill_lateness(m)
        report("50 half-sent", latencies, lateness)
        assert max(latencies) < PROBE_BOUND, latencies
        assert wait_for_kill(m, 3.0) <= KILL_SLACK
        # Past the request deadline every one of them was dropped.
        wait_for(lambda: all(closed_by_server(s) for s in held), timeout=3, what="dropped")
    finally:
        for s in held:
            s.close()
    assert m.proc.poll() is None


def test_a_burst_of_connections_beyond_the_cap_is_survived(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    m, addr = start(start_master)
    burst = []
    try:
        for _ in range(200):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            code = s.connect_ex(addr)
            assert code in (0, errno.EINPROGRESS), os.strerror(code)
            burst.append(s)
        hang(queue)
        latencies = probe_for(addr, 5.0, every=0.25)
        lateness = kill_lateness(m)
        report("burst of 200", latencies, lateness)
        assert max(latencies) < PROBE_BOUND, latencies
        assert wait_for_kill(m, 3.0) <= KILL_SLACK
        # Never more than the cap held open: the rest were closed at once.
        assert sum(closed_by_server(s) for s in burst) >= len(burst) - ops.MAX_CONNECTIONS
    finally:
        for s in burst:
            s.close()
    assert m.proc.poll() is None
    queue.enqueue(brooq.Job("ops.ok"))
    wait_for(lambda: states(db).get("done") == 1, what="a job done after the burst")


def _fill(fd: int) -> None:
    os.set_blocking(fd, False)
    for size in (65536, 4096, 512, 64, 1):
        with contextlib.suppress(BlockingIOError):
            while True:
                os.write(fd, b"\n" * size)  # empty lines: the master's reader skips them


def test_a_child_does_not_block_on_a_pipe_its_master_does_not_read(tmp_path: Path) -> None:
    """A real Child (forked, as the master forks it) on a real, full pipe: its messages
    wait, it goes on, and once the master reads again it gets the latest state."""
    c2m_r, c2m_w = os.pipe()
    m2c_r, m2c_w = os.pipe()
    rep_r, rep_w = os.pipe()
    go_r, go_w = os.pipe()
    _fill(c2m_w)
    os.set_blocking(c2m_w, True)  # as the master hands it over
    held = [[str(uuid.uuid4()) for _ in range(i % 5 + 1)] for i in range(50)]
    pid = os.fork()
    if pid == 0:  # the child
        try:
            for fd in (c2m_r, m2c_w, rep_r, go_w):
                os.close(fd)
            child = Child(
                ChildConfig(
                    identity="test:1:abc",
                    dsn="",
                    settings=Settings(lease=0.6),
                    handlers={},
                    to_master=c2m_w,
                    from_master=m2c_r,
                    stack_file=str(tmp_path / "stack.txt"),
                )
            )
            began = time.monotonic()
            child.setup()  # says "ready"
            for h in held:
                child.tell({"held": h})
            child.tell({"retire": "max_jobs"})
            took = time.monotonic() - began
            os.write(rep_w, json.dumps([took, child.master_gone]).encode() + b"\n")
            os.read(go_r, 1)  # the master's read end is closed now
            child.tell({"held": []})
            os.write(rep_w, json.dumps([0, child.master_gone]).encode() + b"\n")
            time.sleep(30)  # the control thread exits when from_master ends
        finally:
            os._exit(1)
    for fd in (c2m_w, m2c_r, rep_w, go_r):
        os.close(fd)
    try:
        readable, _, _ = select.select([rep_r], [], [], 3.0)
        assert readable, "the child blocked writing to its full pipe to the master"
        took, gone = json.loads(os.read(rep_r, 4096))
        assert took < 1.0 and not gone
        # The master reads again: the latest state arrives, whole lines only.
        lines: list[dict[str, object]] = []
        buffer = b""
        deadline = time.monotonic() + 3.0
        while not any("retire" in x for x in lines) and time.monotonic() < deadline:
            if select.select([c2m_r], [], [], 0.1)[0]:
                buffer += os.read(c2m_r, 65536)
                *complete, buffer = buffer.split(b"\n")
                lines.extend(json.loads(x) for x in complete if x)
        assert lines == [{"ready": 1}, {"held": held[-1]}, {"retire": "max_jobs"}]
        # A pipe that is gone still means the master is gone.
        os.close(c2m_r)
        os.write(go_w, b"g")
        readable, _, _ = select.select([rep_r], [], [], 3.0)
        assert readable and json.loads(os.read(rep_r, 4096))[1] is True
        os.close(m2c_w)
        _, status = os.waitpid(pid, 0)
        pid = 0
        assert os.waitstatus_to_exitcode(status) == EXIT_MASTER_GONE
    finally:
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
            os.waitpid(pid, 0)
        for fd in (rep_r, go_w, c2m_r, m2c_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def _exchange(addr: tuple[str, int], *parts: bytes, pause: float = 0.0) -> bytes:
    with socket.create_connection(addr, timeout=3) as s:
        for part in parts:
            s.sendall(part)
            time.sleep(pause)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        return data


def _status_and_headers(data: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    return int(status_line.split()[1]), headers, body


def test_the_hand_written_server_answers_as_before_and_refuses_what_it_cannot_serve(
    start_master: StartMaster, tmp_path: Path
) -> None:
    token = "t0k3n-" + "y" * 26
    (tmp_path / "token").write_text(token + "\n")
    m = start_master(workers=1, app=APP, env={"QUEUE_ADMIN_TOKEN_FILE": str(tmp_path / "token")})
    addr = ops_addr(m)

    def ask(*parts: bytes, pause: float = 0.0) -> tuple[int, dict[str, str], bytes]:
        return _status_and_headers(_exchange(addr, *parts, pause=pause))

    status, headers, body = ask(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (status, body) == (200, b"ok\n")
    assert headers["Content-Type"] == "text/plain" and headers["Content-Length"] == "3"
    assert headers["Cache-Control"] == "no-store" and headers["Connection"] == "close"
    # A request in pieces, bare LF line ends (as http.server took them), a short body.
    pieces = [b"GE", b"T /rea", b"dyz HTTP/1.0\n", b"Content-Length: 2\n\n", b"{}"]
    assert ask(*pieces, pause=0.02)[0] in (200, 503)
    admin = "/admin/jobs/00000000-0000-4000-8000-000000000000/cancel"
    status, headers, body = ask(f"POST {admin} HTTP/1.1\r\n\r\n".encode())
    assert status == 401 and headers["WWW-Authenticate"] == 'Bearer realm="brooq"'
    assert json.loads(body) == {"error": "missing or wrong bearer token"}
    assert headers["Content-Type"] == "application/json"
    status, _, body = ask(
        f"POST {admin} HTTP/1.1\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
    )
    assert status == 404 and "no job with id" in json.loads(body)["error"]
    assert ask(b"GET /nope HTTP/1.1\r\n\r\n")[0] == 404
    assert ask(b"DELETE /healthz HTTP/1.1\r\n\r\n")[0] == 501
    assert ask(b"garbage\r\n\r\n")[0] == 400
    assert ask(b"GET /healthz HTTP/2.0\r\n\r\n")[0] == 505
    assert ask(b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n")[0] == 400
    assert ask(b"GET /healthz HTTP/1.1\r\nX: " + b"a" * (httpmsg.MAX_HEADER_BYTES + 1))[0] == 431
    assert ask(b"GET /" + b"a" * (httpmsg.MAX_HEADER_BYTES + 1))[0] == 414
    big = f"POST {admin} HTTP/1.1\r\nContent-Length: {httpmsg.MAX_BODY_BYTES + 1}\r\n\r\n"
    assert ask(big.encode())[0] == 413
    chunked = f"POST {admin} HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    assert ask(chunked.encode())[0] == 501
    # One request per connection: a second one pipelined behind it is not answered.
    twice = _exchange(addr, b"GET /healthz HTTP/1.1\r\n\r\nGET /healthz HTTP/1.1\r\n\r\n")
    assert twice.count(b"HTTP/1.0 200") == 1
    assert healthz(addr) < PROBE_BOUND and m.proc.poll() is None


_HEADS = st.sampled_from(
    [b"GET /healthz HTTP/1.1\r\n", b"POST /admin/jobs/1/cancel HTTP/1.0\n", b""]
)


@settings(max_examples=3000, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=300),
        st.builds(
            lambda head, length, rest: head + b"Content-Length: " + length + b"\r\n\r\n" + rest,
            _HEADS,
            st.one_of(st.binary(max_size=12), st.sampled_from([b"\xb2", b"9" * 5000, b"-1"])),
            st.binary(max_size=40),
        ),
        st.builds(lambda head, rest: head + rest, _HEADS, st.binary(max_size=300)),
    )
)
def test_any_bytes_parse_to_a_request_to_more_to_wait_for_or_a_refusal(data: bytes) -> None:
    """The parser runs in the master's loop: whatever a client sends, it answers with a
    request, None (wait for more) or BadRequest with an HTTP status, nothing else."""
    try:
        request = httpmsg.parse(data)
    except httpmsg.BadRequest as exc:
        assert 400 <= exc.status < 600
        return
    assert request is None or request.method
