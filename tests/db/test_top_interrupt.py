"""`brooq top` and Ctrl-C at any moment of its loop: between frames, while it reads the
database (one that answers, and one that stopped answering), while it draws. Every run
ends, at once, with the terminal restored."""

from __future__ import annotations

import contextlib
import os
import random
import select
import socket
import termios
import threading
import time

import psycopg
import psycopg.conninfo
import pytest

from tests.db.test_cli import Terminal, world  # noqa: F401  (a fixture)

RUNS = 24
WAITING = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"


def _ended(term: Terminal, seconds: float) -> int | None:
    """The exit code once the process ended within ``seconds`` (its output read
    meanwhile), else None."""
    started = time.monotonic()
    while term.proc.poll() is None and time.monotonic() - started < seconds:
        if select.select([term.master], [], [], 0.05)[0]:
            try:
                term.screen += os.read(term.master, 65536)
            except OSError:  # the child closed the terminal
                break
    return term.proc.poll()


@pytest.mark.usefixtures("world")
def test_top_stops_on_ctrl_c_at_any_moment(dsn: str) -> None:
    rng = random.Random(7)
    for run in range(RUNS):
        term = Terminal("--database", dsn, "top", "--interval", "100ms")
        try:
            term.read_until(b"IN FLIGHT")
            # Frames come every 100 ms: a random moment of the loop (a read, a draw, the
            # wait between) within the next few frames.
            deadline = time.monotonic() + rng.uniform(0, 0.35)
            while (left := deadline - time.monotonic()) > 0:
                select.select([], [], [], left)
            term.proc.send_signal(2)
            started = time.monotonic()
            while term.proc.poll() is None and time.monotonic() - started < 10:
                if select.select([term.master], [], [], 0.05)[0]:
                    try:
                        term.screen += os.read(term.master, 65536)
                    except OSError:  # the child closed the terminal
                        break
            code = term.proc.poll()
            assert code == 0, f"run {run}: {code!r} after 10 s\n{term.screen[-2000:]!r}"
            assert termios.tcgetattr(term.slave) == term.before
        finally:
            term.close()


@pytest.mark.usefixtures("world")
def test_top_stops_on_ctrl_c_during_a_read(dsn: str) -> None:
    """Ctrl-C while a read waits on the database (a lock held here blocks it)."""
    term = Terminal("--database", dsn, "top", "--interval", "100ms")
    try:
        term.read_until(b"IN FLIGHT")
        with psycopg.connect(dsn) as conn:
            conn.execute("LOCK TABLE job IN ACCESS EXCLUSIVE MODE")
            with psycopg.connect(dsn, autocommit=True) as watch:
                deadline = time.monotonic() + 10
                while not watch.execute(WAITING).fetchone()[0]:
                    assert time.monotonic() < deadline, "top's read never waited"
                    select.select([], [], [], 0.05)
            term.proc.send_signal(2)
            code = _ended(term, 10)
        assert code == 0, f"{code!r} after 10 s\n{term.screen[-2000:]!r}"
        assert termios.tcgetattr(term.slave) == term.before
    finally:
        term.close()


def _connect(host: str, port: int) -> socket.socket:
    """A connection to the server: over TCP, or to its Unix socket when ``host`` is a
    directory (the embedded PostgreSQL listens on a socket only)."""
    if host.startswith("/"):
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.connect(os.path.join(host, f".s.PGSQL.{port}"))
        return unix
    return socket.create_connection((host, port))


class Proxy:
    """A TCP relay to PostgreSQL that can stop relaying (a database host gone silent):
    once frozen, what either side sends is held, and new connections (a cancel request
    among them) are accepted and never answered."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.frozen = threading.Event()
        self.held = threading.Event()  # the client sent something while frozen
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.sockets.append(client)
            if self.frozen.is_set():
                continue
            server = _connect(*self.target)
            self.sockets.append(server)
            for a, b, from_client in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pipe, args=(a, b, from_client), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket, from_client: bool) -> None:
        while True:
            try:
                data = a.recv(65536)
            except OSError:
                return
            if not data:
                return
            if self.frozen.is_set():
                if from_client:
                    self.held.set()
                continue  # held for ever
            try:
                b.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.close()


@pytest.mark.usefixtures("world")
def test_top_stops_on_ctrl_c_while_the_database_does_not_answer(dsn: str) -> None:
    """Ctrl-C while a read waits on a database that stopped answering: no cancel request
    gets through, and the view still ends at once (it never waited on the driver)."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    proxy = Proxy(str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432))
    relayed = psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=proxy.port)
    term = Terminal("--database", relayed, "top", "--interval", "100ms")
    try:
        term.read_until(b"IN FLIGHT")
        proxy.frozen.set()
        assert proxy.held.wait(10), "top sent no read"
        term.proc.send_signal(2)
        # The driver's own way out of a read (a cancel request, then the answer) gives up
        # after 5 s and 5 s more; the view does not wait for it.
        code = _ended(term, 8)
        assert code == 0, f"{code!r} after 8 s\n{term.screen[-2000:]!r}"
        assert termios.tcgetattr(term.slave) == term.before
    finally:
        term.close()
        proxy.close()
