"""Blocked ordered keys on the status page, against a real PostgreSQL: /keys lists the keys
whose next job cannot start (why, the job in the way linked, its queue, since when, the
retry due, the jobs waiting), oldest first, or says that none is blocked; signed in, a
key a dead job blocks carries an unblock button, and the page's action (brooq.page.actions,
as the page process answers it) unblocks it through brooq.operator.keys, then comes back
to /keys saying what started; refusals are worded as for the Queue."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import psycopg
import pytest

import brooq
from brooq.page import keys as page_keys
from brooq.page import signin
from brooq.page.actions import Actions
from brooq.page.routes import serve
from tests.db.test_ordering_keys import TOPIC, claim, fail, keyed, states
from tests.db.test_page import ESCAPED, HOSTILE, get, text
from tests.db.test_page_hold import CSRF, TOKEN, Request, post

Conn = psycopg.Connection[Any]


@pytest.fixture
def page(connect: Callable[..., Conn]) -> Conn:
    """The pages' connection (dict rows, as the page process reads)."""
    return connect()


def rows(body: str) -> dict[str, list[str]]:
    """The keys table's rows by key (as HTML): each row's cells, as HTML."""
    found = {}
    for row in re.findall(r"<tr>(<td>.*?)</tr>", body):
        cells = re.findall(r"<td(?: class=\"n\")?>(.*?)</td>", row)
        found[cells[1].removeprefix("<code>").removesuffix("</code>")] = cells
    return found


def buttons(body: str) -> list[tuple[str, str]]:
    """(topic, key) of each unblock button, as its hidden fields hold them (escaped)."""
    return re.findall(
        r'<form class="inline" method="post" action="/keys/unblock">'
        r'<input type="hidden" name="csrf" value="[^"]*">'
        r'<input type="hidden" name="back" value="/keys">'
        r'<input type="hidden" name="topic" value="([^"]*)">'
        r'<input type="hidden" name="key" value="([^"]*)">',
        body,
    )


def dead_key(queue: brooq.Queue, db: Conn, dsn: str, key: str, n: int) -> list[uuid.UUID]:
    """``n`` jobs of ``key``, the first claimed and dead: the key blocked, n - 1 waiting
    (the claim takes what else of TOPIC is pending too: left processing)."""
    ids = [i for i, _ in queue.enqueue_many(keyed(n, key))]
    assert ids[0] in claim(dsn) and fail(db, ids[0], dead=True) == "dead"
    return ids


def retrying_key(queue: brooq.Queue, db: Conn, dsn: str, key: str, n: int) -> list[uuid.UUID]:
    """``n`` jobs of ``key``, the first claimed and failed, its retry an hour away."""
    ids = [i for i, _ in queue.enqueue_many(keyed(n, key))]
    assert ids[0] in claim(dsn) and fail(db, ids[0], dead=False, delay=3600) == "failed"
    return ids


def unblock(actions: Actions, topic: str, key: str, back: str = "/keys") -> tuple[int, bytes]:
    return post(actions, "/keys/unblock", urlencode({"topic": topic, "key": key, "back": back}))


def test_the_keys_page_lists_a_dead_and_a_retrying_key(
    queue: brooq.Queue, db: Conn, dsn: str, page: Conn
) -> None:
    dead = dead_key(queue, db, dsn, "cust-1", 3)
    retrying = retrying_key(queue, db, dsn, "cust-2", 2)
    response = get(page, "/keys")
    assert response.status == 200
    body = text(response)
    assert "<h1>Blocked keys</h1>" in body and 'href="/keys"' in body  # in the nav
    assert 'id="empty"' not in body and 'id="unblocked"' not in body
    headers = re.findall(r"<th>([^<]*)</th>", body)
    assert headers == ["topic", "key", "reason", "job", "queue", "since", "retry at",
                       "waiting", ""]  # fmt: skip
    table = rows(body)
    assert list(table) == ["cust-1", "cust-2"]  # oldest first
    one, two = table["cust-1"], table["cust-2"]
    assert one[:5] == [TOPIC, "<code>cust-1</code>", "<strong>dead</strong>",
                       f'<a href="/jobs/{dead[0]}">{dead[0]}</a>', "default"]  # fmt: skip
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\+00:00", one[5]), one[5]
    assert one[6:8] == ["—", "2"]  # no retry due; two jobs wait their turn
    assert two[2:4] == ["retrying", f'<a href="/jobs/{retrying[0]}">{retrying[0]}</a>']
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\+00:00", two[6]), two[6]
    assert two[7] == "1"
    # Actions off: no buttons; on but signed out: the way to sign in, on the dead key's
    # row only; signed in: its unblock button, carrying its topic and key.
    assert not buttons(body) and "sign in…" not in body
    signed_out = text(serve(page, "GET", "/keys", actions_enabled=True))
    assert not buttons(signed_out)
    assert "sign in…" in rows(signed_out)["cust-1"][8] and rows(signed_out)["cust-2"][8] == ""
    signed = text(serve(page, "GET", "/keys", actions_enabled=True, csrf=CSRF))
    assert buttons(signed) == [(TOPIC, "cust-1")]
    assert re.findall(r"<th>([^<]*)</th>", signed)[-1] == "actions"
    # Nothing else here: a POST to the page, a path below it, a malformed note.
    assert get(page, "/keys", method="POST").status == 405
    assert get(page, "/keys/cust-1").status == 404
    assert get(page, "/keys?unblocked=nope").status == 400
    assert get(page, f"/keys?unblocked={dead[1]}&unblocked=none").status == 400


def test_no_blocked_key_is_said_so(queue: brooq.Queue, page: Conn) -> None:
    queue.enqueue_many(keyed(2, "cust-1"))  # waiting their turn is no block
    body = text(get(page, "/keys"))
    assert '<p id="empty">No key is blocked' in body and "<table>" not in body


def test_only_the_oldest_keys_are_shown(
    queue: brooq.Queue, db: Conn, dsn: str, page: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(page_keys, "MAX_SHOWN", 2)
    for key in ("k1", "k2", "k3"):
        dead_key(queue, db, dsn, key, 1)
    body = text(get(page, "/keys"))
    assert list(rows(body)) == ["k1", "k2"] and "only the oldest 2 shown" in body


def test_a_hostile_key_is_shown_and_posted_as_text(
    queue: brooq.Queue, db: Conn, dsn: str, page: Conn
) -> None:
    dead_key(queue, db, dsn, HOSTILE, 2)
    for csrf in (None, CSRF):
        body = text(serve(page, "GET", "/keys", actions_enabled=True, csrf=csrf))
        assert "<script>" not in body and "alert(1)</script>" not in body
        assert ESCAPED in body
    assert buttons(body) == [(TOPIC, ESCAPED)]
    # The button's form posts it back whole: the key is unblocked.
    status, answer = unblock(Actions(dsn, TOKEN), TOPIC, HOSTILE)
    assert status == 303 and b"Location: /keys?unblocked=" in answer
    assert 'id="empty"' in text(get(page, "/keys"))


def test_unblock_through_the_page_action(
    dsn: str, queue: brooq.Queue, db: Conn, page: Conn
) -> None:
    actions = Actions(dsn, TOKEN)
    first, second, third = dead_key(queue, db, dsn, "cust-1", 3)
    status, answer = unblock(actions, TOPIC, "cust-1")
    assert status == 303 and f"Location: /keys?unblocked={second}\r\n".encode() in answer
    assert states(db, [first, second, third]) == ["dead", "pending", "waiting"]
    body = text(get(page, f"/keys?unblocked={second}"))
    link = f'<a href="/jobs/{second}">{second}</a>'
    assert f"Unblocked: the key's next job, {link}, is ready to start." in body
    assert 'id="empty"' in body
    # No dead job blocks it any more: refused, worded as for the Queue.
    status, answer = unblock(actions, TOPIC, "cust-1")
    assert status == 409
    assert "no dead job blocks key &#x27;cust-1&#x27;" in answer.decode()
    # A key whose job waits for its retry is no dead key's: refused, nothing changes.
    waiting = retrying_key(queue, db, dsn, "cust-2", 2)
    assert unblock(actions, TOPIC, "cust-2")[0] == 409
    assert states(db, waiting) == ["failed", "waiting"]
    # Nothing waits behind the dead job: unblocked, and the page says no job started. Any
    # printable key travels in the form.
    [alone] = dead_key(queue, db, dsn, "a b/c?d%&+=..", 1)
    status, answer = unblock(actions, TOPIC, "a b/c?d%&+=..")
    assert status == 303 and b"Location: /keys?unblocked=none\r\n" in answer
    assert states(db, [alone]) == ["dead"]
    assert "Unblocked: no job of the key started" in text(get(page, "/keys?unblocked=none"))
    # A topic that is none, a key missing: refused, saying why.
    status, answer = unblock(actions, "Not A Topic", "cust-1")
    assert status == 409 and b"does not match" in answer
    assert post(actions, "/keys/unblock", f"topic={TOPIC}")[0] == 409
    # Another page to come back to is taken as the other actions take it; another site
    # is not: /keys, with its note.
    more = dead_key(queue, db, dsn, "cust-3", 2)
    status, answer = unblock(actions, TOPIC, "cust-3", back="/dead")
    assert status == 303 and b"Location: /dead\r\n" in answer
    more += dead_key(queue, db, dsn, "cust-4", 2)
    status, answer = unblock(actions, TOPIC, "cust-4", back="//evil.example/")
    assert status == 303 and f"Location: /keys?unblocked={more[3]}\r\n".encode() in answer


def test_unblock_is_refused_signed_out_or_without_the_csrf_token(
    dsn: str, queue: brooq.Queue, db: Conn
) -> None:
    actions = Actions(dsn, TOKEN)
    ids = dead_key(queue, db, dsn, "cust-1", 2)
    form = urlencode({"topic": TOPIC, "key": "cust-1", "back": "/keys"}).encode()
    session, cookie = signin.new_session(TOKEN, time.time())

    def status(answer: bytes) -> int:
        return int(answer.split(b" ", 2)[1])

    # Not signed in: no session cookie, with or without a token of another session.
    signed_out = Request("POST", "/keys/unblock", "")
    assert status(actions.answer(signed_out, form)) == 403
    assert status(actions.answer(signed_out, b"csrf=" + CSRF.encode() + b"&" + form)) == 403
    # Signed in, but the form's CSRF token missing or wrong.
    assert status(actions.answer(Request("POST", "/keys/unblock", cookie), form)) == 403
    forged = b"csrf=" + b"0" * 64 + b"&" + form
    assert status(actions.answer(Request("POST", "/keys/unblock", cookie), forged)) == 403
    # A form from another site, even with the session's token.
    other = Request("POST", "/keys/unblock", cookie)
    other.headers["sec-fetch-site"] = "cross-site"
    good = f"csrf={session.csrf(TOKEN)}&".encode() + form
    assert status(actions.answer(other, good)) == 403
    # Actions off (no admin token): refused.
    assert status(Actions(dsn, None).answer(Request("POST", "/keys/unblock", cookie), good)) == 403
    # A GET changes nothing.
    assert status(actions.answer(Request("GET", "/keys/unblock", cookie), b"")) == 405
    assert states(db, ids) == ["dead", "waiting"]
    # The same form, signed in with the session's token: done.
    assert status(actions.answer(Request("POST", "/keys/unblock", cookie), good)) == 303
    assert states(db, ids) == ["dead", "pending"]
