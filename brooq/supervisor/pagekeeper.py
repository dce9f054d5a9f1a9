"""The master's side of the status page's process (brooq.page.process): forking it on
demand, handing it requests, reading its reports, killing it when a request runs over,
and keeping the revoked sign-outs across its restarts.

The master's ops server (brooq.supervisor.ops) accepts a connection and reads its request
as for every endpoint; a request for a page (``is_page``) is handed here together with
the client's socket, over a SOCK_SEQPACKET socketpair (one message per request: the bytes
read so far, and the socket by SCM_RIGHTS: brooq.opsport.handover), and the master
forgets the connection. The page process answers it, so a slow page query, a page of
1,000 rows or a client slow to read its answer costs that process time, never the
master's: renewal, the watchdog and the hard timeout keep their timing.

The master never waits for the page process either: the hand-over is a non-blocking
send; if its queue of requests is full (the socket's buffer, or MAX_QUEUED requests
handed and not answered), the master answers 503 itself. The process is forked at the
first page request (a master nobody looks at never has one) and again after it died, at
most once a second (RESPAWN_AFTER); it ends when the master's end of the socket closes
(the master stopped or died) or on SIGTERM.

The master also bounds it. It reads the process's reports (start, writing, end,
background, heartbeat) in its loop, non-blocking like any other source, and keeps its
own copy of each handed client socket until the request is done. The process is wedged
(a libpq call that no timeout bounds: DNS, a TLS handshake; or a stopped process) when a
request it started runs over its limit (PAGE_LIMIT; BULK_LIMIT for a bulk action), or
when, not in a page, it leaves a handed request unstarted or a running bulk action
unreported for START_LIMIT: the master kills it and its bulk helper (SIGKILL to its
process group), answers 503 to each client whose answer was not being written yet, logs
event=page_process_killed with the reason, and forks a new one at the next page request.

Owns: the PageKeeper, a source of the master's loop. Must never wait on the page
process: one non-blocking send per request, reports read when readable.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from brooq.opsport import handover
from brooq.opsport.handover import BACKGROUND, END, SEQ, START, WRITING
from brooq.opsport.hosts import HostRule
from brooq.opsport.httpmsg import plain_response
from brooq.page.process import run
from brooq.page.signin import NONCE_CHARS, revoke
from brooq.supervisor.source import Source

log = logging.getLogger("brooq.pages")

RESPAWN_AFTER = 1.0  # at most one fork of the page process per second
# A request running longer than this is a wedged page process: killed. A page's own
# bounds come first: each statement has 2 s (reads.STATEMENT_TIMEOUT), a connection 3 s,
# a client 5 s to take its answer; a page longer than this in all answers 503 either way.
PAGE_LIMIT = 10.0
BULK_LIMIT = 600.0  # a bulk retry or cancel: a million jobs are a hundred batches
# A page process that holds a request it has not started, or a bulk action, and is not
# in a page, reports within this (a start, an end, a heartbeat) or is wedged (stopped,
# say): killed. Healthy, it starts a request within milliseconds of its hand-over.
START_LIMIT = 5.0
MAX_QUEUED = 16  # handed and not answered yet: more are answered 503 by the master


@dataclass
class _Handed:
    """A request the page process has (the master's own copy of the client's socket)."""

    client: socket.socket
    path: str
    handed_at: float
    started: float | None = None  # when the page process said it started it
    writing: bool = False  # its answer is being written: no 503 of ours after it
    background: bool = False  # going on in a helper process (a bulk action)

    @property
    def limit(self) -> float:
        return BULK_LIMIT if self.background else PAGE_LIMIT


class PageKeeper(Source):
    """The master's handle on the page process, a source of its loop. ``close_in_child``
    gives the descriptors the forked process must close: every source's, the master's
    own and every worker's pipes (a worker must see its master's end close when it dies)."""

    def __init__(
        self,
        dsn: str,
        token: bytes | None,
        close_in_child: Callable[[], list[int]],
        signals: Collection[signal.Signals],
        schema: str | None = None,
        hosts: HostRule | None = None,
        read_dsn: str | None = None,
    ) -> None:
        self.dsn = dsn
        self.read_dsn = read_dsn  # where the pages read (a standby); None: dsn
        self.schema = schema
        self.hosts = hosts or HostRule()  # the Host names answered, checked again there
        self.signals = signals  # the master's, blocked across the fork
        self.token = token  # the admin token: sign-in and actions; None: read-only
        self.close_in_child = close_in_child
        self.pid: int | None = None
        self.sock: socket.socket | None = None
        self.started_at = float("-inf")
        self.last_heard = float("-inf")  # the page process's last report (or its fork)
        self.seq = 0
        self.handed: dict[int, _Handed] = {}  # by number, in the order handed
        self.revoked: dict[str, int] = {}  # signed-out sessions (nonce -> expiry)

    def fds(self) -> list[int]:
        """The master's descriptors of the page process (closed in every forked child):
        its socket and the copies of the clients handed to it."""
        return [*self.read_fds(), *(h.client.fileno() for h in self.handed.values())]

    def ensure(self, now: float) -> None:
        """Fork the page process if it is not running (and the last fork is a second old).
        The master's signals are blocked across the fork, as for a worker (a signal the
        page process got before its own signal table would wake the master:
        brooq.supervisor.fleet.spawn); the mask comes back in both once that is set."""
        if self.pid is not None or now - self.started_at < RESPAWN_AFTER:
            return
        self.started_at = now
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, self.signals)
        pid = os.fork()
        if pid == 0:  # the page process: never returns
            code = 1
            try:
                # A group of its own: its bulk helpers die with it (os.killpg).
                os.setpgid(0, 0)
                ours.close()
                for fd in self.close_in_child():
                    with contextlib.suppress(OSError):
                        os.close(fd)
                code = run(
                    theirs,
                    self.dsn,
                    self.token,
                    mask,
                    self.schema,
                    self.hosts,
                    self.revoked,
                    self.read_dsn,
                )
            finally:
                os._exit(code)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        with contextlib.suppress(OSError):  # set on both sides: no race with a kill
            os.setpgid(pid, pid)
        theirs.close()
        ours.setblocking(False)
        self.pid, self.sock = pid, ours
        self.last_heard = now
        log.info("event=pages_started pid=%d", pid)

    def hand(self, client: socket.socket, request: bytes) -> bool:
        """Give the page request and its socket to the page process; False when it cannot
        take it now (not running, busy): the caller answers 503."""
        self.ensure(time.monotonic())
        if self.sock is None or len(self.handed) >= MAX_QUEUED:
            return False
        self.seq += 1
        try:
            socket.send_fds(self.sock, [SEQ.pack(self.seq) + request], [client.fileno()])
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            self._lost()
            return False
        path = request.split(b" ", 2)[1].decode("latin-1", "replace") if b" " in request else ""
        path = path.split("?", 1)[0][:100]
        self.handed[self.seq] = _Handed(client.dup(), path, time.monotonic())
        return True

    def set_token(self, token: bytes | None) -> None:
        """A new admin token (SIGHUP, or its file changed): the page process takes it
        before its next request; the sessions of the old one end. A page process that
        cannot be told (its socket is full) is killed, and forked with it next time."""
        self.token = token
        self.revoked.clear()
        if self.sock is None:
            return
        try:
            self.sock.send(handover.token_message(token))
        except OSError:
            log.warning("event=page_process_killed reason=token_changed pid=%s", self.pid)
            self._signal(signal.SIGKILL)
            self._lost()

    def read_fds(self) -> list[int]:
        return [self.sock.fileno()] if self.sock is not None else []

    def service(self, readable: Collection[int], writable: Collection[int] = ()) -> None:
        """Read the page process's reports (never waiting), then kill it if a request it
        is on has run over its limit, or if it holds requests and has said nothing for
        START_LIMIT while not in a page. Called on every pass of the master's loop."""
        now = time.monotonic()
        if self.sock is not None and self.sock.fileno() in readable:
            self._read_reports(now)
        for handed in self.handed.values():
            if handed.started is not None and now - handed.started > handed.limit:
                took = now - handed.started
                why = f"the page took longer than {handed.limit:g} s; try again"
                self._kill("request_over_limit", handed, took, handed.limit, why)
                return
        silent_since = self._silent_since()
        if silent_since is not None and now - silent_since > START_LIMIT:
            waiting = next((h for h in self.handed.values() if h.started is None), None)
            reason = "request_not_started" if waiting is not None else "no_heartbeat"
            handed = waiting or next(iter(self.handed.values()))
            why = f"the status page did not answer for {START_LIMIT:g} s; try again"
            self._kill(reason, handed, now - silent_since, START_LIMIT, why)

    def _silent_since(self) -> float | None:
        """Since when the page process owes a report (None: it owes none now, being in a
        page, bounded by its limit, or holding nothing)."""
        if not self.handed or any(
            h.started is not None and not h.background for h in self.handed.values()
        ):
            return None
        waiting = [h.handed_at for h in self.handed.values() if h.started is None]
        return max([self.last_heard, *waiting[:1]])

    def next_deadline(self) -> float | None:
        deadlines = [h.started + h.limit for h in self.handed.values() if h.started is not None]
        if (silent_since := self._silent_since()) is not None:
            deadlines.append(silent_since + START_LIMIT)
        return min(deadlines, default=None)

    def _read_reports(self, now: float) -> None:
        assert self.sock is not None
        while True:
            try:
                report = self.sock.recv(64)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                report = b""
            if (signed_out := handover.read_revoked(report, NONCE_CHARS)) is not None:
                revoke(self.revoked, *signed_out, time.time())
                continue
            if len(report) != 1 + SEQ.size:
                if not report and self.pid is not None:  # it closed its end: it is gone
                    log.warning("event=pages_exited pid=%d: forked again", self.pid)
                    self._lost()
                return
            kind, (seq,) = report[:1], SEQ.unpack(report[1:])
            self.last_heard = now
            handed = self.handed.get(seq)
            if handed is None:
                continue  # ALIVE, or a request answered 503 already
            if kind == START:
                handed.started = now
            elif kind == BACKGROUND:
                handed.background = True
            elif kind == WRITING:
                handed.writing = True
            elif kind == END:
                del self.handed[seq]
                with contextlib.suppress(OSError):
                    handed.client.close()

    def _kill(self, reason: str, handed: _Handed, took: float, limit: float, why: str) -> None:
        assert self.pid is not None
        self._signal(signal.SIGKILL)
        log.error(
            "event=page_process_killed reason=%s pid=%d path=%r took=%.1fs limit=%gs: "
            "forked again at the next page request",
            reason,
            self.pid,
            handed.path,
            took,
            limit,
        )
        self._lost(why)

    def _signal(self, signum: int, *, group_only: bool = False) -> None:
        """To the page process and its bulk helper (its process group); group_only once
        the process is reaped (its pid is free: only its group's is sure to be ours)."""
        if self.pid is None:
            return
        try:
            os.killpg(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            if not group_only:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signum)

    def reaped(self, pid: int) -> bool:
        """The master reaped ``pid``: True when it was the page process (forked again on
        the next ensure)."""
        if pid != self.pid:
            return False
        log.warning("event=pages_exited pid=%d: forked again", pid)
        self._signal(signal.SIGKILL, group_only=True)  # a bulk helper it left behind
        self._lost()
        return True

    def close(self) -> None:
        """At the master's end: the page process is asked to stop, what it held is
        answered 503."""
        self._signal(signal.SIGTERM)
        self._lost()

    def _lost(self, why: str = "the status page restarted; try again") -> None:
        """The page process is gone (or killed): what it held is answered here, 503 to
        each client whose answer had not begun (the first gets `why`), then closed."""
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
        self.sock = None
        self.pid = None
        handed, self.handed = self.handed, {}
        for h in handed.values():
            if not h.writing:
                h.client.setblocking(False)
                with contextlib.suppress(OSError):  # a small answer: never waited for
                    h.client.send(plain_response(503, f"{why}\n".encode()))
                    h.client.shutdown(socket.SHUT_WR)
            why = "the status page restarted; try again"
            with contextlib.suppress(OSError):
                h.client.close()
