"""One handed request in, its whole HTTP answer out: what the page process does with
each request the master hands it.

The request is parsed again (brooq.opsport.httpmsg) and its Host checked again
(brooq.opsport.hosts: no page is ever rendered for a name that is not the port's,
whoever hands the request); then sign-in and the actions (brooq.page.actions, a bulk
action in a helper process: brooq.page.bulk), the stack button, or a read-only page
(brooq.page.routes, on a database connection of the process's own, opened at the first
page: on the read target when one is set, QUEUE_READ_DATABASE_URL, a standby most often;
the actions and the stack button always go to the database itself). The answer is
written to the client's socket with a timeout (CLIENT_TIMEOUT).

Owns: choosing who answers a request, and writing the answer. Must never write to the
database but through brooq.page.actions, nor let a defect of a page end the process.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from brooq.dsn import CLIENT_ENCODING, describe
from brooq.opsport.hosts import REFUSAL_STATUS, HostRule
from brooq.opsport.httpmsg import MAX_BODY_BYTES, BadRequest, parse, plain_response
from brooq.page.actions import Actions, form_of
from brooq.page.bulk import Bulk
from brooq.sql import queries

log = logging.getLogger("brooq.pages")

CLIENT_TIMEOUT = 5.0  # a client that does not take its page within this is dropped

_STACK = re.compile(r"^/jobs/([0-9a-fA-F-]{36})/stack$")


def _body(data: bytes) -> bytes:
    """The request's body (the master read it whole, Content-Length bytes at most)."""
    _, _, body = data.partition(b"\r\n\r\n")
    if not body:
        _, _, body = data.partition(b"\n\n")
    return body[:MAX_BODY_BYTES]


STACK_TIMEOUT = 3.0  # the stack button waits this long for the job's master


class Dispatcher:
    """Every request the page process is handed, answered."""

    def __init__(
        self,
        dsn: str,
        token: bytes | None,
        schema: str | None = None,
        hosts: HostRule | None = None,
        revoked: dict[str, int] | None = None,
        on_sign_out: Callable[[str, int], None] = lambda nonce, expires: None,
        read_dsn: str | None = None,
    ) -> None:
        self.dsn = dsn
        self.read_dsn = read_dsn  # the pages' reads (a standby); None: dsn
        self._read_down = False  # the read target's outage is logged once
        self.hosts = hosts or HostRule()
        self.token = token
        self.schema = schema  # QUEUE_SCHEMA: the pages read and act on its tables
        self.actions_enabled = token is not None
        self.conn: psycopg.Connection[Any] | None = None  # opened at the first page
        self.actions = Actions(dsn, token, schema, revoked, on_sign_out)
        self.actions.defer = self._in_helper
        self.bulk = Bulk()  # one bulk action at a time, in a helper process
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
        client = self._client
        assert client is not None
        refused = self.bulk.start(client, work)
        if refused is not None:
            return refused
        self._deferred = True
        return b""

    def _stack(self, raw_id: str) -> bytes:
        """The job page's stack button: what `brooq jobs stack ID` prints, on a page. A
        read (of the code the handler is in, not of its variables), so it needs no
        sign-in; the request travels through the database like the command's."""
        from brooq.errors import BrooqError
        from brooq.page.headers import security_headers
        from brooq.page.render import e, layout, link
        from brooq.producer.stacks import fetch_stack

        try:
            job_id = uuid.UUID(raw_id)
        except ValueError:
            return plain_response(400, b"a job id is a UUID\n")
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
        return plain_response(status, page, "text/html; charset=utf-8", extra)

    def _unreachable(self, exc: psycopg.OperationalError) -> bytes:
        """The 503 of a page whose database cannot be reached; the read target's outage
        is logged (once, naming it without its password) and named on the answer."""
        if self.read_dsn is None:
            return plain_response(503, b"the database is unreachable\n")
        if not self._read_down:
            self._read_down = True
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            log.warning(
                "event=pages_read_target_unreachable database=%s: %s",
                describe(self.read_dsn),
                reason,
            )
        return plain_response(
            503,
            b"the read target of these pages (QUEUE_READ_DATABASE_URL) is unreachable; "
            b"the actions still write to the database\n",
        )

    def _render(self, data: bytes, peer: str = "?", local: str = "") -> bytes:
        from brooq.page import routes  # imported here: the master never imports the pages

        try:
            request = parse(data)
        except BadRequest as exc:
            return plain_response(exc.status, f"{exc}\n".encode())
        if request is None:
            return plain_response(400, b"incomplete request\n")
        # The master checked it before handing; checked here too, so that no page is
        # ever rendered for a name that is not ours, whoever hands the request.
        refused = self.hosts.refusal(request.path, request.headers.get("host"), local)
        if refused is not None:
            return plain_response(REFUSAL_STATUS, refused)
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
                    self.read_dsn or self.dsn,
                    autocommit=True,
                    connect_timeout=3,
                    application_name="brooq-pages",
                    client_encoding=CLIENT_ENCODING,
                )
                self._read_down = False
            page = routes.serve(
                self.conn,
                request.method,
                request.path,
                actions_enabled=self.actions_enabled,
                q=queries(self.schema),
                csrf=self.actions.csrf_of(request.headers.get("cookie", "")),
                replica=self.read_dsn is not None,
            )
        except psycopg.OperationalError as exc:
            self.conn = None
            return self._unreachable(exc)
        except Exception:  # a defect of a page must not end the process
            log.exception("event=page_failed path=%r", request.path[:200])
            if self.conn is not None:
                with contextlib.suppress(Exception):
                    self.conn.rollback()
            return plain_response(500, b"internal error\n")
        content_type = "text/html; charset=utf-8"
        # plain_response writes these two itself.
        extra = [
            (k, v) for k, v in page.headers if k.lower() not in ("content-type", "cache-control")
        ]
        for k, v in page.headers:
            if k.lower() == "content-type":
                content_type = v
        body = b"" if request.method == "HEAD" else page.body
        return plain_response(page.status, body, content_type, extra)
