"""The status page of the ops port: server-rendered HTML, stdlib only.

    GET  /                  the overview: per queue and topic, done per minute, paused queues
    GET  /in-flight         jobs being processed (keyset pages)
    GET  /failed, /dead     jobs waiting for a retry, jobs given up on (keyset pages)
    GET  /jobs/<id>         one job: every column, the payload, the outcome, the errors
    POST /jobs/<id>/stack   the stack button (answered by the page process, signed in)

brooq.web.pages.serve is the one entry point: a request's method and target and a
psycopg connection in, a Response (status, headers, HTML bytes) out. How it is served
(never inside the master's loop) is not decided here: docs/status-page.md describes it.

Owns: the pages' reads (brooq.web.reads), their HTML (brooq.web.render) and the
response headers they carry (brooq.web.headers).
Must never: write to the database, read a socket, start a thread, load anything from
the internet, or put a value into a page without escaping it.
"""

from __future__ import annotations

from brooq.web.headers import security_headers
from brooq.web.pages import Response, serve

__all__ = ["Response", "security_headers", "serve"]
