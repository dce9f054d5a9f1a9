"""Jobs on hold on the status page, against a real PostgreSQL: the overview counts them in
a column of their own (the table read whole, the sample then the exact count through
job_on_hold_idx, and an estimate), the job page says where a held job stands and offers
what brooq.job's rules allow (hold, release, retry, cancel) as buttons, the /on-hold list
lists them, and the page's actions (brooq.page.actions, as the page process answers
them) hold, release and cancel one job or a topic's jobs in bulk, refusals worded as for
the CLI."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from brooq.page import reads, signin
from brooq.page.actions import Actions
from tests.db.test_page import get, insert, job_ids, text

Conn = psycopg.Connection[Any]

TOKEN = b"0123456789abcdef-admin"
CSRF = "0" * 64  # a token the renderer only writes into forms
PAD = "jsonb_build_object('pad', repeat('x', 400))"


@pytest.fixture
def db(connect: Callable[..., Conn]) -> Conn:
    return connect()


def add(
    db: Conn,
    n: int,
    state: str,
    topic: str = "a",
    queue: str = "default",
    available: str = "-1 minute",
) -> None:
    """n jobs of ``topic`` in ``queue`` and ``state``, due ``available`` from now."""
    db.execute(
        "INSERT INTO job (queue, topic, state, available_at, payload) "
        f"SELECT %(queue)s, %(topic)s, %(state)s, now() + %(available)s::interval, {PAD} "
        "FROM generate_series(1, %(n)s)",
        {"n": n, "queue": queue, "topic": topic, "state": state, "available": available},
    )


def figures(data: dict[str, Any]) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(ready, scheduled, on_hold) per (queue, topic)."""
    return {
        (g["queue"], g["topic"]): (g["ready"], g["scheduled"], g["on_hold"]) for g in data["groups"]
    }


def overview_cells(body: str, queue: str, topic: str) -> list[str]:
    row = re.search(rf"<tr><td>{queue}</td><td>{topic}</td>(.*?)</tr>", body)
    assert row is not None, body[:2000]
    return re.findall(r'<td class="n">([^<]*)</td>', row.group(1))


def test_the_overview_counts_held_jobs_in_their_own_column(
    db: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    add(db, 2, "pending")  # ready
    add(db, 1, "pending", available="1 hour")  # scheduled
    add(db, 3, "on_hold")  # on hold, due long ago: still not ready
    add(db, 1, "on_hold", available="1 hour")  # on hold, due later: not scheduled
    add(db, 2, "on_hold", topic="b", queue="low")  # a topic with held jobs only
    expected = {("default", "a"): (2, 1, 4), ("low", "b"): (0, 0, 2)}

    data = reads.overview(db)  # a small table: read whole
    assert figures(data) == expected and data["estimate"] is None

    body = text(get(db, "/"))
    headers = re.findall(r"<th>([^<]*)</th>", body)
    assert headers[2:12] == ["waiting", "scheduled", "ready", "held", "retrying", "parked",
                             "on_hold", "processing", "dead", "oldest ready"], headers  # fmt: skip
    assert overview_cells(body, "default", "a")[:9] == ["0", "1", "2", "0", "0", "0", "4", "0", "0"]
    assert overview_cells(body, "low", "b")[:9] == ["0", "0", "0", "0", "0", "0", "2", "0", "0"]
    assert "on_hold: held by an operator, never claimed until released" in body

    # A sample first, then each state counted exactly (web_overview_exact's on_hold arm).
    db.execute(
        "INSERT INTO job (topic, state, payload) "
        f"SELECT 'pad', 'done', {PAD} FROM generate_series(1, 2000)"
    )
    monkeypatch.setattr(reads, "SAMPLE_PAGES", 2)
    data = reads.overview(db)
    assert data["estimate"] is None and figures(data) == expected
    assert all("on_hold" not in g["estimated"] for g in data["groups"])


def test_the_exact_count_of_held_jobs_reads_their_partial_index(db: Conn) -> None:
    """The on_hold arm of web_overview_exact is job_on_hold_idx's predicate: the planner
    can read the held rows alone (here made to: the table is small)."""
    add(db, 3, "on_hold")
    add(db, 50, "done")
    params = {s: s == "on_hold" for s in reads.STATES}
    with reads.read_only(db) as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        plan = cur.execute("EXPLAIN " + reads.Q.web_overview_exact,
                           {**params, "cap": 100, "groups": 10}).fetchall()  # fmt: skip
        rows = cur.execute(reads.Q.web_overview_exact, {**params, "cap": 100, "groups": 10})
        counted = [(r["state"], r["topic"], int(r["jobs"])) for r in rows.fetchall()]
    assert "job_on_hold_idx" in "\n".join(r["QUERY PLAN"] for r in plan)
    assert counted == [("on_hold", "a", 3)]


def test_a_large_held_backlog_is_estimated_from_the_sample(
    db: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    add(db, 6000, "on_hold")
    add(db, 5, "pending")
    row = db.execute("SELECT pg_relation_size('job') / 8192 AS pages").fetchone()
    assert row is not None and int(row["pages"]) > 100
    monkeypatch.setattr(reads, "SAMPLE_PAGES", int(row["pages"]) // 4)
    monkeypatch.setattr(reads, "EXACT_BELOW", 1_000)  # on_hold over it: estimated
    data = reads.overview(db)
    (a,) = data["groups"]
    assert 0.7 * 6000 < a["on_hold"] < 1.3 * 6000, a
    assert "on_hold" in a["estimated"] and "on_hold" in data["estimate"]["states"]
    assert a["ready"] + a["scheduled"] <= 5  # held jobs are never ready, whatever the sample
    body = text(get(db, "/"))
    cells = overview_cells(body, "default", "a")
    assert cells[6].startswith("≈ "), cells
    assert "≈: estimated. " in body and "on_hold (≈ " in body


def job_page(db: Conn, job_id: uuid.UUID, csrf: str | None = CSRF) -> str:
    from brooq.page.routes import serve

    response = serve(db, "GET", f"/jobs/{job_id}", actions_enabled=True, csrf=csrf)
    assert response.status == 200
    return text(response)


def buttons(body: str) -> list[str]:
    """The actions of a page's one-click buttons, in order."""
    return re.findall(
        r'<form class="inline" method="post" action="/jobs/[0-9a-f-]{36}/(\w+)"', body
    )


def test_the_job_page_says_on_hold_and_offers_what_the_state_allows(db: Conn) -> None:
    held = insert(db, topic="a", state="on_hold", available_at="2026-01-01T00:00:00Z")
    body = job_page(db, held)
    assert '<span class="state">on_hold</span>: on hold since ' in body
    assert "never claimed until released" in body and "ready at once" in body
    assert buttons(body) == ["release", "cancel"]
    assert f'<input type="hidden" name="back" value="/jobs/{held}">' in body

    later = insert(db, topic="a", state="on_hold", available_at="2999-01-01T00:00:00Z")
    assert "due at 2999-01-01" in job_page(db, later)

    cases = {
        "pending": ["hold", "cancel"],
        "failed": ["hold", "cancel"],
        "processing": ["cancel"],
        "waiting": ["cancel"],
        "dead": ["retry"],
        "canceled": ["retry"],
        "done": [],
    }
    lease = {"locked_by": "h:1:x", "locked_until": "2999-01-01"}
    for state, expected in cases.items():
        job_id = insert(db, topic="a", state=state, **(lease if state == "processing" else {}))
        assert buttons(job_page(db, job_id)) == expected, state
    # A hold its statement would refuse whatever the state is no button but a reason.
    keyed = insert(db, topic="a", state="pending", unique_key="k")
    body = job_page(db, keyed)
    assert (
        buttons(body) == ["cancel"]
        and "no hold: a job on hold would give its unique_key up" in body
    )
    parked = insert(db, topic="a", state="pending", parked="sleep", available_at="2999-01-01")
    body = job_page(db, parked)
    assert buttons(body) == ["cancel"] and "no hold: a durable handler" in body
    # Signed out: a link to the job's forms; actions off: nothing.
    body = job_page(db, held, csrf=None)
    assert not buttons(body) and f'href="/actions?job={held}"' in body
    assert "/release" not in text(get(db, f"/jobs/{held}"))


def test_the_on_hold_list_lists_held_jobs_newest_hold_first(db: Conn) -> None:
    from brooq.page.routes import serve

    old = insert(db, topic="a", state="on_hold", updated_at="2026-01-01T00:00:00Z")
    new = insert(db, topic="b", state="on_hold", updated_at="2026-01-02T00:00:00Z",
                 last_error="ValueError: <b>x</b>")  # fmt: skip
    insert(db, topic="a", state="pending")
    body = text(get(db, "/on-hold"))
    assert job_ids(body) == [str(new), str(old)]
    assert "<h1>On hold (until released)</h1>" in body and "never claimed until released" in body
    assert "<th>held at</th><th>due</th>" in body and "&lt;b&gt;x&lt;/b&gt;" in body
    assert job_ids(text(get(db, "/on-hold?topic=a"))) == [str(old)]
    response = get(db, "/list?state=on_hold&topic=a")
    assert response.status == 303 and ("Location", "/on-hold?topic=a") in response.headers
    assert 'option value="on_hold"' in body and 'href="/on-hold"' in body
    signed = text(serve(db, "GET", "/on-hold", actions_enabled=True, csrf=CSRF))
    assert buttons(signed) == ["release", "cancel", "release", "cancel"]
    assert '<input type="hidden" name="back" value="/on-hold">' in signed


class Request:
    def __init__(self, method: str, path: str, cookie: str) -> None:
        self.method = method
        self.path = path
        self.headers = {"cookie": f"{signin.COOKIE}={cookie}", "host": "localhost"}


def post(actions: Actions, path: str, form: str = "") -> tuple[int, bytes]:
    """POST path as the page process hands it, signed in, with the session's CSRF token
    (and ``form``): (status, the whole answer)."""
    session, cookie = signin.new_session(TOKEN, time.time())
    body = f"csrf={session.csrf(TOKEN)}" + (f"&{form}" if form else "")
    answer = actions.answer(Request("POST", path, cookie), body.encode())
    return int(answer.split(b" ", 2)[1]), answer


def state(db: Conn, job_id: uuid.UUID) -> str:
    row = db.execute("SELECT state FROM job_all WHERE id = %s", [job_id]).fetchone()
    assert row is not None
    return str(row["state"])


def test_hold_release_and_cancel_through_the_page_actions(dsn: str, db: Conn) -> None:
    actions = Actions(dsn, TOKEN)
    job_id = insert(db, topic="a", state="failed", attempts=2, available_at="2999-01-01")
    status, answer = post(actions, f"/jobs/{job_id}/hold", f"back=/jobs/{job_id}")
    assert status == 303 and f"Location: /jobs/{job_id}".encode() in answer
    row = db.execute("SELECT state, attempts, available_at FROM job WHERE id = %s", [job_id])
    held = row.fetchone()
    assert held is not None and held["state"] == "on_hold" and held["attempts"] == 2
    status, answer = post(actions, f"/jobs/{job_id}/hold")
    assert status == 409
    assert (
        f"cannot hold job {job_id}: it is on_hold; only pending or failed jobs can be held"
        in answer.decode()
    )
    status, _ = post(actions, f"/jobs/{job_id}/release", "back=/on-hold")
    assert status == 303 and state(db, job_id) == "pending"
    after = db.execute("SELECT available_at FROM job WHERE id = %s", [job_id]).fetchone()
    assert after is not None and after["available_at"] == held["available_at"]  # its place kept
    status, answer = post(actions, f"/jobs/{job_id}/release")
    assert status == 409 and b"only on_hold jobs can be released" in answer
    # Cancel takes a held job.
    assert post(actions, f"/jobs/{job_id}/hold")[0] == 303
    assert post(actions, f"/jobs/{job_id}/cancel")[0] == 303 and state(db, job_id) == "canceled"
    # A keyed job: refused, saying why.
    keyed = insert(db, topic="a", state="pending", unique_key="k")
    status, answer = post(actions, f"/jobs/{keyed}/hold")
    assert status == 409 and b"it has a unique_key" in answer and state(db, keyed) == "pending"
    # Without the form's CSRF token: refused, nothing changes.
    _, cookie = signin.new_session(TOKEN, time.time())
    refused = actions.answer(Request("POST", f"/jobs/{keyed}/cancel", cookie), b"")
    assert b" 403 " in refused.split(b"\r\n", 1)[0] and state(db, keyed) == "pending"


def test_hold_and_release_in_bulk_through_the_page_actions(dsn: str, db: Conn) -> None:
    actions = Actions(dsn, TOKEN)
    add(db, 4, "pending", topic="a")
    add(db, 2, "failed", topic="a")
    keyed = insert(db, topic="a", state="pending", unique_key="k")
    add(db, 3, "pending", topic="b")
    status, answer = post(actions, "/bulk/hold", "topic=a&state=pending")
    assert status == 200 and b"5 matched, 4 changed." in answer
    assert b"Jobs with a unique_key" in answer and state(db, keyed) == "pending"
    status, answer = post(actions, "/bulk/hold", "topic=a&state=failed&queue=default")
    assert status == 200 and b"2 matched, 2 changed.</p>" in answer
    rows = db.execute("SELECT topic || ':' || state AS k, count(*) AS n FROM job GROUP BY 1")
    counts = {r["k"]: r["n"] for r in rows}
    assert counts == {"a:on_hold": 6, "a:pending": 1, "b:pending": 3}, counts
    status, answer = post(actions, "/bulk/hold", "topic=a&state=dead")
    assert status == 409 and b"only pending or failed jobs can be held in bulk" in answer
    status, answer = post(actions, "/bulk/release", "topic=a")
    assert status == 200 and b"6 matched, 6 changed." in answer
    rows = db.execute("SELECT state, count(*) AS n FROM job WHERE topic = 'a' GROUP BY 1")
    assert {r["state"]: r["n"] for r in rows} == {"pending": 7}  # a release: pending
    # The forms of /actions: a job's hold and release, the bulk hold and release.
    _, cookie = signin.new_session(TOKEN, time.time())
    page = actions.answer(Request("GET", f"/actions?job={keyed}", cookie), b"").decode()
    for action in (f"/jobs/{keyed}/hold", f"/jobs/{keyed}/release", "/bulk/hold", "/bulk/release"):
        assert f'action="{action}"' in page, action
