"""The master's HTTP surface for operations: /healthz, /readyz, /metrics, and admin
endpoints to cancel, retry, hold or release a job. Binds 127.0.0.1 by default.

    GET  /healthz                   200 while the master loop runs
    GET  /readyz                    200, or 503 with the reason (draining, database down)
    GET  /metrics                   the whole fleet, Prometheus text format
    POST /admin/jobs/<id>/cancel    bearer token required (wrong ones budgeted:
    POST /admin/jobs/<id>/retry     brooq.opsport.budget, 429 with Retry-After past it)
    POST /admin/jobs/<id>/hold
    POST /admin/jobs/<id>/release
    GET  /, /in-flight, /failed, /dead, /on-hold, /charts, /schedules, /keys, /jobs/<id>,
         /find, any other GET (the pages' not-found page); POST /jobs/<id>/stack
    GET  /sign-in, /actions; POST /sign-in, /sign-out,
         /jobs/<id>/{cancel,retry,hold,release}, /queues/<name>/{pause,resume},
         /bulk/{retry,cancel,hold,release}, /schedules/<name>/{pause,resume,run,remove},
         /keys/unblock
                                    the status page, answered by the page
                                    process (brooq.page), not here

Served from the master's own loop, with no thread (the master must stay single-threaded
to fork safely) and without ever waiting on a client: every socket is non-blocking and
multiplexed in the master's select (read_fds, write_fds, service). Each connection is a
small state machine (reading the request, writing the answer, lingering until the client
closes) with a deadline for the whole request, not per read: a client dripping a byte a
second is dropped REQUEST_TIMEOUT after it connected, one that does not read its answer
RESPONSE_TIMEOUT after the answer was ready. At most MAX_CONNECTIONS are open at once; a
new one beyond that closes the oldest (one still sending its request first), so a flood
of idle connections cannot lock /healthz out. Requests are HTTP/1.0 or 1.1, one per
connection, parsed by brooq.opsport.httpmsg (its limits are there).

Every answer but /healthz and /readyz goes only to a request whose Host is a name of
this port (brooq.opsport.hosts: a page that rebinds its DNS name to 127.0.0.1 gets a
421), checked before a request is handed to the page process too.

Owns serving HTTP: answering through OpsHooks, the connections' state machines. What
the answers say is brooq.supervisor.admin's. It must never block, start a thread, or let
anything a client sends raise out of service().
"""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import json
import logging
import re
import socket
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from brooq.opsport.budget import AuthBudget
from brooq.opsport.hosts import REFUSAL_STATUS, HostRule
from brooq.opsport.httpmsg import BadRequest, Request, parse, plain_response
from brooq.supervisor.source import Source

log = logging.getLogger("brooq.ops")

_ADMIN = re.compile(r"^/admin/jobs/([0-9a-fA-F-]{1,64})/(cancel|retry|hold|release)$")
# The status page's paths (a query string may follow); brooq.page answers what they hold.
_PAGE = re.compile(
    r"^/(in-flight|failed|dead|on-hold|fleet|actions|sign-in|sign-out"
    r"|bulk/(retry|cancel|hold|release)"
    r"|jobs/[^/?#]*(/(stack|cancel|retry|hold|release))?|queues/[^/?#]*/(pause|resume)"
    r"|schedules/[^?#]+/(pause|resume|run|remove)|keys/unblock)?"
    r"(\?.*)?$"
)

REQUEST_TIMEOUT = 5.0  # from accept to the whole request received
RESPONSE_TIMEOUT = 5.0  # from the answer ready to the answer taken by the client
LINGER = 1.0  # after the answer: read what the client still sends, so close sends no RST
MAX_CONNECTIONS = 64
BACKLOG = 128  # a burst waits in the kernel, not in SYN retries of a second or more
ACCEPTS_PER_PASS = 256  # bounds one pass of the loop during a flood
ACCEPT_PAUSE = 0.5  # after accept() failed (EMFILE...): no busy loop meanwhile
_READ_SIZE = 65536

_READING, _WRITING, _LINGERING = "reading", "writing", "lingering"


@dataclass
class OpsHooks:
    ready: Callable[[], tuple[bool, str]]
    metrics: Callable[[], bytes]
    admin: Callable[[str, str], tuple[int, dict[str, Any]]]  # (action, job id)
    token: bytes | None
    # Hands a status-page request (the client's socket, the bytes read) to the page
    # process; False when it cannot take it now. None: no status page.
    page: Callable[[socket.socket, bytes], bool] | None = None
    # The Host names answered (brooq.opsport.hosts): DNS rebinding gets a 421.
    hosts: HostRule = field(default_factory=HostRule)
    # Wrong bearer tokens per source and over every source (brooq.opsport.budget).
    budget: AuthBudget = field(default_factory=AuthBudget)


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    deadline: float
    state: str = _READING
    inbox: bytearray = field(default_factory=bytearray)
    outbox: bytes = b""
    local: str = ""  # the address the client dialled (a Host may name it)
    peer: str = ""  # the client's address (the wrong tokens' budget counts by it)


# What the master answers itself on GET; any other GET or HEAD goes to the page process,
# whose not-found page has the pages' header, search and links (a wrong address included).
_OWN = re.compile(r"^/(healthz|readyz|metrics)(\?.*)?$")


def is_page(request: Request) -> bool:
    """A request the page process answers (brooq.page; handed by brooq.supervisor.pagekeeper)."""
    if request.method in ("GET", "HEAD"):
        return not _OWN.match(request.path) and not request.path.startswith("/admin/")
    return request.method == "POST" and bool(_PAGE.match(request.path))


def _json(status: int, payload: dict[str, Any], extra: Collection[tuple[str, str]] = ()) -> bytes:
    return plain_response(status, json.dumps(payload).encode() + b"\n", "application/json", extra)


def answer(hooks: OpsHooks, request: Request, peer: str = "") -> bytes:
    """The whole HTTP response to one request (hooks run here, in the master's loop)."""
    if request.method == "GET":
        if request.path == "/healthz":
            return plain_response(200, b"ok\n")
        if request.path == "/readyz":
            ok, reason = hooks.ready()
            return plain_response(200 if ok else 503, (reason + "\n").encode())
        if request.path == "/metrics":
            return plain_response(200, hooks.metrics(), "text/plain; version=0.0.4; charset=utf-8")
        return plain_response(404, b"not found\n")
    if request.method != "POST":
        return plain_response(501, f"unsupported method {request.method[:20]!r}\n".encode())
    match = _ADMIN.match(request.path)
    if not match:
        return plain_response(404, b"not found\n")
    if hooks.token is None:
        return _json(403, {"error": "admin endpoints are off: no admin token configured"})
    budget, now = hooks.budget, time.monotonic()
    budget.for_token(hooks.token)
    if budget.wait(peer, now) > 0:  # not compared: 429 until the wait is over
        retry = budget.retry_after(peer, now)
        source = budget.refused(peer, now)
        if source is not None:  # one line per wait, naming the source, never the token
            log.warning(
                "event=ops_bearer_refused source=%r peer=%s retry_after=%ds", source, peer, retry
            )
        message = f"too many wrong bearer tokens; try again in {retry} s"
        return _json(429, {"error": message}, [("Retry-After", str(retry))])
    given = request.headers.get("authorization", "")
    scheme, _, value = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        value.strip().encode("latin-1"), hooks.token
    ):
        failures = budget.failed(peer, now)
        log.warning("event=ops_bearer_failed peer=%s failures=%d", peer, failures)
        return _json(
            401,
            {"error": "missing or wrong bearer token"},
            [("WWW-Authenticate", 'Bearer realm="brooq"')],
        )
    budget.succeeded(peer)
    status, payload = hooks.admin(match.group(2), match.group(1))
    return _json(status, payload)


def _once(render: Callable[[], bytes]) -> Callable[[], bytes]:
    """render, called at most once: the /metrics requests answered in one pass of the
    loop share one scrape (some milliseconds each), so a flood of scrapes delays a pass
    by one scrape, not by one per request."""
    body: list[bytes] = []

    def cached() -> bytes:
        if not body:
            body.append(render())
        return body[0]

    return cached


class OpsServer(Source):
    """Non-blocking HTTP serving for the master's loop. The loop selects on read_fds()
    and write_fds(), calls service() with what was ready, and waits no longer than
    next_deadline()."""

    def __init__(self, addr: str, hooks: OpsHooks) -> None:
        host, _, port = addr.rpartition(":")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_server((host, int(port)), family=family, backlog=BACKLOG)
        self.sock.setblocking(False)
        self.hooks = hooks
        self.conns: dict[int, _Conn] = {}  # by fd, in accept order (oldest first)
        self._pass_hooks = hooks
        self.accept_paused_until = 0.0
        self.accept_failure_logged_at = float("-inf")

    @property
    def address(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"{host!s}:{port}"

    def fileno(self) -> int:
        return self.sock.fileno()

    def fds(self) -> list[int]:
        """Every descriptor this server holds (a forked child closes them)."""
        return [self.sock.fileno(), *self.conns]

    def read_fds(self) -> list[int]:
        fds = [fd for fd, c in self.conns.items() if c.state != _WRITING]
        if time.monotonic() >= self.accept_paused_until:
            fds.append(self.sock.fileno())
        return fds

    def write_fds(self) -> list[int]:
        return [fd for fd, c in self.conns.items() if c.state == _WRITING]

    def next_deadline(self) -> float | None:
        deadlines = [c.deadline for c in self.conns.values()]
        if self.accept_paused_until > time.monotonic():
            deadlines.append(self.accept_paused_until)
        return min(deadlines, default=None)

    def service(self, readable: Collection[int], writable: Collection[int]) -> None:
        """Do what can be done without waiting: accept, read, answer, write, drop."""
        self._pass_hooks = dataclasses.replace(self.hooks, metrics=_once(self.hooks.metrics))
        for fd in list(self.conns):
            c = self.conns.get(fd)
            if c is None:
                continue
            if fd in readable and c.state != _WRITING:
                self._read(c)
            elif fd in writable and c.state == _WRITING:
                self._write(c)
        if self.sock.fileno() in readable:
            self._accept()
        now = time.monotonic()
        for c in list(self.conns.values()):
            if now >= c.deadline:
                self._expire(c)

    def close(self) -> None:
        for c in list(self.conns.values()):
            self._drop(c)
        self.sock.close()

    # -- connections ---------------------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_PASS):
            try:
                sock, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: leave the rest in the backlog
                now = time.monotonic()
                self.accept_paused_until = now + ACCEPT_PAUSE
                if now - self.accept_failure_logged_at >= 60:
                    self.accept_failure_logged_at = now
                    log.warning("event=ops_accept_failed error=%r", exc.strerror)
                return
            sock.setblocking(False)
            if len(self.conns) >= MAX_CONNECTIONS:
                self._drop(self._victim())
            now = time.monotonic()
            try:
                local, peer = str(sock.getsockname()[0]), str(sock.getpeername()[0])
            except OSError:
                local, peer = "", "?"
            c = _Conn(sock, now + REQUEST_TIMEOUT, local=local, peer=peer)
            self.conns[sock.fileno()] = c
            self._read(c)  # a probe's request is usually there already: answer it now

    def _victim(self) -> _Conn:
        """The connection to close for a new one: one that is only lingering, else the
        oldest still sending its request, else the oldest."""
        for state in (_LINGERING, _READING):
            for c in self.conns.values():
                if c.state == state:
                    return c
        return next(iter(self.conns.values()))

    def _read(self, c: _Conn) -> None:
        try:
            data = c.sock.recv(_READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(c)
            return
        if not data:  # the client closed (or half-closed) before a whole request
            self._drop(c)
            return
        if c.state == _LINGERING:
            return  # discarded
        c.inbox += data
        try:
            request = parse(c.inbox)
            if request is None:
                return
            refused = self.hooks.hosts.refusal(request.path, request.headers.get("host"), c.local)
            if refused is not None:
                response = plain_response(REFUSAL_STATUS, refused)
            elif self.hooks.page is not None and is_page(request):
                if self.hooks.page(c.sock, bytes(c.inbox)):
                    self._drop(c)  # our copy: the page process has its own and answers
                    return
                response = plain_response(503, b"the status page is busy; try again\n")
            else:
                response = answer(self._pass_hooks, request, c.peer)
        except BadRequest as exc:
            response = plain_response(exc.status, f"{exc}\n".encode())
        except Exception:  # nothing a client sends may break the master's loop
            log.exception("event=ops_request_failed")
            response = plain_response(500, b"internal error\n")
        self._reply(c, response)

    def _reply(self, c: _Conn, response: bytes) -> None:
        c.inbox.clear()
        c.state = _WRITING
        c.outbox = response
        c.deadline = time.monotonic() + RESPONSE_TIMEOUT
        self._write(c)

    def _write(self, c: _Conn) -> None:
        try:
            sent = c.sock.send(c.outbox)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(c)
            return
        c.outbox = c.outbox[sent:]
        if c.outbox:
            return
        # All sent: tell the client we are done, then read until it closes (or briefly),
        # so that unread input does not turn our close into a reset that loses the answer.
        with contextlib.suppress(OSError):
            c.sock.shutdown(socket.SHUT_WR)
        c.state = _LINGERING
        c.deadline = time.monotonic() + LINGER

    def _expire(self, c: _Conn) -> None:
        if c.state == _READING:
            # Too slow to send its request: say so if that can be done without waiting.
            with contextlib.suppress(OSError):
                c.sock.send(plain_response(408, b"request not received in time\n"))
        self._drop(c)

    def _drop(self, c: _Conn) -> None:
        self.conns.pop(c.sock.fileno(), None)
        with contextlib.suppress(OSError):
            c.sock.close()
