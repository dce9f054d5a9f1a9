"""The status page's actions, in the page process: sign in with the admin token, then
cancel, retry, hold or release a job, pause or resume a queue, do any of the four in bulk,
pause, resume, run now or remove a stored schedule, unblock an ordered key.

    GET  /sign-in                  the sign-in form (the token is posted, never in a URL)
    POST /sign-in                  token=... -> the session cookie (brooq.page.signin)
    POST /sign-out
    GET  /actions                  the forms of every action (signed in), or how to sign in
    POST /jobs/<id>/cancel, /jobs/<id>/retry, /jobs/<id>/hold, /jobs/<id>/release
    POST /queues/<name>/pause, /queues/<name>/resume
    POST /schedules/<name>/pause, /resume, /run, /remove   (the name percent-encoded)
    POST /keys/unblock topic=T key=K
    POST /bulk/retry, /bulk/cancel, /bulk/hold topic=T state=S [queue=Q]
    POST /bulk/release topic=T [queue=Q]

Every POST but /sign-in (the stack button's included: brooq.page.dispatch asks
refusal()) needs a valid session, the form's CSRF token and a request from this site
(Sec-Fetch-Site, Origin): 403 without. Signing out revokes the session here and in the
master (which gives the revoked sessions to the next page process it forks); a new admin
token (set_token) ends every session. Wrong tokens are budgeted per source and over
every source (brooq.opsport.budget): a few cost nothing, then the source waits (429,
Retry-After; one log line per wait).
Without an admin token configured every action answers 403 and the pages say how to
enable them. The writes are brooq.operator's functions (the guarded statements, the bulk
batches, brooq.operator.schedules, brooq.operator.keys), each action on a connection of
its own (brooq.operator.connect); a schedule run now is its job inserted as brooq.enqueue
inserts one (brooq.producer.insert); a refusal is worded by brooq.job or brooq.operator as
for the CLI.

Owns: routing and answering these requests. Must never write the token into a page, a
log line or a URL, or change anything on a GET.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, unquote

import psycopg

from brooq.job import ON_HOLD, Transition
from brooq.operator import changes, keys, schedules
from brooq.opsport.httpmsg import plain_response
from brooq.page import signin
from brooq.page.signin import revoke
from brooq.sql import Queries

Conn = psycopg.Connection[Any]

log = logging.getLogger("brooq.pages")

_ROUTES = re.compile(
    r"^/(?:(sign-in|sign-out|actions)|jobs/([0-9a-fA-F-]{36})/(cancel|retry|hold|release)"
    r"|queues/([^/?#]{1,128})/(pause|resume)|bulk/(retry|cancel|hold|release)"
    r"|schedules/([^?#]{1,1024})/(pause|resume|run|remove)|keys/(unblock))$"
)
# The routes' words as brooq.job's transitions (the pattern above admits no other).
_TRANSITIONS: dict[str, Transition] = {
    "cancel": "cancel",
    "retry": "retry",
    "hold": "hold",
    "release": "release",
}
HTML = "text/html; charset=utf-8"


def _same_origin(headers: dict[str, str]) -> bool:
    """A POST whose Sec-Fetch-Site or Origin says another site made it is refused; a
    client that sends neither (curl, an older browser) is judged by the CSRF token alone.
    Origin is "null" on our own forms (the pages' Referrer-Policy is no-referrer), so
    only a real origin is compared with the Host."""
    if headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return False
    origin = headers.get("origin", "null")
    return origin == "null" or origin.split("://", 1)[-1] == headers.get("host", "")


class Actions:
    def __init__(
        self,
        dsn: str,
        token: bytes | None,
        schema: str | None = None,
        revoked: dict[str, int] | None = None,
        on_sign_out: Callable[[str, int], None] = lambda nonce, expires: None,
    ) -> None:
        self.dsn = dsn
        self.token = token
        self.schema = schema
        self.budget = signin.SignInBudget()
        # Signed-out sessions (nonce -> expiry), refused until they expire; the master
        # hears of each (on_sign_out) and hands them to the next page process.
        self.revoked: dict[str, int] = dict(revoked or {})
        self.on_sign_out = on_sign_out
        # Runs a bulk action's work and gives its answer; the page process replaces it
        # with a helper process of its own (brooq.page.bulk), answering later.
        self.defer: Callable[[Callable[[], bytes]], bytes] = lambda work: work()

    def set_token(self, token: bytes | None) -> None:
        """A new admin token: every session ends (their macs were made with the old)."""
        self.token = token
        self.revoked.clear()

    def handles(self, target: str) -> bool:
        return bool(_ROUTES.match(target.split("?", 1)[0]))

    def session(self, headers: dict[str, str], now: float) -> signin.Session | None:
        if self.token is None:
            return None
        return signin.session_of(self.token, headers.get("cookie", ""), now, self.revoked)

    def refusal(self, request: Any, form: dict[str, str], now: float) -> bytes | None:
        """Why a POST that acts may not (an answer), or None: actions on, a request from
        this site, a session, and the form's CSRF token of that session."""
        if self.token is None:
            return self._page(403, "Actions are off", "<p>No admin token is configured.</p>", None)
        if not _same_origin(request.headers):
            # SameSite=Strict keeps the cookie off cross-site requests already; a form
            # posted from another site is refused before its CSRF token is even read.
            return self._page(403, "Refused", "<p>A form from another site.</p>", None)
        if not signin.csrf_ok(self.token, self.session(request.headers, now), form.get("csrf", "")):
            return self._page(
                403,
                "Not signed in",
                '<p>Sign in first (<a href="/sign-in">sign in</a>); a form older than the '
                "session is refused too.</p>",
                None,
            )
        return None

    def answer(self, request: Any, body: bytes, peer: str = "?") -> bytes:
        path = request.path.split("?", 1)[0]
        match = _ROUTES.match(path)
        assert match is not None
        form = form_of(body)
        now = time.time()
        session = self.session(request.headers, now)
        (page, job_id, job_action, queue_name, queue_action, bulk, schedule, verb,
         key_action) = match.groups()  # fmt: skip
        if request.method == "GET":
            if page == "sign-in":
                return self._page(200, "Sign in", self._sign_in_form(), session)
            if page == "actions":
                query = {k: v[0] for k, v in parse_qs(request.path.partition("?")[2]).items()}
                return self._page(200, "Actions", self._forms(session, query), session)
            return _plain(405, "use POST")
        if request.method != "POST":
            return _plain(405, "use GET or POST")
        if page == "sign-in":
            return self._sign_in(request, form, peer, now)
        refused = self.refusal(request, form, now)
        if refused is not None:
            return refused
        assert session is not None  # refusal() checked it
        if page == "sign-out":
            self._revoke(session, now)
            log.info("event=page_signed_out")
            return _redirect("/", signin.clear_cookie())
        if schedule and verb:
            # Percent-encoded by the page's buttons (a name written by hand in SQL may
            # hold any character); a "/" in it is matched by the pattern above whole.
            name = unquote(schedule)
            return self._refused_or(
                form, session, lambda c, q: self._schedule(c, q, name, verb, form)
            )
        if key_action:
            # The topic and key travel in the form: a key may hold any printable character.
            return self._refused_or(form, session, lambda c, q: self._unblock(c, q, form))
        return self._act(job_id, job_action, queue_name, queue_action, bulk, form, session)

    def _sign_in(self, request: Any, form: dict[str, str], peer: str, now: float) -> bytes:
        token = self.token
        if token is None:
            return self._page(403, "Actions are off", "<p>No admin token is configured.</p>", None)
        if not _same_origin(request.headers):
            return self._page(403, "Refused", "<p>A form from another site.</p>", None)
        self.budget.for_token(token)
        if self.budget.wait(peer, now) > 0:
            retry = self.budget.retry_after(peer, now)
            source = self.budget.refused(peer, now)
            if source is not None:  # one line per wait, naming the source
                log.warning(
                    "event=page_sign_in_refused source=%r peer=%s retry_after=%ds",
                    source,
                    peer,
                    retry,
                )
            return self._page(
                429,
                "Sign in",
                f"<p>Too many wrong tokens: try again in {retry} s.</p>",
                None,
                [("Retry-After", str(retry))],
            )
        if not signin.token_matches(token, form.get("token", "")):
            failures = self.budget.failed(peer, time.time())
            log.warning("event=page_sign_in_failed peer=%s failures=%d", peer, failures)
            return self._page(401, "Sign in", "<p>Wrong token.</p>" + self._sign_in_form(), None)
        self.budget.succeeded(peer)
        _, cookie = signin.new_session(token, now)
        log.info("event=page_signed_in")
        return _redirect("/actions", signin.set_cookie(cookie))

    def _revoke(self, session: signin.Session, now: float) -> None:
        revoke(self.revoked, session.nonce, session.expires, now)
        self.on_sign_out(session.nonce, session.expires)

    # -- the writes ----------------------------------------------------------------------

    def _act(
        self,
        job_id: str | None,
        job_action: str | None,
        queue_name: str | None,
        queue_action: str | None,
        bulk: str | None,
        form: dict[str, str],
        session: signin.Session | None,
    ) -> bytes:
        if job_id and job_action:
            return self._refused_or(
                form, session, lambda c, q: self._job(c, q, uuid.UUID(job_id), job_action, form)
            )
        if queue_name and queue_action:
            return self._refused_or(
                form,
                session,
                lambda c, q: self._queue_action(c, q, queue_name, queue_action, form),
            )
        assert bulk is not None
        # Seconds to minutes of batches: the page process runs it elsewhere (defer), so
        # that every other page is answered meanwhile.
        return self.defer(
            lambda: self._refused_or(
                form, session, lambda c, q: self._bulk(c, q, bulk, form, session)
            )
        )

    def _refused_or(
        self,
        form: dict[str, str],
        session: signin.Session | None,
        act: Callable[[psycopg.Connection[Any], Queries], bytes],
    ) -> bytes:
        """act(conn, statements)'s answer, or the refusal it raised, worded as for the CLI
        (409); the connection commits when act returns."""
        from brooq.errors import BrooqError
        from brooq.operator.connect import connection
        from brooq.settings import load
        from brooq.sql import queries

        try:
            settings = load(overrides={"schema": self.schema})  # QUEUE_POOLER among them
            with connection(self.dsn, settings.pooler) as conn:
                return act(conn, queries(settings.schema))
        except (BrooqError, ValueError) as exc:
            back = _back(form, "")
            again = f'<p><a href="{_e(back)}">Back</a></p>' if back else ""
            return self._page(409, "Refused", f"<p>{_e(exc)}</p>{again}", session)

    def _job(
        self, conn: Conn, q: Queries, jid: uuid.UUID, action: str, form: dict[str, str]
    ) -> bytes:
        verb = _TRANSITIONS[action]
        if not changes.transition(conn, verb, jid, q):
            raise changes.explain_refusal(conn, jid, verb, q)
        log.info("event=page_%s job=%s", action, jid)
        return _redirect(_back(form, f"/jobs/{jid}"))

    def _queue_action(
        self, conn: Conn, q: Queries, name: str, action: str, form: dict[str, str]
    ) -> bytes:
        changes.set_paused(conn, name, paused=action == "pause", q=q)
        log.info("event=page_%s queue=%s", action, name)
        return _redirect(_back(form, "/"))

    def _schedule(
        self, conn: Conn, q: Queries, name: str, action: str, form: dict[str, str]
    ) -> bytes:
        """Pause, resume, run now or remove the stored schedule ``name``; BrooqError (a
        refusal) when there is none, or when its row is one queue.periodic would refuse."""
        from brooq.errors import BrooqError

        if action == "run":
            from brooq.producer import insert
            from brooq.settings import load

            job = insert.check_job(
                schedules.get(conn, name, q).job(),
                load(overrides={"schema": self.schema}).max_payload_bytes,
            )
            job_id, _ = insert.insert_checked(conn, job, q=q)
            log.info("event=page_schedule_run schedule=%r job=%s", name, job_id)
            return _redirect(f"/jobs/{job_id}")
        if action == "remove":
            if not schedules.remove(conn, name, q):
                raise BrooqError(f"no stored schedule named {name!r} (brooq periodic lists them)")
        else:
            schedules.change(conn, name, q, paused=action == "pause")
        log.info("event=page_schedule_%s schedule=%r", action, name)
        return _redirect(_back(form, "/schedules"))

    def _unblock(self, conn: Conn, q: Queries, form: dict[str, str]) -> bytes:
        """Unblock the ordered key of the form's topic and key (brooq.operator.keys): its
        dead jobs stay dead and stop blocking it, its next waiting job starts; BrooqError
        (a refusal) when no dead job blocks it. Back on /keys, the page says what started."""
        topic, key = form.get("topic", ""), form.get("key", "")
        started = keys.unblock(conn, topic, key, q)
        log.info("event=page_key_unblock topic=%s key=%r job=%s", topic, key, started)
        back = _back(form, "/keys")
        if back == "/keys":  # the note brooq.page.keys shows (none: brooq.page.keys.NONE_STARTED)
            back += f"?unblocked={started or 'none'}"
        return _redirect(back)

    def _bulk(
        self,
        conn: Conn,
        q: Queries,
        bulk: str,
        form: dict[str, str],
        session: signin.Session | None,
    ) -> bytes:
        verb = _TRANSITIONS[bulk]
        # A release takes the held jobs only: its form has no state to choose.
        state = ON_HOLD if verb == "release" else form.get("state", "")
        result = changes.change_many(
            conn,
            verb,
            q=q,
            topic=form.get("topic", ""),
            state=state,
            queue=form.get("queue") or None,
        )
        log.info("event=page_bulk_%s matched=%d changed=%d", bulk, result.matched, result.changed)
        left = ""
        if verb == "hold" and result.changed < result.matched:
            left = (
                " Jobs with a unique_key, a durable handler's parked jobs and those a "
                "worker took meanwhile are left alone."
            )
        return self._page(
            200,
            f"Bulk {bulk}",
            f"<p>{result.matched} matched, {result.changed} changed.{left}</p>",
            session,
        )

    # -- pages -----------------------------------------------------------------------------

    def _page(
        self,
        status: int,
        title: str,
        body: str,
        session: signin.Session | None,
        more: list[tuple[str, str]] | None = None,
    ) -> bytes:
        from brooq.page.headers import security_headers
        from brooq.page.render import layout

        html = layout(
            title, body, actions_enabled=self.token is not None, signed_in=session is not None
        )
        extra = [(k, v) for k, v in security_headers() if k.lower() != "cache-control"]
        return plain_response(status, html, HTML, extra + (more or []))

    def _sign_in_form(self) -> str:
        if self.token is None:
            return "<p>Actions are off: no admin token is configured.</p>"
        return (
            '<form method="post" action="/sign-in">'
            '<label>Admin token <input type="password" name="token" autocomplete="off" '
            'required></label> <button type="submit">Sign in</button></form>'
        )

    def _forms(self, session: signin.Session | None, query: dict[str, str]) -> str:
        if self.token is None:
            return "<p>Actions are off: no admin token is configured.</p>"
        if session is None:
            return '<p>Not signed in: <a href="/sign-in">sign in</a> with the admin token.</p>'
        csrf = f'<input type="hidden" name="csrf" value="{_e(session.csrf(self.token))}">'

        def form(action: str, fields: str, label: str) -> str:
            return (
                f'<form method="post" action="{_e(action)}">{csrf}{fields}'
                f"<button>{label}</button></form>"
            )

        job = query.get("job", "")
        name = query.get("queue", "")
        chosen = ""
        try:
            jid = uuid.UUID(job) if job else None
        except ValueError:
            jid = None
            chosen += f"<p>{_e(job)} is not a job id.</p>"
        if jid is not None:
            chosen += f"<h3>Job {_e(jid)}</h3>" + form(f"/jobs/{jid}/cancel", "", "Cancel")
            chosen += form(f"/jobs/{jid}/retry", "", "Retry")
            chosen += form(f"/jobs/{jid}/hold", "", "Hold")
            chosen += form(f"/jobs/{jid}/release", "", "Release")
        if name and re.fullmatch(r"[^/?#]{1,128}", name):
            chosen += f"<h3>Queue {_e(name)}</h3>" + form(f"/queues/{name}/pause", "", "Pause")
            chosen += form(f"/queues/{name}/resume", "", "Resume")
        return (
            "<h2>A job or a queue</h2>"
            '<form method="get" action="/actions"><input name="job" placeholder="job id"> '
            '<input name="queue" placeholder="queue name"> <button>Choose</button></form>'
            + chosen
            + "<h2>Bulk</h2>"
            + form(
                "/bulk/retry",
                '<input name="topic" placeholder="topic" required> '
                '<select name="state"><option>dead</option><option>canceled</option></select> '
                '<input name="queue" placeholder="queue (any)"> ',
                "Retry all",
            )
            + form(
                "/bulk/cancel",
                '<input name="topic" placeholder="topic" required> '
                '<select name="state"><option>pending</option><option>failed</option></select> '
                '<input name="queue" placeholder="queue (any)"> ',
                "Cancel all",
            )
            + form(
                "/bulk/hold",
                '<input name="topic" placeholder="topic" required> '
                '<select name="state"><option>pending</option><option>failed</option></select> '
                '<input name="queue" placeholder="queue (any)"> ',
                "Hold all",
            )
            + form(
                "/bulk/release",
                '<input name="topic" placeholder="topic" required> '
                '<input name="queue" placeholder="queue (any)"> ',
                "Release all held",
            )
            + "<h2>Sign out</h2>"
            + form("/sign-out", "", "Sign out")
        )

    def csrf_of(self, cookie_header: str) -> str | None:
        """The CSRF token of the viewer's session (for the buttons of the lists), or None
        when actions are off or the viewer is not signed in."""
        session = self.session({"cookie": cookie_header}, time.time())
        return session.csrf(self.token) if session is not None and self.token else None


def form_of(body: bytes) -> dict[str, str]:
    """A urlencoded form's fields (the first of repeated names)."""
    return {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items() if v}


# Where a list's button comes back to (its form's `back`): one of the pages, with its
# cursor and its tag filter (urlencoded: brooq.job_options.TAG_FORM's characters, some as
# %XX); anything else (another site, a scheme, //host) is ignored: no open redirect.
_BACK = re.compile(
    r"^/(?:in-flight|failed|dead|on-hold|schedules|keys|jobs/[0-9a-f-]{36})?"
    r"(?:\?after=[0-9]{1,18}_[0-9a-f-]{36}(?:&tag=[A-Za-z0-9_.%-]{1,200})?"
    r"|\?tag=[A-Za-z0-9_.%-]{1,200})?$"
)


def _back(form: dict[str, str], default: str) -> str:
    back = form.get("back", "")
    return back if _BACK.match(back) else default


def _e(value: object) -> str:
    from brooq.page.render import e

    return e(value)


def _plain(status: int, text: str) -> bytes:
    return plain_response(status, (text + "\n").encode())


def _redirect(location: str, cookie: str | None = None) -> bytes:
    extra = [("Location", location)]
    if cookie is not None:
        extra.append(("Set-Cookie", cookie))
    return plain_response(303, b"", "text/plain", extra)
