"""The ops port answers only the Host names that are its own (brooq.opsport.hosts):
a page that rebinds its DNS name to 127.0.0.1 gets a 421, from the master's own
endpoints and from the page process alike; probes of /healthz and /readyz answer any
Host; QUEUE_OPS_ALLOWED_HOSTS (--ops-allowed-hosts) adds names, checked at start-up."""

from __future__ import annotations

import socket
import subprocess
import sys

import psycopg
import pytest

import brooq
from brooq import settings as settings_mod
from brooq.errors import InvalidSettings
from brooq.opsport.hosts import HostRule, host_name
from brooq.page.dispatch import Dispatcher
from tests.harness import APPS, StartMaster
from tests.process.test_ops_slow_clients import ops_addr

EVIL = "evil.example"


def ask(addr: tuple[str, int], method: str, target: str, host: str | None) -> tuple[int, bytes]:
    head = f"{method} {target} HTTP/1.1\r\n"
    if host is not None:
        head += f"Host: {host}\r\n"
    with socket.create_connection(addr, timeout=10) as s:
        s.sendall((head + "Content-Length: 0\r\n\r\n").encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status_head, _, body = data.partition(b"\r\n\r\n")
    return int(status_head.split()[1]), body


# -- the rule, pure ---------------------------------------------------------------------


def test_the_loopback_names_the_address_dialled_and_the_configured_names_are_answered() -> None:
    rule = HostRule(frozenset({"jobs.example.com"}), "web1")
    for host in (
        "localhost",
        "localhost:8090",
        "LOCALHOST.",
        "127.0.0.1",
        "127.0.0.1:8090",
        "[::1]",
        "[::1]:8090",
        "jobs.example.com",
        "jobs.example.com:443",
        "web1:8090",
    ):
        assert rule.allows(host, "127.0.0.1"), host
    assert rule.allows("10.0.0.5:8090", "10.0.0.5")  # bound to it, or to 0.0.0.0
    assert rule.allows("10.0.0.5", "::ffff:10.0.0.5")  # a dual-stack wildcard binding
    assert rule.allows("[2001:db8::5]", "2001:db8:0::5")
    assert rule.allows(None, "127.0.0.1")  # no Host at all: no browser sends that
    for host in (
        EVIL,
        f"{EVIL}:8090",
        "10.0.0.6",  # an address, but not the one dialled
        "localhost.evil.example",
        "jobs.example.com.evil.example",
        "127.0.0.1:80:80",
        "[::1",
        "",
        "local host",
    ):
        assert not rule.allows(host, "10.0.0.5"), host


def test_health_probes_answer_any_host_and_the_refusal_names_the_problem() -> None:
    rule = HostRule()
    assert rule.refusal("/healthz", EVIL, "127.0.0.1") is None
    assert rule.refusal("/readyz?x=1", "10.1.2.3", "127.0.0.1") is None
    for path in ("/metrics", "/", "/jobs/x", "/admin/jobs/x/cancel", "/healthz/x"):
        body = rule.refusal(path, EVIL, "127.0.0.1")
        assert body is not None and b"'evil.example' is not a name of this ops port" in body
    assert rule.refusal("/metrics", "localhost:1", "127.0.0.1") is None
    assert host_name("[::1]:8090") == "[::1]" and host_name("a.b:x") is None


def test_the_page_process_refuses_a_foreign_host_itself() -> None:
    """Whoever hands it a request, the page process renders nothing for a name that is
    not the port's (the refusal comes before any read, so no database is needed)."""
    pages = Dispatcher("postgresql://nobody@127.0.0.1:1/none", None, hosts=HostRule())
    request = f"GET / HTTP/1.1\r\nHost: {EVIL}\r\n\r\n".encode()
    answer = pages._render(request, "127.0.0.1", "127.0.0.1")
    assert answer.startswith(b"HTTP/1.0 421 ") and b"is not a name of this ops port" in answer
    assert pages.conn is None


# -- the setting --------------------------------------------------------------------------


def test_allowed_hosts_come_from_the_environment_or_a_flag_and_every_bad_one_is_listed() -> None:
    env = {"QUEUE_OPS_ALLOWED_HOSTS": " jobs.example.com, 10.0.0.5 ,[2001:db8::1]"}
    assert settings_mod.load(environ=env).ops_allowed_hosts == (
        "jobs.example.com",
        "10.0.0.5",
        "[2001:db8::1]",
    )
    flags = {"ops_allowed_hosts": "proxy.internal"}
    assert settings_mod.load(environ=env, flags=flags).ops_allowed_hosts == ("proxy.internal",)
    assert settings_mod.load(environ={}).ops_allowed_hosts == ()
    with pytest.raises(InvalidSettings) as raised:
        settings_mod.load(environ={"QUEUE_OPS_ALLOWED_HOSTS": "a.example:8080,[::1,bad host"})
    problems = raised.value.problems
    assert len(problems) == 3, problems
    assert all(p.startswith("QUEUE_OPS_ALLOWED_HOSTS=") for p in problems)
    assert "without a port" in problems[0]


def test_a_bad_allowed_host_stops_the_master_with_exit_2(dsn: str) -> None:
    out = subprocess.run(
        [
            *(sys.executable, "-m", "brooq.master_cli", "--app", "brooq_testapp:queue"),
            *("--ops-allowed-hosts", "proxy:8080", "--workers", "0"),
        ],
        env={
            "DATABASE_URL": dsn,
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": f"{APPS}:{APPS.parent.parent}",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "--ops-allowed-hosts: 'proxy:8080': give the name without a port" in out.stderr
    assert "workers must be at least 1" in out.stderr  # every problem, listed at once


# -- a real master ----------------------------------------------------------------------


def test_a_rebound_name_gets_421_from_the_master_and_the_pages(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    m = start_master(workers=1, env={"QUEUE_OPS_ALLOWED_HOSTS": "jobs.example.com"})
    addr = ops_addr(m)
    port = addr[1]
    job_id, _ = queue.enqueue(brooq.Job("t.ok", {"secret": "payload-of-a-job"}))
    admin = f"/admin/jobs/{job_id}/cancel"
    for method, target in (
        ("GET", "/"),
        ("GET", "/metrics"),
        ("GET", f"/jobs/{job_id}"),
        ("GET", "/dead"),
        ("POST", f"/jobs/{job_id}/stack"),
        ("POST", admin),
    ):
        for host in (EVIL, f"{EVIL}:{port}"):
            status, body = ask(addr, method, target, host)
            assert status == 421, (method, target, host, body)
            assert b"is not a name of this ops port" in body and b"payload-of-a-job" not in body
    # The port's own names, with or without the port, and the configured one.
    for host in (f"127.0.0.1:{port}", "127.0.0.1", f"localhost:{port}", "jobs.example.com"):
        status, body = ask(addr, "GET", f"/jobs/{job_id}", host)
        assert status == 200 and b"payload-of-a-job" in body, host
        assert ask(addr, "GET", "/metrics", host)[0] == 200, host
    # Probes answer whatever Host they send.
    assert ask(addr, "GET", "/healthz", EVIL) == (200, b"ok\n")
    assert ask(addr, "GET", "/readyz", "10.9.8.7:8090")[0] in (200, 503)
    assert db.execute("SELECT state FROM job_all WHERE id = %s", (job_id,)).fetchone() != (
        "canceled",
    )


def test_a_second_master_on_a_taken_port_says_what_to_do(start_master: StartMaster) -> None:
    """Two masters on one host and one ops address: the second runs without the ops port
    and its log says how to give it one."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    first = start_master(workers=1, env={"QUEUE_OPS_ADDR": f"127.0.0.1:{port}"})
    first.wait_ready(1)
    assert f"event=ops_listening addr=127.0.0.1:{port}" in first.log()
    second = start_master(workers=1, env={"QUEUE_OPS_ADDR": f"127.0.0.1:{port}"})
    second.wait_ready(1)
    line = next(x for x in second.log().splitlines() if "event=ops_bind_failed" in x)
    assert "another master on this host?" in line and "--ops-addr HOST:PORT" in line, line
