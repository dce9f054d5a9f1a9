"""The charts' SVG and the job page's pieces, pure: points only where there is a figure
above zero, every text escaped, odd history entries shown as far as they go."""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timedelta, timezone

from brooq.page.charts import figures
from brooq.page.jobview import graph_svg, standing, timeline
from brooq.page.render import line_chart


def test_a_line_chart_draws_a_point_per_figure_above_zero_and_escapes_its_texts() -> None:
    svg = line_chart(
        [("<b>done</b>", "#000", [0, 3, None, 5]), ("empty", "#111", [None, None])],
        "<i>first</i>",
        "last",
        'label "quoted"',
        unit=" s",
    )
    assert svg.count('<circle class="pt"') == 2
    assert "&lt;b&gt;done&lt;/b&gt;: 5 s" in svg and "<b>" not in svg and "<i>" not in svg
    assert 'aria-label="label &quot;quoted&quot;"' in svg
    assert svg.count("<polyline") == 1  # a series without any figure draws no line
    assert "<svg" in line_chart([], "a", "b", "nothing")  # no series: an empty chart


def test_the_figures_of_an_empty_window() -> None:
    start = datetime(2026, 12, 4, 10, 0, tzinfo=timezone.utc)
    data = {
        "step": 60,
        "buckets": 60,
        "start": start,
        "now": start + timedelta(minutes=59),
        "counts": {k: [0] * 60 for k in ("done", "dead", "failed", "backlog")},
        "percentiles": {k: [None] * 60 for k in ("run", "pickup")},
        "sampled": None,
        "cap": 100,
    }
    html = figures(data)
    assert html.count("<figure") == 5 and 'class="pt"' not in html
    assert html.count("None in this window.") == 2 and "Sampled" not in html
    assert "10:00" in html and "10:59 (now)" in html


def test_the_job_page_pieces_take_any_row() -> None:
    now = datetime(2026, 12, 4, 10, 0, tzinfo=timezone.utc)
    row = {
        "id": uuid.uuid4(),
        "topic": "t",
        "state": "failed",
        "attempts": 2,
        "available_at": now + timedelta(seconds=40),
        "updated_at": now - timedelta(seconds=5),
        "last_error": "ValueError: <bad>\nmore",
        "now": now,
        "errors": [
            {"attempt": 1, "at": "2026-12-04T09:59:50+00:00", "kind": "timeout",
             "started_at": "2026-12-04T09:59:49.5+00:00", "worker": "h:1:x",
             "traceback": "<tb>"},
            {"attempt": 2, "at": None, "worker": None},
            "a string",
        ],
    }  # fmt: skip
    word, why = standing(row)
    assert word == "retrying" and "in 40s" in why and "&lt;bad&gt;" in why and "more" not in why
    html = timeline(row)
    assert html.count('<li class="bad">') == 3 and "after 0.50 s" in html
    assert "&lt;tb&gt;" in html and "<tb>" not in html and "a string" in html
    assert graph_svg(row) == ""  # no neighbour, no graph
    many = {**row, "upstream": [{"id": uuid.uuid4(), "topic": "u", "state": "done"}] * 12,
            "upstream_total": 12}  # fmt: skip
    svg = graph_svg(many)
    assert len(re.findall(r'<a class="node"', svg)) == 8 and "… 4 more" in svg


def test_the_last_attempt_on_the_job_page_starts_at_its_claim() -> None:
    """started_at is the last attempt's claim: a done job's timeline says when it started,
    where and how long it ran; a processing one runs from it; a row claimed by an older
    release (no started_at) falls back to updated_at while processing, and a done one
    says only when it ended."""
    now = datetime(2026, 12, 4, 10, 0, tzinfo=timezone.utc)
    done = {
        "id": uuid.uuid4(),
        "state": "done",
        "attempts": 2,
        "now": now,
        "locked_by": "web1:4711:child-1",
        "started_at": now - timedelta(seconds=90),
        "updated_at": now - timedelta(seconds=60),
        "errors": [],
    }
    html = timeline(done)
    assert (
        '<li class="good"><strong>attempt 2</strong>: done<br>started 2026-12-04 09:58:30+00:00 '
        "on host web1, child pid 4711<br>ended 2026-12-04 09:59:00+00:00, after 30s</li>"
    ) in html, html
    word, why = standing(done)
    assert word == "done" and why.endswith("; the last one ran 30s"), why
    older = timeline({**done, "started_at": None})
    assert "<strong>attempt 2</strong>: done<br>ended 2026-12-04 09:59:00+00:00</li>" in older
    assert standing({**done, "started_at": None})[1].endswith("after 2 attempt(s)")
    running = {**done, "state": "processing", "locked_until": now + timedelta(seconds=30),
               "updated_at": now - timedelta(seconds=20)}  # fmt: skip
    html = timeline(running)
    assert "started 2026-12-04 09:58:30+00:00 on host web1" in html and "running for 1m 30s" in html
    assert "claimed at 2026-12-04 09:58:30+00:00" in standing(running)[1]
    html = timeline({**running, "started_at": None})
    assert "started 2026-12-04 09:59:40+00:00" in html and "running for 20s" in html
