"""The status page's own process: pages are rendered off the master's loop.

The master's ops server (brooq.supervisor.ops) accepts a connection and reads its request
as for every endpoint; a request for a page (``is_page``) is handed here together with
the client's socket, over a SOCK_SEQPACKET socketpair (one message per request: the bytes
read so far, and the socket by SCM_RIGHTS), and the master forgets the connection. This
process parses the request again, renders it with brooq.web on a database connection of
its own (read-only transactions under a statement timeout), writes the answer and closes
the socket. So a slow page query, a page of 1,000 rows or a client slow to read its answer
costs this process time, never the master's: renewal, the watchdog and the hard timeout
keep their timing.

The master never waits for this process either: the hand-over is a non-blocking send; if
its queue of requests is full (the socket's buffer, or MAX_QUEUED requests handed and not
answered), the master answers 503 itself. The process is forked at the first page
request (a master nobody looks at never has one) and again after it died, at most once a
second; it ends when the master's end of the socket closes (the master stopped or died)
or on SIGTERM.

The master also bounds it. Each handed message starts with the request's number; the
process reports back on the same socket when it starts a request (b"s"), when its answer
is ready and being written (b"w") and when it is done (b"e"), each followed by the number.
The master reads those reports in its loop (non-blocking, like any other descriptor) and
keeps its own copy of each handed client socket until the request is done. The process
is wedged (a libpq call that no timeout bounds: DNS, a TLS handshake; or a stopped
process) when a request it started runs over its limit (PAGE_LIMIT; BULK_LIMIT for a
bulk action), or when, not in a page, it leaves a handed request unstarted or a running
bulk action unreported for START_LIMIT: the master kills it and its helper (SIGKILL to
its process group), answers 503 to each client whose answer was not being written yet,
logs event=page_process_killed with the reason, and forks a new one at the next page
request.

A bulk action (seconds to minutes of batches) runs in a helper process the page process
forks (one at a time; a second is answered 503): the helper answers its client itself,
and the page process goes on answering pages, reports b"b" for that request and a
heartbeat (b"h") every HEARTBEAT until the helper's pipe closes, then b"e".

Owns: forking the page process and handing requests to it (PageProcess, in the master),
the process's loop (run, after the fork) and its bulk helpers. Must never run in the
master's loop beyond one non-blocking send, nor write to the database but through
brooq.supervisor.actions (brooq.web only reads).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import select
import signal
import socket
import struct
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import psycopg

from brooq.dsn import CLIENT_ENCODING
from brooq.sql import queries
from brooq.supervisor import ops, signin
from brooq.supervisor.actions import Actions, form_of, revoke
from brooq.supervisor.hosts import REFUSAL_STATUS, HostRule

log = logging.getLogger("brooq.pages")

CLIENT_TIMEOUT = 5.0  # a client that does not take its page within this is dropped
RESPAWN_AFTER = 1.0  # at most one fork of the page process per second
MESSAGE_BYTES = ops.MAX_HEADER_BYTES + ops.MAX_BODY_BYTES + 64
# A request running longer than this is a wedged page process: killed. A page's own
# bounds come first: each statement has 2 s (reads.STATEMENT_TIMEOUT), a connection 3 s,
# a client 5 s to take its answer; a page longer than this in all answers 503 either way.
PAGE_LIMIT = 10.0
BULK_LIMIT = 600.0  # a bulk retry or cancel: a million jobs are a hundred batches
# A page process that holds a request it has not started, or a bulk action, and is not
# in a page, reports within this (a start, an end, a heartbeat) or is wedged (stopped,
# say): killed. Healthy, it starts a request within milliseconds of its hand-over.
START_LIMIT = 5.0
HEARTBEAT = 1.0  # while a bulk action runs in its helper, the page process says so
MAX_QUEUED = 16  # handed and not answered yet: more are answered 503 by the master
_SEQ = struct.Struct("!Q")  # the request's number, at the head of each message
START, WRITING, END = b"s", b"w", b"e"  # the page process's reports, each + _SEQ
# The request goes on in a helper process (a bulk action): the page process is free;
# while one does, it sends ALIVE (+ number 0) every HEARTBEAT.
BACKGROUND, ALIVE = b"b", b"h"
# A signed-out session: REVOKED + its expiry (_SEQ) + its nonce; the master keeps it for
# the page processes it forks later.
REVOKED = b"r"
# A message of the master's own, not a request: number 0, then TOKEN + the new admin
# token (nothing after it: no token any more).
CONTROL = 0
TOKEN = b"T"


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


class PageProcess:
    """The master's handle on the page process. ``close_in_child`` gives the descriptors
    the forked process must close (the master's own, as a worker child closes them)."""

    def __init__(
        self,
        dsn: str,
        token: bytes | None,
        close_in_child: Callable[[], list[int]],
        signals: Collection[signal.Signals],
        schema: str | None = None,
        hosts: HostRule | None = None,
    ) -> None:
        self.dsn = dsn
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

    def read_fds(self) -> list[int]:
        return [self.sock.fileno()] if self.sock is not None else []

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
                    theirs, self.dsn, self.token, mask, self.schema, self.hosts, self.revoked
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
            socket.send_fds(self.sock, [_SEQ.pack(self.seq) + request], [client.fileno()])
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
            self.sock.send(_SEQ.pack(CONTROL) + TOKEN + (token or b""))
        except OSError:
            log.warning("event=page_process_killed reason=token_changed pid=%s", self.pid)
            self._signal(signal.SIGKILL)
            self._lost()

    def service(self, readable: Collection[int], now: float) -> None:
        """Read the page process's reports (never waiting), then kill it if a request it
        is on has run over its limit, or if it holds requests and has said nothing for
        START_LIMIT while not in a page. Called on every pass of the master's loop."""
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
            if report[:1] == REVOKED and len(report) == 1 + _SEQ.size + signin.NONCE_CHARS:
                revoke(self.revoked, report[9:].decode("ascii", "replace"),
                       _SEQ.unpack(report[1:9])[0], time.time())  # fmt: skip
                continue
            if len(report) != 1 + _SEQ.size:
                if not report and self.pid is not None:  # it closed its end: it is gone
                    log.warning("event=pages_exited pid=%d: forked again", self.pid)
                    self._lost()
                return
            kind, (seq,) = report[:1], _SEQ.unpack(report[1:])
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

    def stop(self) -> None:
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
                    h.client.send(ops.plain_response(503, f"{why}\n".encode()))
                    h.client.shutdown(socket.SHUT_WR)
            why = "the status page restarted; try again"
            with contextlib.suppress(OSError):
                h.client.close()


# -- the page process ---------------------------------------------------------------------


def run(
    sock: socket.socket,
    dsn: str,
    token: bytes | None,
    mask: set[int | signal.Signals] | None = None,
    schema: str | None = None,
    hosts: HostRule | None = None,
    revoked: dict[str, int] | None = None,
) -> int:
    """The page process's loop: one page at a time (a bulk action in a helper beside),
    until the master's end closes."""
    from setproctitle import setproctitle

    signal.set_wakeup_fd(-1)  # the master's: a signal here must not wake the master
    for signum in (signal.SIGTERM, signal.SIGQUIT, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(signum, signal.SIG_IGN)
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    setproctitle("brooq-pages: status page")
    pages = _Pages(dsn, token, schema, hosts, revoked, functools.partial(_revoked, sock))
    pages.master_fd = sock.fileno()
    sock.setblocking(True)
    beat = time.monotonic()
    try:
        while True:
            helper = pages.helper
            watched = [sock.fileno()] if helper is None else [sock.fileno(), helper.fd]
            try:
                readable, _, _ = select.select(watched, [], [], HEARTBEAT if helper else None)
            except InterruptedError:
                continue
            if helper is not None and helper.fd in readable:
                pages.helper_ended()
                _report(sock, END, helper.seq)
            if pages.helper is not None and time.monotonic() - beat >= HEARTBEAT:
                beat = time.monotonic()
                _report(sock, ALIVE, _SEQ.pack(CONTROL))
            if sock.fileno() in readable and not _serve_one(sock, pages):
                return 0  # the master is gone
    finally:
        pages.stop_helper()


def _serve_one(sock: socket.socket, pages: _Pages) -> bool:
    """Take the master's next message and answer it; False when the master is gone."""
    try:
        data, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, 1)
    except InterruptedError:
        return True
    except OSError:
        return False
    if not data and not fds:
        return False
    seq, data = data[: _SEQ.size], data[_SEQ.size :]
    if not fds and _SEQ.unpack(seq)[0] == CONTROL and data[:1] == TOKEN:
        pages.set_token(data[1:] or None)
        return True
    for fd in fds:
        client = socket.socket(fileno=fd)
        background = False
        try:
            _report(sock, START, seq)
            background = pages.answer(client, data, functools.partial(_report, sock, WRITING, seq))
            if background:
                assert pages.helper is not None
                pages.helper.seq = seq
                _report(sock, BACKGROUND, seq)
        finally:
            with contextlib.suppress(OSError):
                client.close()  # a helper answering it has its own copy
            if not background:
                _report(sock, END, seq)
    return True


def _revoked(sock: socket.socket, nonce: str, expires: int) -> None:
    """Tell the master of a signed-out session (it outlives this process there)."""
    with contextlib.suppress(OSError):
        sock.send(REVOKED + _SEQ.pack(expires) + nonce.encode("ascii"))


def _report(sock: socket.socket, kind: bytes, seq: bytes) -> None:
    """Tell the master where this process is (it bounds a request by these)."""
    with contextlib.suppress(OSError):
        sock.send(kind + seq)


_STACK = re.compile(r"^/jobs/([0-9a-fA-F-]{36})/stack$")


def _body(data: bytes) -> bytes:
    """The request's body (the master read it whole, Content-Length bytes at most)."""
    _, _, body = data.partition(b"\r\n\r\n")
    if not body:
        _, _, body = data.partition(b"\n\n")
    return body[: ops.MAX_BODY_BYTES]


STACK_TIMEOUT = 3.0  # the stack button waits this long for the job's master


@dataclass
class _Helper:
    """A bulk action going on in a process of its own, forked by the page process: it
    answers its client itself; its pipe's end closes when it exits."""

    pid: int
    fd: int
    started: float
    seq: bytes = b""


class _Pages:
    def __init__(
        self,
        dsn: str,
        token: bytes | None,
        schema: str | None = None,
        hosts: HostRule | None = None,
        revoked: dict[str, int] | None = None,
        on_sign_out: Callable[[str, int], None] = lambda nonce, expires: None,
    ) -> None:
        self.dsn = dsn
        self.hosts = hosts or HostRule()
        self.token = token
        self.schema = schema  # QUEUE_SCHEMA: the pages read and act on its tables
        self.actions_enabled = token is not None
        self.conn: psycopg.Connection[Any] | None = None  # opened at the first page
        self.actions = Actions(dsn, token, schema, revoked, on_sign_out)
        self.actions.defer = self._in_helper
        self.master_fd = -1  # the socket to the master: a helper closes it
        self.helper: _Helper | None = None  # one bulk action at a time
        self._client: socket.socket | None = None  # the request being answered
        self._deferred = False

    def set_token(self, token: bytes | None) -> None:
        self.token = token
        self.actions_enabled = token is not None
        self.actions.set_token(token)

    def answer(
        self, client: socket.socket, data: bytes, writing: Callable[[], None] = lambda: None
    ) -> bool:
        """Answer one request; True when it goes on in a helper (which answers it)."""
        client.setblocking(True)
        client.settimeout(CLIENT_TIMEOUT)
        started = time.monotonic()
        try:
            peer = str(client.getpeername()[0])
            local = str(client.getsockname()[0])
        except (OSError, IndexError):
            peer, local = "?", ""
        self._client, self._deferred = client, False
        try:
            response = self._render(data, peer, local)
        finally:
            self._client = None
        if self._deferred:
            return True
        writing()
        with contextlib.suppress(OSError):
            client.sendall(response)
            client.shutdown(socket.SHUT_WR)
        log.debug("event=page_served took=%.1fms", (time.monotonic() - started) * 1000)
        return False

    def _in_helper(self, work: Callable[[], bytes]) -> bytes:
        """Run a bulk action in a helper process that answers the client itself, so this
        process goes on answering pages meanwhile (Actions.defer). One at a time."""
        if self.helper is not None:
            running = time.monotonic() - self.helper.started
            return ops.plain_response(
                503,
                f"a bulk action has been running for {running:.0f} s; try again once it "
                "has ended\n".encode(),
            )
        client = self._client
        assert client is not None
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the helper: never returns
            code = 1
            try:
                os.close(r)
                os.close(self.master_fd)  # the master sees this process's end alone
                response = work()
                client.sendall(response)
                client.shutdown(socket.SHUT_WR)
                code = 0
            except BaseException:
                log.exception("event=page_bulk_failed")
                with contextlib.suppress(OSError):
                    client.sendall(ops.plain_response(500, b"internal error\n"))
            finally:
                os._exit(code)
        os.close(w)
        self.helper = _Helper(pid, r, time.monotonic())
        self._deferred = True
        return b""

    def helper_ended(self) -> None:
        """The helper's pipe closed: it has answered (or died); reap it."""
        helper, self.helper = self.helper, None
        if helper is None:
            return
        os.close(helper.fd)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(helper.pid, 0)  # it has closed its end: it is exiting

    def stop_helper(self) -> None:
        if self.helper is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.helper.pid, signal.SIGKILL)
            self.helper_ended()

    def _stack(self, raw_id: str) -> bytes:
        """The job page's stack button: what `brooq jobs stack ID` prints, on a page. A
        read (of the code the handler is in, not of its variables), so it needs no
        sign-in; the request travels through the database like the command's."""
        from brooq.errors import BrooqError
        from brooq.stacks import fetch_stack
        from brooq.web import security_headers
        from brooq.web.render import e, layout, link

        try:
            job_id = uuid.UUID(raw_id)
        except ValueError:
            return ops.plain_response(400, b"a job id is a UUID\n")
        status = 200
        try:
            answer = fetch_stack(self.dsn, job_id, STACK_TIMEOUT, schema=self.schema)
            body = f"<p>Worker {e(answer.worker)}, asked just now.</p><pre>{e(answer.text)}</pre>"
        except BrooqError as exc:  # not running, not found, no master answered
            status = 404 if type(exc).__name__ == "JobNotFound" else 409
            body = f"<p>{e(exc)}</p>"
        body += f"<p>{link(f'/jobs/{job_id}', 'Back to the job')}</p>"
        page = layout(f"Stack of job {job_id}", body, actions_enabled=self.actions_enabled)
        extra = [(k, v) for k, v in security_headers() if k.lower() != "cache-control"]
        return ops.plain_response(status, page, "text/html; charset=utf-8", extra)

    def _render(self, data: bytes, peer: str = "?", local: str = "") -> bytes:
        from brooq import web  # in this process only: the master never imports the pages

        try:
            request = ops.parse(data)
        except ops.BadRequest as exc:
            return ops.plain_response(exc.status, f"{exc}\n".encode())
        if request is None:
            return ops.plain_response(400, b"incomplete request\n")
        # The master checked it before handing; checked here too, so that no page is
        # ever rendered for a name that is not ours, whoever hands the request.
        refused = self.hosts.refusal(request.path, request.headers.get("host"), local)
        if refused is not None:
            return ops.plain_response(REFUSAL_STATUS, refused)
        stack = _STACK.match(request.path)
        if stack is not None and request.method == "POST":
            # A read of live code, but asked of a worker by a write: signed in, as any POST.
            refused = self.actions.refusal(request, form_of(_body(data)), time.time())
            return refused if refused is not None else self._stack(stack.group(1))
        if self.actions.handles(request.path):
            return self.actions.answer(request, _body(data), peer)
        try:
            if self.conn is None or self.conn.closed:
                self.conn = psycopg.connect(
                    self.dsn,
                    autocommit=True,
                    connect_timeout=3,
                    application_name="brooq-pages",
                    client_encoding=CLIENT_ENCODING,
                )
            page = web.serve(
                self.conn,
                request.method,
                request.path,
                actions_enabled=self.actions_enabled,
                q=queries(self.schema),
                csrf=self.actions.csrf_of(request.headers.get("cookie", "")),
            )
        except psycopg.OperationalError:
            self.conn = None
            return ops.plain_response(503, b"the database is unreachable\n")
        except Exception:  # a defect of a page must not end the process
            log.exception("event=page_failed path=%r", request.path[:200])
            if self.conn is not None:
                with contextlib.suppress(Exception):
                    self.conn.rollback()
            return ops.plain_response(500, b"internal error\n")
        content_type = "text/html; charset=utf-8"
        # plain_response writes these two itself.
        extra = [
            (k, v) for k, v in page.headers if k.lower() not in ("content-type", "cache-control")
        ]
        for k, v in page.headers:
            if k.lower() == "content-type":
                content_type = v
        body = b"" if request.method == "HEAD" else page.body
        return ops.plain_response(page.status, body, content_type, extra)
