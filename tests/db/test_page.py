"""The status page (brooq.page) against a real PostgreSQL: escaping of hostile text,
keyset pagination, the job page's answers, the overview's figures, and the headers."""

from __future__ import annotations

import itertools
import json
import re
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from html import unescape
from typing import Any

import psycopg
import pytest

from brooq.page import reads
from brooq.page.headers import STYLE_HASH, security_headers
from brooq.page.render import STYLE
from brooq.page.routes import Response, serve
from brooq.page.views import done_per_minute

Conn = psycopg.Connection[Any]

HOSTILE = "<script>alert(1)</script>\"'&"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#x27;&amp;"


@pytest.fixture
def db(connect: Callable[..., Conn]) -> Conn:
    return connect()


def get(conn: Conn, target: str, *, method: str = "GET", actions: bool = False) -> Response:
    response = serve(conn, method, target, actions_enabled=actions)
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    return response


def text(response: Response) -> str:
    return response.body.decode()


def insert(db: Conn, **columns: Any) -> uuid.UUID:
    columns.setdefault("id", uuid.uuid4())
    columns.setdefault("topic", "t")
    for name in ("payload", "errors", "result", "logs"):
        if name in columns:
            columns[name] = json.dumps(columns[name])
    names = ", ".join(columns)
    values = ", ".join(f"%({n})s" for n in columns)
    db.execute(f"INSERT INTO job ({names}) VALUES ({values})", columns)
    return columns["id"]


def hrefs(body: str) -> list[str]:
    return [unescape(h) for h in re.findall(r'href="([^"]*)"', body)]


def job_ids(body: str) -> list[str]:
    return re.findall(r'href="/jobs/([0-9a-f-]{36})"', body)


def test_hostile_text_is_shown_as_text_everywhere(db: Conn) -> None:
    errors = [{"attempt": 1, "at": "2026-01-01", "error": HOSTILE, "worker": HOSTILE}]
    failed = insert(
        db,
        state="failed",
        attempts=1,
        payload={"html": HOSTILE, HOSTILE: 1},
        last_error=HOSTILE,
        errors=errors,
        idempotency_key=HOSTILE,
    )
    dead = insert(db, state="dead", attempts=3, last_error=HOSTILE, errors=errors)
    running = insert(
        db,
        state="processing",
        attempts=1,
        locked_by=f"{HOSTILE}:1234:tag",
        locked_until="2100-01-01",
        payload=HOSTILE,
    )
    done = insert(db, state="done", result={"r": HOSTILE})
    held = insert(db, state="on_hold", attempts=1, last_error=HOSTILE, errors=errors)
    # A stored schedule's name and payload written by hand in SQL (the Queue and the CLI
    # take a name of a topic's form only).
    db.execute(
        "INSERT INTO brooq_schedule (name, every_seconds, topic, payload) VALUES (%s, 60, 't', %s)",
        [HOSTILE, json.dumps({HOSTILE: HOSTILE})],
    )
    # An ordering key is any printable text its producer chose; a dead job blocks it.
    keyed = insert(db, topic="t.o", ordering_key=HOSTILE)
    db.execute("UPDATE job SET state = 'dead', attempts = 1 WHERE id = %s", [keyed])
    pages = ["/", "/failed", "/dead", "/in-flight", "/on-hold", "/schedules", "/keys"] + [
        f"/jobs/{j}" for j in (failed, dead, running, done, held)
    ]
    for target in pages:
        response = get(db, target)
        assert response.status == 200, target
        body = text(response)
        assert "<script>" not in body, target
        assert "alert(1)</script>" not in body, target
    for target in ["/failed", "/dead", "/on-hold", "/schedules", "/keys", f"/jobs/{failed}",
                   f"/jobs/{dead}", f"/jobs/{held}"]:  # fmt: skip
        assert ESCAPED in text(get(db, target)), target
    in_flight = text(get(db, "/in-flight"))
    assert ESCAPED in in_flight and "1234" in in_flight  # host and pid from locked_by
    # The payload and result are JSON, pretty-printed, then escaped: a quote inside a JSON
    # string is \" in JSON, &quot; in HTML.
    job = text(get(db, f"/jobs/{failed}"))
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\&quot;&#x27;&amp;" in job
    assert "&lt;script&gt;" in text(get(db, f"/jobs/{done}"))


def test_a_page_link_never_carries_a_raw_value(db: Conn) -> None:
    insert(db, state="failed", last_error='"><a href="x">')
    body = text(get(db, "/failed"))
    assert '"><a href="x">' not in body
    assert "&quot;&gt;&lt;a href=&quot;x&quot;&gt;" in body


@pytest.mark.parametrize("target", ["/failed", "/dead", "/in-flight", "/on-hold"])
def test_pages_follow_each_other_without_overlap(db: Conn, target: str) -> None:
    state = target.strip("/").replace("in-flight", "processing").replace("-", "_")
    total = 2 * reads.PAGE_SIZE + 7
    # Several rows per updated_at, so the keyset's tie-breaker (id) is exercised.
    db.execute(
        "INSERT INTO job (topic, state, locked_by, locked_until, updated_at) "
        "SELECT 't', %(state)s, 'h:1:x', now() + interval '1 hour', "
        "       now() - (i / 3) * interval '1 second' "
        "FROM generate_series(1, %(n)s) AS i",
        {"state": state, "n": total},
    )
    seen: list[str] = []
    url: str | None = target
    pages = 0
    while url is not None:
        response = get(db, url)
        assert response.status == 200
        body = text(response)
        ids = job_ids(body)
        assert 0 < len(ids) <= reads.PAGE_SIZE
        assert not set(ids) & set(seen)
        seen += ids
        pages += 1
        nexts = [h for h in hrefs(body) if "after=" in h]
        url = nexts[0] if nexts else None
        assert pages <= 3
    assert pages == 3
    every = {str(r["id"]) for r in db.execute("SELECT id FROM job").fetchall()}
    assert set(seen) == every and len(seen) == total


def test_a_malformed_cursor_is_400(db: Conn) -> None:
    for after in ["x", "12_notauuid", f"2026-01-01T00:00:00_{uuid.uuid4()}", f"-1_{uuid.uuid4()}",
                  f"{'9' * 18}_{uuid.uuid4()}"]:  # fmt: skip
        response = get(db, f"/failed?after={after}")
        assert response.status == 400, after


def test_the_job_page(db: Conn) -> None:
    job_id = insert(
        db,
        topic="mail.send",
        queue="low",
        state="dead",
        attempts=3,
        payload={"to": "a@example.org", "n": [1, 2]},
        last_error="boom",
        errors=[
            {"attempt": i, "at": "t", "error": f"boom {i}", "worker": "h:1:x"} for i in (1, 2, 3)
        ],
    )
    response = get(db, f"/jobs/{job_id}")
    assert response.status == 200
    body = text(response)
    for column in ["topic", "payload", "state", "attempts", "available_at", "locked_by",
                   "last_error", "idempotency_key", "created_at", "updated_at", "queue",
                   "priority", "lease_expiries", "result", "waited"]:  # fmt: skip
        assert f"<th>{column}</th>" in body, column
    assert "mail.send" in body and "boom 2" in body and "<h2>Attempts (3)</h2>" in body
    assert '<details class="raw"><summary>' in body  # the row's fields behind a toggle
    assert "&quot;to&quot;: &quot;a@example.org&quot;" in body  # pretty-printed JSON
    assert '"n": [\n' in unescape(body)


def test_a_jobs_kept_logs_and_its_progress(db: Conn) -> None:
    """A keep_logs job's page shows each attempt's log text (escaped), not the raw
    column; the in-flight list shows a running job's progress."""
    job_id = insert(
        db,
        state="failed",
        attempts=2,
        logs=[
            {"attempt": 1, "at": "2030-01-01T00:00:00+00:00", "text": "level=info <b>one</b>"},
            {"attempt": 2, "at": "2030-01-01T00:01:00+00:00", "text": "level=info two"},
        ],
    )
    body = text(get(db, f"/jobs/{job_id}"))
    assert "<th>logs</th>" not in body
    assert "Logs of attempt 1, ended 2030-01-01T00:00:00+00:00" in body
    assert "level=info &lt;b&gt;one&lt;/b&gt;" in body and "<b>one" not in body
    assert body.index("Logs of attempt 1") < body.index("Logs of attempt 2")
    insert(
        db,
        state="processing",
        locked_by="h:1:x",
        locked_until=datetime.now(timezone.utc),
        progress=0.4,
        progress_message="resizing <3 of 8>",
    )
    in_flight = text(get(db, "/in-flight"))
    assert "<th>progress</th>" in in_flight
    assert "40% resizing &lt;3 of 8&gt;" in in_flight


def test_an_unknown_job_a_malformed_id_and_a_wrong_address_are_the_not_found_page(
    db: Conn,
) -> None:
    """404 with the pages' header (its links and the job search) and the ways on."""
    unknown = uuid.uuid4()
    response = get(db, f"/jobs/{unknown}")
    assert response.status == 404 and str(unknown) in text(response)
    for bad in ["nope", "1234", "%3Cscript%3E", str(unknown).replace("-", "")]:
        response = get(db, f"/jobs/{bad}")
        assert response.status == 404, bad
        assert "<script>" not in text(response) and "a job id is a UUID" in text(response)
    for target in ["/nowhere", "/jobs", f"/jobs/{unknown}/logs", "/%3Cscript%3E"]:
        response = get(db, target)
        body = text(response)
        assert response.status == 404, target
        assert "<title>Not found · brooq</title>" in body and "<script>" not in body
        assert '<form class="search" method="get" action="/find"' in body
        for path in ("/", "/in-flight", "/failed", "/dead", "/charts"):
            assert f'<a href="{path}">' in body, (target, path)
    posted = get(db, "/", method="POST")
    assert posted.status == 405 and ("Allow", "GET, HEAD") in posted.headers


def test_the_stack_button_posts_to_the_page_process(db: Conn) -> None:
    job_id = insert(db, state="processing", locked_by="h:1:x", locked_until="2100-01-01")
    # Signed in, a POST with the session's CSRF token; signed out, the way to sign in.
    response = serve(db, "GET", f"/jobs/{job_id}", actions_enabled=True, csrf="c5rf")
    body = text(response)
    assert f'action="/jobs/{job_id}/stack"' in body and "brooq jobs stack ID" in body
    assert 'name="csrf" value="c5rf"' in body
    body = text(get(db, f"/jobs/{job_id}", actions=True))
    assert "/stack" not in body and 'href="/sign-in"' in body
    assert "/stack" not in text(get(db, f"/jobs/{job_id}"))
    # Rendered alone (no master), the pages cannot ask: tests/process/test_status_page.py asks.
    response = get(db, f"/jobs/{job_id}/stack", method="POST")
    assert response.status == 501 and "page process" in text(response)
    assert get(db, f"/jobs/{job_id}/stack").status == 405


def test_the_overview_counts_what_the_table_holds(db: Conn) -> None:
    def add(n: int, queue: str, topic: str, state: str, available: str = "-1 minute") -> None:
        db.execute(
            "INSERT INTO job (queue, topic, state, available_at, locked_by, locked_until, "
            "                 updated_at) "
            "SELECT %(queue)s, %(topic)s, %(state)s, now() + %(available)s::interval, "
            "       'h:1:x', now() + interval '1 minute', now() "
            "FROM generate_series(1, %(n)s)",
            {"n": n, "queue": queue, "topic": topic, "state": state, "available": available},
        )

    add(4, "default", "a", "pending")  # ready
    add(1, "default", "a", "pending", "-5 minutes")  # the oldest ready: 5m
    add(3, "default", "a", "pending", "1 hour")  # scheduled
    add(2, "default", "a", "failed", "1 hour")  # failed, retrying
    add(6, "default", "a", "processing")
    add(7, "default", "a", "dead")
    add(9, "default", "a", "done")
    add(2, "low", "b", "failed")  # failed, ready
    db.execute(
        "INSERT INTO job (topic, state, updated_at) "
        "SELECT 'a', 'done', date_trunc('minute', now()) - interval '10 minutes' "
        "FROM generate_series(1, 5)"
    )
    db.execute("INSERT INTO brooq_queue (name, paused) VALUES ('low', true), ('x', false)")
    data = reads.overview(db)
    groups = {(g["queue"], g["topic"]): g for g in data["groups"]}
    a = groups[("default", "a")]
    assert (a["ready"], a["scheduled"], a["retrying"], a["processing"], a["dead"]) == (
        5,
        3,
        2,
        6,
        7,
    )
    assert (a["failed"], a["held"], a["waiting"], a["parked"]) == (2, 0, 0, 0)
    assert 299 <= a["oldest_ready_seconds"] < 330
    b = groups[("low", "b")]
    assert (b["ready"], b["scheduled"], b["retrying"], b["dead"]) == (2, 0, 0, 0)
    assert [p["name"] for p in data["paused"]] == ["low"]

    minutes = done_per_minute(data)
    assert len(minutes) == 60 and minutes[-1] == 9 and minutes[-11] == 5 and sum(minutes) == 14

    body = text(get(db, "/"))
    row = re.search(r"<tr><td>default</td><td>a</td>(.*?)</tr>", body)
    assert row is not None
    cells = re.findall(r'<td class="n">([^<]*)</td>', row.group(1))
    # waiting, scheduled, ready, held, retrying, parked, on_hold, processing, dead, oldest
    assert cells[:9] == ["0", "3", "5", "0", "2", "0", "0", "6", "7"], cells
    assert cells[9].startswith("5m "), cells
    headers = re.findall(r"<th>([^<]*)</th>", body)
    counts = ["waiting", "scheduled", "ready", "held", "retrying", "parked", "on_hold",
              "processing", "dead"]  # fmt: skip
    assert headers[2:12] == [*counts, "oldest ready"], headers
    assert "low <strong>(paused)</strong>" in body
    assert "14 done in the last hour" in body and "<svg" in body


def test_the_overview_is_bounded(db: Conn, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reads, "MAX_GROUPS", 3)
    monkeypatch.setattr(reads, "MAX_PAUSED", 2)
    db.execute(
        "INSERT INTO job (topic) SELECT 't' || i FROM generate_series(1, 5) AS i;"
        "INSERT INTO brooq_queue (name, paused) SELECT 'q' || i, true "
        "FROM generate_series(1, 4) AS i"
    )
    data = reads.overview(db)
    assert [g["topic"] for g in data["groups"]] == ["t1", "t2", "t3"] and data["groups_cut"]
    assert [p["name"] for p in data["paused"]] == ["q1", "q2"] and data["paused_cut"]
    body = text(get(db, "/"))
    assert "only the first 3 shown" in body and "only the first 2 shown" in body


def test_a_large_state_is_estimated_from_a_sample_and_a_small_one_counted(
    db: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The overview stays bounded on a huge backlog: a state holding more than EXACT_BELOW
    jobs (by the sample) is estimated from SAMPLE_PAGES pages, marked as such; the others
    are exact. Here 30,000 ready jobs stand for the backlog, with thresholds scaled down."""
    db.execute(
        "INSERT INTO job (topic, state, available_at, payload, updated_at) "
        "SELECT 'a', 'pending', now() - interval '1 hour', "
        "       jsonb_build_object('pad', repeat('x', 200)), now() - interval '1 hour' "
        "FROM generate_series(1, 30000);"
        "INSERT INTO job (topic, state, updated_at) "
        "SELECT 'a', 'done', now() FROM generate_series(1, 3000);"
        "INSERT INTO job (topic, state) SELECT 'a', 'dead' FROM generate_series(1, 40);"
        "INSERT INTO job (topic, state, available_at) "
        "SELECT 'a', 'failed', now() + interval '1 hour' FROM generate_series(1, 5);"
        "INSERT INTO job (topic, state, locked_by, locked_until) "
        "SELECT 'a', 'processing', 'h:1:x', now() + interval '1 minute' "
        "FROM generate_series(1, 3);"
        "ANALYZE job"
    )
    row = db.execute("SELECT pg_relation_size('job') / 8192 AS pages").fetchone()
    assert row is not None
    pages = int(row["pages"])
    assert pages > 400
    monkeypatch.setattr(reads, "SAMPLE_PAGES", pages // 4)
    monkeypatch.setattr(reads, "SAMPLE_SEED", 7.0)
    monkeypatch.setattr(reads, "EXACT_BELOW", 10_000)
    monkeypatch.setattr(reads, "EXACT_CAP", 1_000)  # the done chart: over it, sampled
    data = reads.overview(db)
    (a,) = data["groups"]
    assert 0.8 * 30_000 < a["ready"] < 1.2 * 30_000, a  # scaled up from about a quarter
    assert (a["processing"], a["failed"], a["dead"]) == (3, 5, 40)  # exact
    assert a["estimated"] == {"ready", "held", "scheduled", "oldest_ready", "parked"}
    assert set(data["estimate"]["states"]) == {"pending"}
    assert 3_600 <= a["oldest_ready_seconds"] < 3_700  # a lower bound: sampled
    assert data["done_estimated"] and 0.5 * 3_000 < sum(done_per_minute(data)) < 1.5 * 3_000

    body = text(get(db, "/"))
    row = re.search(r"<tr><td>default</td><td>a</td>(.*?)</tr>", body)
    assert row is not None
    cells = re.findall(r'<td class="n">([^<]*)</td>', row.group(1))
    # waiting, scheduled, ready, held, retrying, parked, on_hold, processing, dead, oldest
    assert cells[0] == "0" and cells[2].startswith("≈ ") and cells[4] == "5", cells
    assert cells[6:9] == ["0", "3", "40"] and cells[9].startswith("≥ 1h "), cells
    assert "≈: estimated. pending (≈ " in body and "brooq queues" in body
    assert "done in the last hour: more than 1,000, so estimated" in body

    # A state the sample puts under EXACT_BELOW but whose count runs over EXACT_CAP is
    # cut short: its partial count is never shown, the estimate stands.
    monkeypatch.setattr(reads, "EXACT_BELOW", 10**9)
    data = reads.overview(db)
    (a,) = data["groups"]
    assert 0.8 * 30_000 < a["ready"] < 1.2 * 30_000 and "ready" in a["estimated"], a
    assert (a["failed"], a["dead"]) == (5, 40) and "dead" not in a["estimated"]
    # A small table is read whole: every figure exact, whatever the thresholds.
    monkeypatch.setattr(reads, "SAMPLE_PAGES", pages + 100)
    data = reads.overview(db)
    (a,) = data["groups"]
    assert (a["ready"], a["dead"], a["estimated"]) == (30_000, 40, set())
    assert data["estimate"] is None and not data["done_estimated"]
    assert sum(done_per_minute(data)) == 3_000


def test_read_only_wording(db: Conn) -> None:
    off = text(get(db, "/"))
    assert "QUEUE_ADMIN_TOKEN_FILE" in off and "admin-token" in off and "are off" in off
    on = text(get(db, "/", actions=True))
    assert 'href="/sign-in"' in on and "are off" not in on


def test_the_reads_run_read_only_under_a_statement_timeout(
    db: Conn, connect: Callable[..., Conn]
) -> None:
    with reads.read_only(db, timeout=0.25) as cur:
        row = cur.execute("SHOW statement_timeout").fetchone()
        assert row == {"statement_timeout": "250ms"}
        # Plans made for the values: psycopg prepares a statement run 5 times, and the
        # generic plan of the overview's statements reads far more (docs/status-page.md).
        mode = cur.execute("SHOW plan_cache_mode").fetchone()
        assert mode == {"plan_cache_mode": "force_custom_plan"}
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            cur.execute("INSERT INTO job (topic) VALUES ('t')")
    assert db.execute("SHOW statement_timeout").fetchone() != {"statement_timeout": "250ms"}
    # A page slower than its timeout (here: waiting behind a lock) is a 503, and the
    # connection is left idle and usable.
    locker = connect(autocommit=False)
    locker.execute("LOCK TABLE job IN ACCESS EXCLUSIVE MODE")
    try:
        response = serve(db, "GET", "/failed", actions_enabled=False, timeout=0.3)
        assert response.status == 503 and "longer than 0.3 s" in text(response)
        assert db.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    finally:
        locker.rollback()
    assert get(db, "/failed").status == 200


def test_the_headers(db: Conn) -> None:
    headers = dict(security_headers())
    csp = headers["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'none'"
    assert directives["style-src"] == f"'{STYLE_HASH}'"
    assert directives["form-action"] == "'self'"
    assert directives["frame-ancestors"] == "'none'"
    assert "unsafe-inline" not in csp and "script-src" not in directives
    assert headers["X-Content-Type-Options"] == "nosniff"
    # The hash is the one of the stylesheet the pages carry, byte for byte.
    body = text(get(db, "/"))
    assert f"<style>{STYLE}</style>" in body
    assert "style=" not in body and "<script" not in body
    for target in ["/", "/jobs/bad", f"/jobs/{uuid.uuid4()}", "/nowhere"]:
        response = get(db, target)
        got = dict(response.headers)
        assert got["Content-Security-Policy"] == csp, target
        assert got["X-Content-Type-Options"] == "nosniff", target
        assert got["Content-Type"] == "text/html; charset=utf-8", target


def test_render_helpers() -> None:
    from brooq.page.render import age, holder, href, pretty_json

    assert [age(s) for s in (None, 0, 59.9, 60, 3599, 3600, 86400 * 2 + 3600 * 4, -5)] == [
        "—", "0s", "59s", "1m 00s", "59m 59s", "1h 00m", "2d 04h", "-5s",
    ]  # fmt: skip
    assert holder("web-1.example.org:4242:ab12") == ("web-1.example.org", "4242")
    assert holder("odd") == ("odd", "?") and holder(None) == ("—", "—")
    assert href('/jobs/a b"<', after='1_"x"&y') == "/jobs/a%20b%22%3C?after=1_%22x%22%26y"
    assert "cut at 10 of" in pretty_json("x" * 50, limit=10)


def test_sample_blocks_are_evenly_spaced_and_as_many_as_asked() -> None:
    assert reads.sample_blocks(0, 500) == []
    assert reads.sample_blocks(3, 500) == [0, 1, 2]
    blocks = reads.sample_blocks(65_000, 500)
    assert len(blocks) == len(set(blocks)) == 500
    assert blocks[0] == 65 and blocks[-1] == 64_935
    assert {b - a for a, b in itertools.pairwise(blocks)} == {130}


def test_the_margin_comes_from_the_sample_spread() -> None:
    assert reads.margin(100, 100, 10, 10) == 0.0  # every page read
    assert reads.margin(0, 0, 500, 10_000) == 100.0  # nothing sampled
    # Every sampled page holds 60 jobs: no spread, no margin.
    assert reads.margin(60 * 500, 3600 * 500, 500, 10_000) == 0.0
    # Half the pages hold 120, half none: the spread of a clustered state.
    wide = reads.margin(120 * 250, 14_400 * 250, 500, 10_000)
    assert 8.0 < wide < 9.0  # 1.96 * sqrt((1 - 0.05) / 500) = 8.5 %
    assert reads.margin(120 * 1000, 14_400 * 1000, 2000, 10_000) < wide / 2


def test_an_estimate_is_within_its_margin_and_small_queues_are_exact(
    db: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlog estimated from a sample: the estimate lies within the margin the page
    states, and the queues beside it holding a few jobs are counted exactly, not scaled
    up from the sample or missed by it."""
    db.execute(
        "INSERT INTO job (topic, state, payload) SELECT 'a', 'pending', "
        "       jsonb_build_object('pad', repeat('x', (i % 7) * 60)) "
        "FROM generate_series(1, 20000) AS i;"
        "INSERT INTO job (topic, state, queue) SELECT 'b', 'pending', 'other' "
        "FROM generate_series(1, 7);"
        "INSERT INTO job (topic, state, queue, available_at) "
        "SELECT 'c', 'failed', 'third', now() + interval '1 hour' FROM generate_series(1, 2);"
        "INSERT INTO job (topic, state, payload) SELECT 'a', 'pending', "
        "       jsonb_build_object('pad', repeat('x', (i % 5) * 90)) "
        "FROM generate_series(1, 20000) AS i;"
        "INSERT INTO job (topic, state) SELECT 'a', 'done' FROM generate_series(1, 20000);"
    )
    row = db.execute("SELECT pg_relation_size('job') / 8192 AS pages").fetchone()
    assert row is not None
    pages = int(row["pages"])
    monkeypatch.setattr(reads, "SAMPLE_PAGES", pages // 8)
    monkeypatch.setattr(reads, "EXACT_BELOW", 10_000)
    data = reads.overview(db)
    groups = {(g["queue"], g["topic"]): g for g in data["groups"]}
    backlog = groups[("default", "a")]
    shown = data["estimate"]["margins"]["pending"]
    assert 0 < shown < 10
    assert abs(backlog["ready"] - 40_000) <= 40_000 * shown / 100, (backlog, shown)
    assert data["estimate"]["sampled"] == pages // 8
    other, third = groups[("other", "b")], groups[("third", "c")]
    assert (other["ready"], other["estimated"]) == (7, set())
    assert (third["retrying"], third["failed"], third["estimated"]) == (2, 2, set())
    assert third["scheduled"] == 0
    body = text(get(db, "/"))
    assert re.search(r"pending \(≈ [0-9,]+ jobs, ± [0-9.]+ %\)", body), body
    row = re.search(r"<tr><td>other</td><td>b</td>(.*?)</tr>", body)
    assert row is not None
    assert re.findall(r'<td class="n">([^<]*)</td>', row.group(1))[2] == "7"  # ready


def add_master(
    db: Conn, pid: int, topics: list[str], *, host: str = "h1", missed: float = 0, **kw: Any
) -> None:
    """A row of brooq_master as a master writes it, seen ``missed`` beats of 10 s ago."""
    children = kw.get("children", [])
    db.execute(
        "INSERT INTO brooq_master (id, host, pid, version, app, queues, topics, children, "
        "beat_seconds, started_at, seen_at) VALUES (gen_random_uuid(), %s, %s, %s, %s, %s, "
        "%s, %s, 10, now() - interval '1 hour', now() - %s * interval '10 seconds')",
        [host, pid, kw.get("version", "0.1.0"), kw.get("app", "app:queue"),
         kw.get("queues", ["default"]), topics, json.dumps(children), missed],
    )  # fmt: skip


def test_the_fleet_page_lists_the_live_masters_and_their_children_escaped(db: Conn) -> None:
    child = {
        "pid": 4242,
        "kind": "async",
        "generation": 3,
        "started_at": "2026-12-03T09:00:00+00:00",
    }
    add_master(db, 101, ["calc.hash"], host=HOSTILE, app=HOSTILE, children=[child])
    add_master(db, 102, ["mail.send"], host="h2")
    add_master(db, 103, ["vanished.topic"], host="h3", missed=4)  # missed its beats: not shown
    response = get(db, "/fleet")
    assert response.status == 200
    body = text(response)
    assert "<script>" not in body and ESCAPED in body
    assert "calc.hash" in body and "mail.send" in body and "vanished" not in body
    assert "4242" in body and "async" in body and ">3<" in body
    assert "h2 pid 102: children" in body
    overview = text(get(db, "/"))
    assert 'href="/fleet"' in overview and "Masters alive: 2, with 1 children" in overview
    assert get(db, "/fleet", method="POST").status == 405


def test_the_overview_marks_ready_jobs_no_live_master_handles(db: Conn) -> None:
    db.execute(
        "INSERT INTO job (topic, queue) VALUES ('calc.hash', 'default'), ('calc.hsah', "
        "'default'), ('calc.hash', 'bulk')"
    )
    db.execute("INSERT INTO job (topic, available_at) VALUES ('later', now() + interval '1 h')")
    add_master(db, 101, ["calc.hash", "later"])
    add_master(db, 102, ["calc.hsah"], missed=4)  # gone: handles nothing

    def mark(queue: str, topic: str) -> bool:
        row = re.search(rf"<tr><td>{queue}</td><td>{topic}</td>(.*?)</tr>", body)
        assert row is not None, (queue, topic)
        return ">no handler</strong>" in row.group(1)

    body = text(get(db, "/"))
    assert mark("default", "calc.hsah")  # nobody has the topic
    assert mark("bulk", "calc.hash")  # nobody works the queue
    assert not mark("default", "calc.hash")
    assert not mark("default", "later")  # nothing ready: nothing to say
