"""The status page's routes: a request's method and target in, a Response out.

serve() validates what the client sent before any read: a job page's id must be a UUID
(the not-found page otherwise, as for an unknown job or path: 404, with the header's
search and the ways on), a page cursor must be one this module wrote (400), a filter one
short value (400), and another method 405. GET /find?id= (the header's search) and
GET /list?state= (the lists' filter form) answer a 303 to the page asked for. A
database that fails or is too slow (the statement timeout) is 503 with a page saying
which. Every response, errors included, carries
brooq.page.headers.security_headers().

Owns: routing, the validation of ids and cursors in URLs, and the error pages; each
page's HTML is brooq.page.views', brooq.page.charts', brooq.page.jobview's,
brooq.page.schedules' or brooq.page.keys'.
Must never: write to the database, raise for anything a client sends, or let a value
reach a page without brooq.page.render.e().
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

import psycopg

from brooq.job_options import TAG_FORM, TAG_PATTERN
from brooq.page import keys, reads, schedules
from brooq.page.charts import charts_page
from brooq.page.headers import security_headers
from brooq.page.jobview import job_page
from brooq.page.lines import replica_note
from brooq.page.reads import Cursor
from brooq.page.render import e, layout, link
from brooq.page.views import (
    LISTS,
    finished_badly_page,
    fleet_page,
    in_flight_page,
    overview_page,
)
from brooq.sql import Q, Queries

log = logging.getLogger("brooq.pages")

MAX_TARGET = 2048


@dataclass
class Response:
    status: int
    body: bytes
    headers: list[tuple[str, str]] = field(default_factory=list)


class _ClientError(Exception):
    def __init__(self, status: HTTPStatus, message: str, allow: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.allow = allow  # the Allow header of a 405


def _answer(status: int, body: bytes) -> Response:
    headers = [("Content-Type", "text/html; charset=utf-8"), *security_headers()]
    return Response(status, body, headers)


def _error_page(
    status: HTTPStatus, message: str, actions_enabled: bool, note: str = ""
) -> Response:
    """An error's page: the layout's header (its links and the job search) above the
    message, then the ways on: the overview, the lists, the charts."""
    title = "Not found" if status == HTTPStatus.NOT_FOUND else f"{status.value} {status.phrase}"
    ways = "".join(
        f"<li>{link(path, text)}</li>"
        for path, text in (
            ("/", "the overview: every queue and topic, counted"),
            ("/in-flight", "in flight: the jobs being processed"),
            ("/failed", "failed: the jobs waiting for a retry"),
            ("/dead", "dead: the jobs given up on"),
            ("/on-hold", "on hold: the jobs held until released"),
            ("/charts", "charts: throughput, failures, latency, backlog"),
            ("/keys", "blocked keys: the ordered keys whose next job cannot start"),
            ("/schedules", "schedules: the periodic schedules stored in the database"),
        )
    )
    body = (
        f'<p id="error">{e(message)}</p>'
        "<p>Look for a job by its id in the box above, or go on to:</p>"
        f'<ul class="ways">{ways}</ul>'
    )
    return _answer(status.value, layout(title, body, actions_enabled=actions_enabled, note=note))


def _redirect(location: str) -> Response:
    """A 303 to one of these pages (a path built here from checked values)."""
    return Response(
        HTTPStatus.SEE_OTHER.value,
        b"",
        [("Content-Type", "text/plain; charset=utf-8"), ("Location", location),
         *security_headers()],
    )  # fmt: skip


MAX_NAME = 256  # a topic, queue or group given in a filter


def _text(query: dict[str, list[str]], name: str, limit: int = MAX_NAME) -> str | None:
    """A filter's text (``?topic=mail.send``): None when absent or empty, 400 when given
    twice, too long, or holding a control character."""
    values = query.get(name)
    if not values or values == [""]:
        return None
    value = values[0].strip()
    if len(values) > 1 or len(value) > limit or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise _ClientError(
            HTTPStatus.BAD_REQUEST, f"a {name} is one value of at most {limit} characters"
        )
    return value or None


def _filters(query: dict[str, list[str]]) -> dict[str, str | None]:
    return {"topic": _text(query, "topic"), "group": _text(query, "group"), "tag": _tag(query)}


def _find(query: dict[str, list[str]]) -> Response:
    """The header's search: the job page of the id given (spaces around it and braces
    or a urn:uuid: prefix allowed, as people paste them); a text that is no job id is
    the not-found page, saying why."""
    values = query.get("id") or [""]
    text = values[0].strip()
    try:
        if len(values) > 1 or not 32 <= len(text) <= 45:
            raise ValueError(text)
        job_id = uuid.UUID(text)
    except ValueError:
        shown = text[:80] + ("…" if len(text) > 80 else "")
        raise _ClientError(
            HTTPStatus.NOT_FOUND, f"no job {shown!r}: a job id is a UUID, as the lists show it"
        ) from None
    return _redirect(f"/jobs/{job_id}")


def _list(query: dict[str, list[str]]) -> Response:
    """The lists' filter form: the browser is sent to the state's list with the other
    filters (each checked first)."""
    state = (query.get("state") or ["processing"])[0]
    paths = dict(LISTS)
    if state not in paths:
        raise _ClientError(HTTPStatus.BAD_REQUEST, f"a list's state is one of {', '.join(paths)}")
    given = _given(_filters(query))
    return _redirect(paths[state] + (f"?{urlencode(given)}" if given else ""))


def _cursor(query: dict[str, list[str]]) -> Cursor | None:
    values = query.get("after")
    if not values:
        return None
    if len(values) > 1 or len(values[0]) > 200:
        raise _ClientError(HTTPStatus.BAD_REQUEST, "this page link is malformed")
    try:
        return reads.decode_cursor(values[0])
    except ValueError:
        raise _ClientError(HTTPStatus.BAD_REQUEST, "this page link is malformed") from None


def _tag(query: dict[str, list[str]]) -> str | None:
    """The lists' tag filter (``?tag=billing``): None when absent or empty, 400 when it
    is not a tag (brooq.job_options.TAG_FORM)."""
    values = query.get("tag")
    if not values or values == [""]:
        return None
    if len(values) > 1 or not TAG_PATTERN.fullmatch(values[0]):
        raise _ClientError(HTTPStatus.BAD_REQUEST, f"a tag is {TAG_FORM}")
    return values[0]


def _job_id(text: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST) -> uuid.UUID:
    # Only the canonical 36-character form: what the pages link to and the CLI prints.
    try:
        if len(text) != 36:
            raise ValueError(text)
        return uuid.UUID(text)
    except ValueError:
        if status == HTTPStatus.NOT_FOUND:  # a job page's address: nothing there
            shown = text[:80] + ("…" if len(text) > 80 else "")
            raise _ClientError(status, f"no job {shown!r}: a job id is a UUID") from None
        raise _ClientError(HTTPStatus.BAD_REQUEST, "a job id is a UUID") from None


def _unblocked(query: dict[str, list[str]]) -> str | None:
    """The note an unblock's way back asks for (``?unblocked=ID`` or ``none``, as
    brooq.page.actions writes it): None when absent, 400 when it is neither."""
    values = query.get("unblocked")
    if values is None:
        return None
    if len(values) == 1 and values[0] == keys.NONE_STARTED:
        return keys.NONE_STARTED
    if len(values) > 1:
        raise _ClientError(HTTPStatus.BAD_REQUEST, "unblocked is given once")
    return str(_job_id(values[0]))


def _given(query: dict[str, str | None]) -> dict[str, str]:
    return {k: v for k, v in query.items() if v is not None}


def serve(
    conn: psycopg.Connection[Any],
    method: str,
    target: str,
    *,
    actions_enabled: bool,
    timeout: float = reads.STATEMENT_TIMEOUT,
    q: Queries = Q,
    csrf: str | None = None,
    replica: bool = False,
) -> Response:
    """Answer one request of the status page, reading on conn (given idle, left idle).
    HEAD is answered as GET: the server sends the headers without the body.
    csrf: the CSRF token of the viewer's session when signed in (the page process checks
    the cookie: brooq.page.actions); the lists then carry one-click buttons, each a
    form posting to the action's endpoint with it. None: no buttons.
    replica: conn is on the read target (QUEUE_READ_DATABASE_URL): each page says so, and
    how far behind its primary that is (a job not found there may not have reached it)."""
    note = ""
    try:
        if len(target) > MAX_TARGET:
            raise _ClientError(HTTPStatus.REQUEST_URI_TOO_LONG, "the address is too long")
        parts = urlsplit(target)
        path = unquote(parts.path)
        query = parse_qs(parts.query, keep_blank_values=True)
        segments = path.strip("/").split("/") if path.strip("/") else []
        if len(segments) == 3 and segments[0] == "jobs" and segments[2] == "stack":
            if method != "POST":
                raise _ClientError(
                    HTTPStatus.METHOD_NOT_ALLOWED, "the stack is asked by POST", "POST"
                )
            job_id = _job_id(segments[1])
            # The page process answers it (brooq.page.dispatch asks the job's master,
            # as `brooq jobs stack ID` does); rendered alone, these pages cannot.
            message = f"Asking job {job_id} for its stack needs the master's page process."
            return _error_page(HTTPStatus.NOT_IMPLEMENTED, message, actions_enabled)
        if method not in ("GET", "HEAD"):
            raise _ClientError(
                HTTPStatus.METHOD_NOT_ALLOWED, "these pages are read with GET", "GET, HEAD"
            )
        if not actions_enabled:
            csrf = None
        if segments == ["find"]:
            return _find(query)
        if segments == ["list"]:
            return _list(query)
        # This page, for the buttons to come back to (its cursor and filters are checked
        # below).
        after, filters = query.get("after"), _filters(query)
        kept = {"after": after[0] if after else None, **filters}
        here = path + (f"?{urlencode(given)}" if (given := _given(kept)) else "")
        known = not segments or segments in (["in-flight"], ["fleet"], ["failed"], ["dead"],
                                             ["on-hold"], ["charts"], ["schedules"],
                                             ["keys"])  # fmt: skip
        if not known and not (len(segments) == 2 and segments[0] == "jobs"):
            raise _ClientError(HTTPStatus.NOT_FOUND, f"nothing here at {path[:200]!r}")
        # Read before the page: its figures are at least as recent as the lag it shows.
        note = replica_note(reads.standing(conn, timeout, q)) if replica else ""
        if not segments:
            body = overview_page(conn, actions_enabled, timeout, csrf, q, note)
        elif segments == ["in-flight"]:
            page = reads.in_flight(
                conn, _cursor(query), timeout=timeout, q=q, tag=filters["tag"],
                topic=filters["topic"], group=filters["group"],
            )  # fmt: skip
            body = in_flight_page(page, actions_enabled, csrf, here, note, filters=filters)
        elif segments == ["fleet"]:
            masters = reads.fleet(conn, timeout=timeout, q=q)
            body = fleet_page(masters, actions_enabled, csrf is not None, note)
        elif segments == ["schedules"]:
            stored = schedules.read(conn, timeout=timeout, q=q)
            body = schedules.schedules_page(stored, actions_enabled, csrf, note)
        elif segments == ["keys"]:
            unblocked = _unblocked(query)
            blocked = keys.read(conn, timeout=timeout, q=q)
            body = keys.keys_page(blocked, actions_enabled, csrf, note, unblocked)
        elif segments == ["charts"]:
            window = (query.get("window") or ["hour"])[0]
            if window not in reads.WINDOWS:
                raise _ClientError(HTTPStatus.BAD_REQUEST, "a window is hour or day")
            queue, topic = _text(query, "queue"), _text(query, "topic")
            data = reads.charts(conn, window, queue, topic, timeout=timeout, q=q)
            body = charts_page(data, actions_enabled, csrf is not None, note)
        elif len(segments) == 1 and segments[0] in ("failed", "dead", "on-hold"):
            state = segments[0].replace("-", "_")  # on-hold: the state on_hold
            cursor = _cursor(query)
            page = reads.finished_badly(
                conn, state, cursor, timeout=timeout, q=q, tag=filters["tag"],
                topic=filters["topic"], group=filters["group"],
            )  # fmt: skip
            body = finished_badly_page(
                state, page, actions_enabled, csrf, here, note, filters=filters
            )
        else:
            job_id = _job_id(segments[1], HTTPStatus.NOT_FOUND)
            row = reads.job(conn, job_id, timeout=timeout, q=q)
            if row is None:
                raise _ClientError(
                    HTTPStatus.NOT_FOUND,
                    f"no job {job_id}: it never was, or retention has deleted it",
                )
            body = job_page(row, actions_enabled, csrf, note)
        return _answer(HTTPStatus.OK.value, body)
    except _ClientError as err:
        response = _error_page(err.status, err.message, actions_enabled, note)
        if err.allow:
            response.headers.append(("Allow", err.allow))
        return response
    except psycopg.errors.QueryCanceled:
        log.warning("status page %s: its statements ran over %.1f s", target[:200], timeout)
        message = f"the database took longer than {timeout:g} s to answer; try again"
        return _error_page(HTTPStatus.SERVICE_UNAVAILABLE, message, actions_enabled)
    except psycopg.Error as err:
        log.warning("status page %s: %s", target[:200], type(err).__name__)
        message = f"the database is unavailable ({type(err).__name__})"
        return _error_page(HTTPStatus.SERVICE_UNAVAILABLE, message, actions_enabled)
