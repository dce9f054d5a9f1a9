"""The status page's charts, job page, search and list filters against a real PostgreSQL:
each chart's series from seeded rows (throughput, failures, pickup latency, run time,
backlog), per queue and topic, over the hour and the day, exact and sampled; the job page's
standing, attempts timeline with its tracebacks, graph and raw fields; the header's
search; the lists' filters by topic, group and tag."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from brooq.page import reads
from brooq.page.jobview import instant
from tests.db.test_page import ESCAPED, HOSTILE, get, insert, text

Conn = psycopg.Connection[Any]


@pytest.fixture
def db(connect: Callable[..., Conn]) -> Conn:
    return connect()


def minute_start(db: Conn) -> datetime:
    row = db.execute("SELECT date_trunc('minute', now()) AS m").fetchone()
    assert row is not None
    value: datetime = row["m"]
    return value


def seed(db: Conn) -> dict[str, Any]:
    """Jobs of queue "q", topic "t.a" (and a few of "t.b"), placed in known minutes of the
    last hour, relative to the current minute `m`, each with its due time (available_at),
    its last claim (started_at) and its end (updated_at): done ones, dead ones, failures
    kept in the error history with their starts, jobs being processed, jobs ready now."""
    m = minute_start(db)

    def at(minutes: int, seconds: int = 10) -> datetime:
        return m - timedelta(minutes=minutes) + timedelta(seconds=seconds)

    for _ in range(3):  # 3 done in the minute 5 minutes ago: picked up in 4 s, ran 15 s
        insert(db, queue="q", topic="t.a", state="done", available_at=at(5, 1),
               started_at=at(5, 5), updated_at=at(5, 20))  # fmt: skip
    insert(db, queue="q", topic="t.b", state="done", available_at=at(5, 1), started_at=at(5, 5),
           updated_at=at(5, 20))  # fmt: skip
    # Due 8 minutes ago, claimed 140 s later, done after 20 s: ready through two minutes.
    insert(db, queue="q", topic="t.a", state="done", available_at=at(8, 10),
           started_at=at(6, 30), updated_at=at(6, 50))  # fmt: skip
    # A dead job 10 minutes ago, its three failed attempts in the minutes 12, 11 and 10
    # ago, each run 2, 4 and 6 seconds.
    errors = [
        {"attempt": n, "at": at(13 - n, 30).isoformat(), "started_at":
         at(13 - n, 30 - 2 * n).isoformat(), "worker": "h:1:x", "error": f"E{n}",
         "kind": "raised", "traceback": f"Traceback {n}"}
        for n in (1, 2, 3)
    ]  # fmt: skip
    # Its available_at is the retry it never got: neither a pickup nor a ready span.
    dead = insert(db, queue="q", topic="t.a", state="dead", attempts=3, errors=errors,
                  available_at=at(10, 40), started_at=at(10, 24), updated_at=at(10, 30),
                  last_error="E3")  # fmt: skip
    # An entry of an older release (no started_at) and one that is not a time: counted
    # as failures when their `at` is one, never an error.
    # Its retry is due in an hour: its claim (3 minutes ago) is no pickup to chart.
    insert(db, queue="q", topic="t.a", state="failed", attempts=1, updated_at=at(3),
           started_at=at(3, 2), available_at=m + timedelta(hours=1),
           errors=[{"attempt": 1, "at": at(3).isoformat(), "error": "old"},
                   {"attempt": 2, "at": "yesterday", "error": "odd"}, "not an object"])  # fmt: skip
    # Two jobs being processed, claimed a minute ago, due one and two minutes before.
    for due in (2, 3):
        insert(db, queue="q", topic="t.a", state="processing", attempts=1, locked_by="h:2:y",
               locked_until=m + timedelta(minutes=5), updated_at=at(1, 40),
               started_at=at(1, 40), available_at=at(due, 40))  # fmt: skip
    # Four jobs ready since 20 minutes ago (and one scheduled, never ready yet).
    for _ in range(4):
        insert(db, queue="q", topic="t.a", state="pending", available_at=at(20))
    insert(db, queue="q", topic="t.a", state="pending", available_at=m + timedelta(hours=2))
    # Due 25 minutes ago, claimed a minute later, given back 15 minutes ago (a released
    # claim: updated_at), ready since.
    insert(db, queue="q", topic="t.a", state="pending", available_at=at(25, 10),
           started_at=at(24, 10), updated_at=at(15, 10))  # fmt: skip
    return {"m": m, "dead": dead}


def test_each_chart_counts_what_happened_in_its_minute(db: Conn) -> None:
    world = seed(db)
    data = reads.charts(db, "hour", queue="q", topic="t.a")
    assert data["sampled"] is None and data["step"] == 60 and data["buckets"] == 60
    assert data["start"] == world["m"] - timedelta(minutes=59)
    counts, pct = data["counts"], data["percentiles"]
    last = 59  # the current minute

    def only(series: list[Any]) -> dict[int, Any]:
        return {i: v for i, v in enumerate(series) if v}

    assert only(counts["done"]) == {last - 6: 1, last - 5: 3}  # t.b's is not t.a's
    assert only(counts["dead"]) == {last - 10: 1}
    assert only(counts["failed"]) == {last - 12: 1, last - 11: 1, last - 10: 1, last - 3: 1}
    # Run time by the minute an attempt ended: the failed ones from their history
    # entries, the done ones from their rows (claim to end).
    assert only(pct["run"]) == {
        last - 12: (2.0, 2.0, 2.0),
        last - 11: (4.0, 4.0, 4.0),
        last - 10: (6.0, 6.0, 6.0),
        last - 6: (20.0, 20.0, 20.0),
        last - 5: (15.0, 15.0, 15.0),
    }
    # Pickup by the minute of the claim, due to claim, ended or not: the released job's
    # claim, the done ones', the processing ones' (60 s and 120 s); not the failed or
    # the dead job's (their due time is a retry's).
    p50, p95, p99 = pct["pickup"][last - 1]
    assert (p50, round(p95, 1), round(p99, 1)) == (90.0, 117.0, 119.4)
    assert {i: v for i, v in only(pct["pickup"]).items() if i != last - 1} == {
        last - 24: (60.0, 60.0, 60.0),
        last - 6: (140.0, 140.0, 140.0),
        last - 5: (4.0, 4.0, 4.0),
    }
    # Ready at each minute's end: the four pending ones from 20 minutes ago, the
    # released one from 15; the late done one from 8 minutes ago to its claim 6 minutes
    # ago; the three done 5 minutes ago were ready for 4 s within it; the processing ones
    # from their due (3 and 2 minutes ago) to their claim, a minute ago.
    backlog = counts["backlog"]
    assert backlog[: last - 20] == [0] * (last - 20)
    assert backlog[last - 20 :] == [4] * 5 + [5] * 7 + [6, 6, 5, 5, 5, 6, 7, 5, 5], backlog
    # Every queue and topic: t.b's done job too.
    every = reads.charts(db, "hour")
    assert every["counts"]["done"][last - 5] == 4
    # The day: 15-minute buckets; the same figures, summed.
    day = reads.charts(db, "day", queue="q", topic="t.a")
    assert (day["step"], day["buckets"], sum(day["counts"]["done"])) == (900, 96, 4)
    assert sum(day["counts"]["failed"]) == 4 and day["counts"]["backlog"][-1] == 5


def test_a_source_past_its_cap_is_charted_from_a_sample(
    db: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    db.execute(
        "INSERT INTO job (topic, state, available_at, started_at, updated_at) "
        "SELECT 't', 'done', now() - interval '2 minutes', now() - interval '100 seconds', "
        "now() - interval '90 seconds' FROM generate_series(1, 3000)"
    )

    def figures(data: dict[str, Any]) -> tuple[set[Any], set[Any]]:
        pct = data["percentiles"]
        return {v for v in pct["pickup"] if v}, {v for v in pct["run"] if v}

    exact = reads.charts(db, "hour")
    assert exact["sampled"] is None and sum(exact["counts"]["done"]) == 3000
    # Each was picked up 20 s after its due time and ran 10 s.
    assert figures(exact) == ({(20.0, 20.0, 20.0)}, {(10.0, 10.0, 10.0)})
    monkeypatch.setattr(reads, "CHART_CAP", 500)
    monkeypatch.setattr(reads, "CHART_SAMPLE_PAGES", 10)
    sampled = reads.charts(db, "hour")
    assert sampled["sampled"] is not None and sampled["sampled"] < 100
    assert 0.4 * 3000 < sum(sampled["counts"]["done"]) < 1.6 * 3000
    assert figures(sampled) == figures(exact)
    body = text(get(db, "/charts"))
    assert "Sampled: more than 500 rows" in body


def test_the_charts_page_draws_every_chart_as_inline_svg(db: Conn) -> None:
    seed(db)
    body = text(get(db, "/charts?window=hour&queue=q&topic=t.a"))
    for name in ("throughput", "failures", "pickup", "run", "backlog"):
        figure = re.search(rf'<figure id="chart-{name}">(.*?)</figure>', body, re.S)
        assert figure is not None, name
        assert "<svg" in figure.group(1) and 'class="pt"' in figure.group(1), name
    assert "<script" not in body and 'http-equiv="refresh"' in body
    day = text(get(db, "/charts?window=day"))
    assert "last day, per 15 minutes" in day and 'class="pt"' in day
    # The overview shows the last hour's failures, backlog and pickup, and links here.
    overview = text(get(db, "/"))
    assert (
        '<figure id="chart-failures">' in overview
        and 'href="/charts?queue=q&amp;topic=t.a"' in overview
    )
    # Hostile names are text; a wrong window or a filter given twice is a 400.
    hostile = text(get(db, "/charts?topic=%3Cscript%3Ealert(1)%3C%2Fscript%3E%22%27%26"))
    assert "<script>" not in hostile and "&lt;script&gt;" in hostile
    assert get(db, "/charts?window=week").status == 400
    assert get(db, "/charts?topic=a&topic=b").status == 400
    assert get(db, "/charts?topic=" + "x" * 300).status == 400


def test_the_job_page_reads_as_a_story(db: Conn) -> None:
    world = seed(db)
    body = text(get(db, f"/jobs/{world['dead']}"))
    assert '<span class="state">dead</span>: given up at ' in body and "after 3 attempt(s)" in body
    assert "<h2>Attempts (3)</h2>" in body
    items = re.findall(r'<li class="bad">(.*?)</li>', body, re.S)
    assert len(items) == 3
    assert "<strong>attempt 1</strong>: raised" in items[0] and "after 2s" in items[0]
    assert "<strong>attempt 3</strong>: dead" in items[2] and "after 6s" in items[2]
    assert "host h, child pid 1" in items[0]
    assert '<details class="traceback"><summary>traceback</summary>' in items[0]
    assert "Traceback 1" in items[0]
    assert '<details class="raw"><summary>' in body and "<th>errors</th>" in body


def test_the_job_page_tolerates_any_history_and_shows_where_a_job_stands(db: Conn) -> None:
    now = datetime.now(timezone.utc)
    hostile = insert(db, state="failed", attempts=1, available_at=now + timedelta(minutes=1),
                     errors=[HOSTILE, {"attempt": "x", "at": 5, "traceback": HOSTILE},
                             {"started_at": "garbage"}])  # fmt: skip
    cases = {
        insert(db, state="pending", available_at=now + timedelta(hours=1)): "scheduled",
        insert(db, state="pending", available_at=now - timedelta(minutes=1)): "ready",
        insert(
            db,
            state="failed",
            attempts=1,
            available_at=now + timedelta(minutes=1),
            errors=None,
            last_error="boom",
        ): "retrying",
        insert(
            db,
            state="processing",
            attempts=2,
            locked_by="h:3:z",
            locked_until=now + timedelta(minutes=1),
            progress=0.5,
            progress_message="half",
        ): "processing",
        insert(db, state="done", attempts=1, result={"ok": True}): "done",
        insert(db, state="canceled", last_error="by an operator"): "canceled",
        hostile: "retrying",
        insert(
            db,
            state="failed",
            attempts=1,
            available_at=now + timedelta(minutes=1),
            errors={"not": "a list"},
        ): "retrying",
    }
    for job_id, word in cases.items():
        response = get(db, f"/jobs/{job_id}")
        body = text(response)
        assert response.status == 200, (word, body[-2000:])
        assert f'<span class="state">{word}</span>' in body, word
        assert "<script>" not in body
    body = text(get(db, f"/jobs/{hostile}"))
    assert ESCAPED in body and '<details class="traceback">' in body


def test_the_graph_is_drawn_with_each_job_linking_to_its_page(db: Conn) -> None:
    ids = [uuid.uuid4() for _ in range(3)]
    insert(db, id=ids[0], topic="up.one", state="done")
    insert(db, id=ids[1], topic="mid", state="waiting", upstream_open=1)
    insert(db, id=ids[2], topic="down.two", state="waiting", upstream_open=1)
    db.execute(
        "INSERT INTO brooq_job_edge (upstream_id, downstream_id, position) "
        "VALUES (%s, %s, 1), (%s, %s, 1)",
        (ids[0], ids[1], ids[1], ids[2]),
    )
    body = text(get(db, f"/jobs/{ids[1]}"))
    graph = re.search(r'<svg id="graph"(.*?)</svg>', body, re.S)
    assert graph is not None
    assert f'<a class="node" href="/jobs/{ids[0]}">' in graph.group(1)
    assert f'<a class="node" href="/jobs/{ids[2]}">' in graph.group(1)
    assert '<g class="node here">' in graph.group(1) and "down.two" in graph.group(1)
    assert "up.one" in graph.group(1) and "fill-opacity" in graph.group(1)
    assert '<span class="state">waiting</span>: waits for 1 upstream job(s)' in body
    # A job outside any graph has none.
    assert '<svg id="graph"' not in text(get(db, f"/jobs/{insert(db, state='done')}"))


def test_the_search_finds_a_job_and_sends_the_rest_to_the_not_found_page(db: Conn) -> None:
    job_id = insert(db, state="done")
    for typed in (str(job_id), f"  {job_id} ", str(job_id).upper(), f"urn:uuid:{job_id}"):
        response = get(db, f"/find?id={typed.replace(' ', '+').replace(':', '%3A')}")
        assert response.status == 303, typed
        assert dict(response.headers)["Location"] == f"/jobs/{job_id}"
    for typed in ("", "nope", "%3Cscript%3E", "x" * 500):
        response = get(db, f"/find?id={typed}")
        assert response.status == 404 and "<script>" not in text(response), typed
        assert 'action="/find"' in text(response)
    unknown = get(db, f"/find?id={uuid.uuid4()}")
    assert unknown.status == 303  # then /jobs/<id> says it is not there
    assert get(db, dict(unknown.headers)["Location"]).status == 404


def test_the_lists_filter_by_topic_group_and_tag(db: Conn) -> None:
    a = insert(db, topic="mail.send", state="dead", group_key="tenant-1", tags=["eu"])
    b = insert(db, topic="mail.send", state="dead", group_key="tenant-2", tags=["eu"])
    c = insert(db, topic="img.resize", state="dead", group_key="tenant-1")
    p = insert(db, topic="img.resize", state="processing", group_key="tenant-1",
               locked_by="h:1:x", locked_until=datetime.now(timezone.utc))  # fmt: skip

    def listed(target: str) -> set[str]:
        response = get(db, target)
        assert response.status == 200, target
        return set(re.findall(r'href="/jobs/([0-9a-f-]{36})"', text(response)))

    assert listed("/dead") == {str(a), str(b), str(c)}
    assert listed("/dead?topic=mail.send") == {str(a), str(b)}
    assert listed("/dead?group=tenant-1") == {str(a), str(c)}
    assert listed("/dead?topic=mail.send&group=tenant-1&tag=eu") == {str(a)}
    assert listed("/in-flight?group=tenant-1") == {str(p)}
    assert listed("/in-flight?topic=mail.send") == set()
    body = text(get(db, "/dead?topic=mail.send&group=tenant-1"))
    assert 'name="topic" value="mail.send"' in body and 'name="group" value="tenant-1"' in body
    assert '<option value="dead" selected>' in body
    # The form's state picks the list; the other filters follow it.
    response = get(db, "/list?state=dead&topic=mail.send&group=&tag=eu")
    assert response.status == 303
    assert dict(response.headers)["Location"] == "/dead?topic=mail.send&tag=eu"
    assert get(db, "/list?state=done").status == 400
    assert get(db, "/dead?group=a&group=b").status == 400


def test_history_times_are_read_as_postgresql_writes_them() -> None:
    assert instant("2026-12-04T22:45:17.12345+00:00") == datetime(
        2026, 12, 4, 22, 45, 17, 123450, tzinfo=timezone.utc
    )
    assert instant("2026-12-04T22:45:17+01:00") is not None
    assert instant("2026-12-04 22:45:17Z") is not None
    for odd in ("yesterday", 5, None, "2026-13-45T99:99:99+00:00", "2026-12-04T22:45:17+0x"):
        assert instant(odd) is None, odd


def test_held_counts_the_ready_jobs_a_topics_limits_hold_back(db: Conn) -> None:
    """A topic at its rate_limit: every ready job held; a topic with one group at its
    group_limit: that group's ready jobs held (counted exactly, the backlog being small);
    a topic without limits: none."""
    from tests.db.test_rate_limits import claim, handler, jobs, publish

    rated, grouped = handler("api.rated", rate_limit="1/m"), handler("tw", group_limit=1)
    publish(db, {"api.rated": {"queue": "default", **rated.limits()}})
    publish(db, {"tw": {"queue": "default", **grouped.limits()}})
    jobs(db, "api.rated", 3)
    jobs(db, "tw", 3, "A")
    jobs(db, "tw", 2, "B")
    jobs(db, "plain", 2)
    assert claim(db, rated)[0]["id"] and claim(db, grouped)[0]["id"]
    groups = {g["topic"]: g for g in reads.overview(db)["groups"]}
    ready_held = {t: (groups[t]["ready"], groups[t]["held"]) for t in ("api.rated", "tw", "plain")}
    # tw: the group claimed first (A or B) is at its limit; its other ready jobs are held.
    assert ready_held["api.rated"] == (2, 2) and ready_held["plain"] == (2, 0)
    assert ready_held["tw"][0] == 4 and ready_held["tw"][1] in (1, 2), ready_held


def test_the_overview_takes_charts_read_moments_ago_and_the_charts_page_reads_now(
    db: Conn,
) -> None:
    first = reads.charts(db, "hour", max_age=30)
    insert(db, state="dead", updated_at=datetime.now(timezone.utc))
    assert reads.charts(db, "hour", max_age=30) is first  # one read for a refresh
    fresh = reads.charts(db, "hour")
    assert sum(fresh["counts"]["dead"]) == sum(first["counts"]["dead"]) + 1
    assert reads.charts(db, "hour", max_age=30) is fresh  # the newest read is kept
    assert reads.charts(db, "day", max_age=30) is not fresh  # by window (and filter)


def test_a_ready_job_held_back_by_its_topics_limit_says_so(db: Conn) -> None:
    from tests.db.test_rate_limits import claim, handler, jobs, publish

    rated = handler("api.rated", rate_limit="1/m")
    publish(db, {"api.rated": {"queue": "default", **rated.limits()}})
    jobs(db, "api.rated", 2)
    jobs(db, "plain", 1)
    ready = db.execute("SELECT id FROM job WHERE topic = 'plain'").fetchone()
    assert ready is not None
    body = text(get(db, f"/jobs/{ready['id']}"))
    assert '<span class="state">ready</span>: due since ' in body
    assert claim(db, rated)[0]["id"]
    waiting = db.execute(
        "SELECT id FROM job WHERE topic = 'api.rated' AND state = 'pending'"
    ).fetchone()
    assert waiting is not None
    body = text(get(db, f"/jobs/{waiting['id']}"))
    assert '<span class="state">held</span>: ready since ' in body
    assert "held back now by its topic's <code>rate_limit</code>" in body
