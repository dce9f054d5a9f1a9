"""Hosts for fleet tests: Linux network namespaces joined to this host by veth pairs.

Each `Host` is a network namespace of its own (`ip netns add`) with one end of a veth pair
inside; the other end stays here with an address of a private /30. Processes started
with `Host.wrap(...)` see only that link and their own loopback: the PostgreSQL of the
tests (loopback or a unix socket here) is out of their reach, as a database on another
machine would be. A `Forwarder` (a small process of its own in this namespace) listens on
the host end of every veth and relays each connection to the real server, so a
namespace's DSN names the veth address and every byte crosses the link.

Nothing here changes the host lastingly: no firewall rule, no sysctl outside the
namespaces, and `fleet()` removes the namespaces and links it made even when the test
fails. Names carry the pid of the process that made them, so leftovers of a test run that
was itself killed are removed by the next run.

Run as a module, this file is the forwarder: `python -m tests.netns forward --upstream
ADDR --listen IP ...` prints `listening IP PORT` for each address, then relays until
killed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from psycopg import conninfo

REPO = Path(__file__).resolve().parent.parent
PREFIX = "brooqt"  # namespace names: brooqt<pid>-<n>; veth names: bq<pid><n>h
IP = "ip"


class Unavailable(Exception):
    """Network namespaces cannot be made here (why is the message)."""


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([IP, *args], capture_output=True, text=True, check=check, timeout=10)


def probe() -> None:
    """Raise Unavailable unless this process can make a namespace and a veth pair."""
    if sys.platform != "linux":
        raise Unavailable("network namespaces are Linux only")
    if subprocess.run(["which", IP], capture_output=True).returncode != 0:
        raise Unavailable("no `ip` command (iproute2)")
    name = f"{PREFIX}{os.getpid()}-probe"
    made = _run("netns", "add", name, check=False)
    if made.returncode != 0:
        raise Unavailable(
            f"`ip netns add` failed (root or CAP_NET_ADMIN and CAP_SYS_ADMIN needed): "
            f"{made.stderr.strip()}"
        )
    try:
        veth = f"bq{os.getpid()}p"
        made = _run("link", "add", veth, "type", "veth", "peer", "name", veth + "x", check=False)
        if made.returncode != 0:
            raise Unavailable(f"cannot make a veth pair: {made.stderr.strip()}")
        _run("link", "del", veth, check=False)
    finally:
        _run("netns", "del", name, check=False)


@dataclass(frozen=True)
class Host:
    """One namespace: `name` for `ip netns`, `local` the address of this side of its link
    (where the forwarder listens), `remote` the namespace's own address."""

    name: str
    veth: str
    local: str
    remote: str

    def wrap(self) -> tuple[str, ...]:
        """The argv prefix that runs a command inside this namespace."""
        return (IP, "netns", "exec", self.name)

    def link(self, up: bool) -> None:
        """Cut the host off (its end of the link down here: the peer loses its carrier,
        packets are dropped, no connection is closed, as in a network partition) or
        bring it back."""
        _run("link", "set", self.veth, "up" if up else "down")

    def pids(self) -> list[int]:
        """Every live process in the namespace (`ip netns pids`)."""
        out = _run("netns", "pids", self.name, check=False).stdout
        return sorted(int(p) for p in out.split())

    def kill_all(self) -> list[int]:
        """SIGKILL every process of the namespace, as a host that loses power: first each
        process group found there (a master started in a session of its own and all its
        children in one kill(2)), then anything else the namespace still holds. Returns
        the pids it found."""
        found = self.pids()
        groups = set()
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                groups.add(os.getpgid(pid))
        for pgid in groups - {os.getpgrp()}:  # never our own group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return found


def _free_subnet() -> str:
    """A 10.x.y.0/24 no interface of this host uses (each host takes a /30 of it)."""
    used = _run("-4", "-o", "addr", "show", check=False).stdout
    rng = random.Random()
    for _ in range(100):
        prefix = f"10.{rng.randrange(100, 250)}.{rng.randrange(0, 256)}"
        if f" {prefix}." not in used:
            return prefix
    raise Unavailable("no free 10.x.y.0/24 for the test links")


def _remove(name: str, veth: str) -> None:
    host = Host(name, veth, "", "")
    for _ in range(50):  # a namespace with processes in it outlives `ip netns del`
        if not host.pids():
            break
        host.kill_all()
        time.sleep(0.05)
    _run("link", "del", veth, check=False)  # takes its peer with it
    _run("netns", "del", name, check=False)


def remove_leftovers() -> None:
    """Namespaces of earlier runs whose process is gone (a test run killed mid-way)."""
    names = _run("netns", "list", check=False).stdout.split()
    for name in names:
        m = re.fullmatch(rf"{PREFIX}(\d+)-(\d+)", name)
        if m and not Path(f"/proc/{m[1]}").exists():
            _remove(name, f"bq{m[1]}{m[2]}h")


@contextlib.contextmanager
def fleet(count: int) -> Iterator[list[Host]]:
    """`count` namespaces, each linked to this one; all removed on exit, whatever
    happened inside (their processes SIGKILLed first)."""
    remove_leftovers()
    subnet = _free_subnet()
    hosts: list[Host] = []
    try:
        for n in range(count):
            name = f"{PREFIX}{os.getpid()}-{n}"
            veth = f"bq{os.getpid()}{n}h"
            host = Host(name, veth, f"{subnet}.{4 * n + 1}", f"{subnet}.{4 * n + 2}")
            _run("netns", "add", name)
            hosts.append(host)
            _run("link", "add", veth, "type", "veth", "peer", "name", veth[:-1] + "n")
            _run("link", "set", veth[:-1] + "n", "netns", name)
            _run("addr", "add", f"{host.local}/30", "dev", veth)
            _run("link", "set", veth, "up")
            inside = ("netns", "exec", name, IP)
            _run(*inside, "addr", "add", f"{host.remote}/30", "dev", veth[:-1] + "n")
            _run(*inside, "link", "set", veth[:-1] + "n", "up")
            _run(*inside, "link", "set", "lo", "up")  # the ops server binds 127.0.0.1
        yield hosts
    finally:
        for host in hosts:
            _remove(host.name, host.veth)


class Forwarder:
    """The relay process: listens on each host's link address, connects to `dsn`'s server.
    `dsn_for(host, dsn)` is what a process inside that host uses."""

    def __init__(self, dsn: str, hosts: Sequence[Host], log_path: Path) -> None:
        params = conninfo.conninfo_to_dict(dsn)
        server = str(params.get("host") or "/var/run/postgresql").split(",")[0]
        port = str(params.get("port") or "5432").split(",")[0]
        upstream = f"{server}/.s.PGSQL.{port}" if server.startswith("/") else f"{server}:{port}"
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        argv = [sys.executable, "-m", "tests.netns", "forward", "--upstream", upstream]
        for host in hosts:
            argv += ["--listen", host.local]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=self._log, cwd=REPO, text=True
        )
        self.ports: dict[str, int] = {}
        assert self.proc.stdout is not None
        for _ in hosts:
            line = self.proc.stdout.readline()
            if not line.startswith("listening "):
                self.stop()
                raise RuntimeError(f"the forwarder did not start: {line!r} (see {log_path})")
            _, address, port_text = line.split()
            self.ports[address] = int(port_text)

    def cpu_seconds(self) -> float:
        """User plus system CPU time the relay has used so far (to tell whether it, and
        not brooq or PostgreSQL, was what limited a run)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def dsn_for(self, host: Host, dsn: str) -> str:
        return conninfo.make_conninfo(dsn, host=host.local, port=str(self.ports[host.local]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


# -- the forwarder process ---------------------------------------------------------------------


def _connect(upstream: str) -> socket.socket:
    if upstream.startswith("/"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(upstream)
        return sock
    host, _, port = upstream.rpartition(":")
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _pump(src: socket.socket, dst: socket.socket, done: threading.Semaphore) -> None:
    """Copy until src ends; then end dst's writing side. The second pump of a pair to
    finish closes both sockets."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)
    if not done.acquire(blocking=False):  # the other pump has finished already
        src.close()
        dst.close()


def _relay(client: socket.socket, upstream: str) -> None:
    try:
        server = _connect(upstream)
    except OSError as exc:
        print(f"upstream {upstream}: {exc}", file=sys.stderr, flush=True)
        client.close()
        return
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    done = threading.Semaphore(1)
    threading.Thread(target=_pump, args=(client, server, done), daemon=True).start()
    _pump(server, client, done)


def _serve(listener: socket.socket, upstream: str) -> None:
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_relay, args=(client, upstream), daemon=True).start()


def forward_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.netns forward")
    parser.add_argument("--upstream", required=True, help="HOST:PORT or a unix socket path")
    parser.add_argument("--listen", action="append", required=True, help="an IP to listen on")
    args = parser.parse_args(argv)
    threads = []
    for address in args.listen:
        listener = socket.create_server((address, 0), backlog=128)
        print(f"listening {address} {listener.getsockname()[1]}", flush=True)
        thread = threading.Thread(target=_serve, args=(listener, args.upstream), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["forward"]:
        sys.exit("usage: python -m tests.netns forward --upstream ADDR --listen IP ...")
    sys.exit(forward_main(sys.argv[2:]))
