"""The master's HTTP surface for operations: /healthz, /readyz, /metrics, and admin
endpoints to cancel or retry a job, served from the master's own loop (no thread: the
master must stay single-threaded to fork safely). Binds 127.0.0.1 by default.

    GET  /healthz                   200 while the master loop runs
    GET  /readyz                    200, or 503 with the reason (draining, database down)
    GET  /metrics                   the whole fleet, Prometheus text format
    POST /admin/jobs/<id>/cancel    bearer token required
    POST /admin/jobs/<id>/retry     bearer token required
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

log = logging.getLogger("brooq.ops")

_ADMIN = re.compile(r"^/admin/jobs/([0-9a-fA-F-]{1,64})/(cancel|retry)$")


@dataclass
class OpsHooks:
    ready: Callable[[], tuple[bool, str]]
    metrics: Callable[[], bytes]
    admin: Callable[[str, str], tuple[int, dict[str, Any]]]  # (action, job id)
    token: bytes | None


class _Server(HTTPServer):
    hooks: OpsHooks


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 2  # a slow client must not hold the master's loop
    server_version = "brooq-ops"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        return  # no access log: /metrics is scraped often

    def _send(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        self._send(status, json.dumps(payload).encode() + b"\n", "application/json")

    def do_GET(self) -> None:
        hooks = self.server.hooks
        if self.path == "/healthz":
            self._send(200, b"ok\n")
        elif self.path == "/readyz":
            ok, reason = hooks.ready()
            self._send(200 if ok else 503, (reason + "\n").encode())
        elif self.path == "/metrics":
            self._send(200, hooks.metrics(), "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._send(404, b"not found\n")

    def do_POST(self) -> None:
        hooks = self.server.hooks
        match = _ADMIN.match(self.path)
        if not match:
            self._send(404, b"not found\n")
            return
        if hooks.token is None:
            self._json(403, {"error": "admin endpoints are off: no admin token configured"})
            return
        given = self.headers.get("Authorization", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            value.strip().encode(), hooks.token
        ):
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Bearer realm="brooq"')
            body = b'{"error": "missing or wrong bearer token"}\n'
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        status, payload = hooks.admin(match.group(2), match.group(1))
        self._json(status, payload)


class OpsServer:
    def __init__(self, addr: str, hooks: OpsHooks) -> None:
        host, _, port = addr.rpartition(":")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        _Server.address_family = family
        self.server = _Server((host, int(port)), _Handler, bind_and_activate=True)
        self.server.hooks = hooks
        self.server.socket.setblocking(False)

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host!s}:{port}"

    def fileno(self) -> int:
        return self.server.fileno()

    def handle(self) -> None:
        """Serve the request waiting on the listening socket (called when it is readable)."""
        try:
            self.server._handle_request_noblock()  # type: ignore[attr-defined]
        except Exception:
            log.exception("event=ops_request_failed")

    def close(self) -> None:
        self.server.server_close()
