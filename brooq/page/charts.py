"""The status page's charts: throughput, failures, pickup latency, run time and backlog
over the last hour or day, of every job or of one queue and topic, drawn as inline SVG
from brooq.page.reads.charts (the statement: web_charts; docs/status-page.md, "Charts").

Owns: which charts are drawn, their captions and the notes that say what each one
counts. Must never: read the database, or let a value reach a page without
brooq.page.render.e().
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from brooq.page.reads import WINDOWS, Row
from brooq.page.render import e, layout, line_chart, link

REFRESH = 30  # seconds: the charts page reloads itself (a meta refresh, no script)
TITLES = {"hour": "last hour, per minute", "day": "last day, per 15 minutes"}
PERCENTILE_COLORS = (("p50", "#457b9d"), ("p95", "#e9c46a"), ("p99", "#c1121f"))


def _labels(data: Row) -> tuple[str, str]:
    start: datetime = data["start"]
    last = start + timedelta(seconds=data["step"] * (data["buckets"] - 1))
    if data["step"] >= 3600 // 4:  # a day: say which one
        return f"{start:%b %d %H:%M}", f"{last:%b %d %H:%M} (now)"
    return f"{start:%H:%M}", f"{last:%H:%M} (now)"


def _percentile_series(
    values: Sequence[tuple[float, float, float] | None],
) -> list[tuple[str, str, list[float | None]]]:
    return [
        (name, color, [None if v is None else v[i] for v in values])
        for i, (name, color) in enumerate(PERCENTILE_COLORS)
    ]


def figures(data: Row, which: Sequence[str] = ("throughput", "failures", "pickup", "run",
                                                "backlog")) -> str:  # fmt: skip
    """The charts asked for, each a <figure> with its caption and a line saying what it
    counts; then how exact they are."""
    first, last = _labels(data)
    counts, pct = data["counts"], data["percentiles"]
    per = "minute" if data["step"] == 60 else "15 minutes"
    charts = {
        "throughput": (
            f"Throughput: done per {per}",
            line_chart([("done", "#2a9d8f", counts["done"])], first, last, "done per bucket"),
            f"{sum(counts['done']):,} done",
        ),
        "failures": (
            f"Failures per {per}",
            line_chart(
                [
                    ("failed attempts", "#f4a261", counts["failed"]),
                    ("dead", "#c1121f", counts["dead"]),
                ],
                first,
                last,
                "failed attempts and dead jobs per bucket",
            ),
            f"{sum(counts['failed']):,} failed attempts, {sum(counts['dead']):,} dead",
        ),
        "pickup": (
            "Pickup latency (due to claimed), percentiles",
            line_chart(_percentile_series(pct["pickup"]), first, last, "pickup latency", unit=" s"),
            "due to claim, of the attempts claimed in each interval, whether they ended or "
            "not (an attempt that failed is not counted: its retry moved the job's due time)",
        ),
        "run": (
            "Run time, percentiles",
            line_chart(_percentile_series(pct["run"]), first, last, "run time", unit=" s"),
            "claim to end, of the attempts that ended in each interval: done jobs' last "
            "attempts and the failed ones their history keeps",
        ),
        "backlog": (
            "Backlog: ready jobs",
            line_chart([("ready", "#457b9d", counts["backlog"])], first, last, "ready jobs"),
            "ready at the end of each interval, rebuilt from each job's due time and claim "
            "(a retried job's earlier waits are not kept)",
        ),
    }
    empty = " None in this window."
    parts = []
    for name in which:
        caption, svg, note = charts[name]
        if name in pct and all(v is None for v in pct[name]):
            note += empty
        parts.append(
            f'<figure id="chart-{e(name)}"><figcaption>{e(caption)}</figcaption>{svg}'
            f'<p class="muted">{e(note)}</p></figure>'
        )
    exact = (
        f'<p class="note">Sampled: more than {data["cap"]:,} rows in a source of these charts, so '
        f"they are drawn from {data['sampled']:.2g} % of the table's pages, counts scaled "
        "up.</p>"
        if data["sampled"]
        else ""
    )
    return f'<div class="charts">{"".join(parts)}</div>{exact}'


def charts_page(data: Row, actions_enabled: bool, signed_in: bool = False, note: str = "") -> bytes:
    """The charts of one window, of every job or one queue and topic, with the form
    that picks them (a GET form: no script)."""
    window, queue, topic = data["window"], data["queue"], data["topic"]
    options = "".join(
        f'<option value="{e(w)}"{" selected" if w == window else ""}>{e(TITLES[w])}</option>'
        for w in WINDOWS
    )
    form = (
        '<form class="filter" method="get" action="/charts">'
        f'<label>window <select name="window">{options}</select></label>'
        f'<label>queue <input type="text" name="queue" value="{e(queue or "")}" '
        'maxlength="128"></label>'
        f'<label>topic <input type="text" name="topic" value="{e(topic or "")}" '
        'maxlength="128"></label> <button type="submit">show</button> '
        f"{link('/charts', 'every job', window=window)}</form>"
    )
    other = "day" if window == "hour" else "hour"
    whose = " · ".join(
        f"{name} {value}" for name, value in (("queue", queue), ("topic", topic)) if value
    )
    heading = f"<h2>{e(whose) if whose else 'Every queue and topic'}: {e(TITLES[window])}</h2>"
    body = (
        form
        + heading
        + figures(data)
        + f"<p>{link('/charts', f'the {other}', window=other, queue=queue, topic=topic)}</p>"
    )
    return layout(
        "Charts",
        body,
        actions_enabled=actions_enabled,
        refresh=REFRESH,
        signed_in=signed_in,
        note=note,
    )
