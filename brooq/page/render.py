"""HTML for the status page: pure functions from values to text, and the page layout.

Every value that reaches a page goes through e() (html.escape with quote=True), in text
and in attributes alike; a URL is built by href() from quoted path segments and an
encoded query, then escaped as an attribute. The one stylesheet is STYLE, inline and
allowed by its hash in the Content-Security-Policy (brooq.page.headers); nothing carries a
style attribute or a script, and the chart is inline SVG drawn with presentation
attributes, so the policy needs neither 'unsafe-inline' nor img-src.

Owns: escaping, the layout, tables, ages, the chart, and the read-only notice.
Must never: read the database, interpolate an unescaped value, or reference anything
outside the page (no external stylesheet, font, image or script).
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
header{background:#1d3557;color:#fff;padding:.6em 1em}
header a{color:#fff;margin-right:1.2em}
main{padding:1em}
table{border-collapse:collapse;margin:.5em 0 1.5em;background:#fff}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums}
pre{white-space:pre-wrap;word-break:break-word;margin:0;max-width:80em}
.note{background:#fff3cd;border:1px solid #e0c060;padding:.5em 1em;max-width:60em}
.muted{color:#666}
nav.pages a{margin-right:1em}
svg{background:#fff;border:1px solid #ddd}
form.inline{display:inline;margin:0 .3em 0 0}
header form{display:inline;float:right;margin:0}
header input{width:22em}
.charts{display:flex;flex-wrap:wrap;gap:1em}
.charts figure{margin:0}
figcaption{font-weight:600;margin:.2em 0}
ol.timeline{list-style:none;padding:0;border-left:3px solid #457b9d;margin:.5em 0 1.5em .5em}
ol.timeline li{padding:.2em 0 .6em 1em}
ol.timeline li.bad{border-left:3px solid #c1121f;margin-left:-3px}
ol.timeline li.good{border-left:3px solid #2a9d8f;margin-left:-3px}
details{margin:.3em 0 1em}
summary{cursor:pointer;color:#1d3557}
dl.facts{display:grid;grid-template-columns:max-content auto;gap:.2em 1em;margin:.5em 0 1.5em}
dl.facts dt{color:#666}
dl.facts dd{margin:0}
.state{font-weight:700}
svg.dot{border:0;background:none;vertical-align:middle}
form.filter label{margin-right:.6em}
""".strip()

PAYLOAD_CHARS = 256 * 1024  # of a payload or result on the job page


def e(value: object) -> str:
    """The one way a value enters a page: as text, quotes included."""
    return html.escape(str(value), quote=True)


def href(path: str, **query: str | None) -> str:
    """An attribute-ready URL: path segments quoted, the query encoded, then escaped."""
    segments = "/".join(quote(part, safe="") for part in path.split("/"))
    params = {k: v for k, v in query.items() if v is not None}
    url = segments + ("?" + urlencode(params) if params else "")
    return e(url)


def link(path: str, text: str, **query: str | None) -> str:
    return f'<a href="{href(path, **query)}">{e(text)}</a>'


def job_link(job_id: object) -> str:
    return link(f"/jobs/{job_id}", str(job_id))


def age(seconds: float | None) -> str:
    """A duration for people: 42s, 3m 12s, 5h 07m, 2d 04h."""
    if seconds is None:
        return "—"
    s = int(seconds)
    sign = "-" if s < 0 else ""
    s = abs(s)
    if s < 60:
        return f"{sign}{s}s"
    if s < 3600:
        return f"{sign}{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{sign}{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{sign}{s // 86400}d {s % 86400 // 3600:02d}h"


def when(value: datetime | None) -> str:
    return "—" if value is None else value.isoformat(sep=" ", timespec="seconds")


def holder(locked_by: str | None) -> tuple[str, str]:
    """(host, child pid) from a locked_by `host:pid:tag` (brooq.worker.state)."""
    if not locked_by:
        return ("—", "—")
    parts = locked_by.rsplit(":", 2)
    if len(parts) != 3:
        return (locked_by, "?")
    return (parts[0], parts[1])


def pretty_json(value: Any, limit: int = PAYLOAD_CHARS) -> str:
    """A <pre> of the value as indented JSON, cut at limit characters (and said so)."""
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    cut = ""
    if len(text) > limit:
        cut = f'<p class="muted">cut at {limit:,} of {len(text):,} characters</p>'
        text = text[:limit]
    return f"<pre>{e(text)}</pre>{cut}"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], numeric: set[int]) -> str:
    """A table whose cells are already HTML (each built from e()'d values); headers are
    text. numeric: the column indexes aligned right."""
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="n">{cell}</td>' if i in numeric else f"<td>{cell}</td>"
            for i, cell in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    if not body:
        body.append(f'<tr><td colspan="{len(headers)}" class="muted">none</td></tr>')
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def bar_chart(
    values: Sequence[int], first_label: str, last_label: str, width: int = 600, height: int = 80
) -> str:
    """An inline SVG bar chart, one bar per value; a <title> per bar gives its figure."""
    top = max(values, default=0) or 1
    n = max(len(values), 1)
    step = width / n
    bars = []
    for i, v in enumerate(values):
        h = round(v / top * (height - 4))
        x = round(i * step, 1)
        bars.append(
            f'<rect x="{x}" y="{height - h}" width="{max(step - 1, 1):.1f}" height="{h}"'
            f' fill="#457b9d"><title>{e(v)}</title></rect>'
        )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 16}"'
        f' viewBox="0 0 {width} {height + 16}" role="img"'
        f' aria-label="done per minute, peak {e(top)}">{"".join(bars)}'
        f'<text x="0" y="{height + 13}" font-size="11" fill="#666">{e(first_label)}</text>'
        f'<text x="{width}" y="{height + 13}" font-size="11" fill="#666"'
        f' text-anchor="end">{e(last_label)}</text></svg>'
    )


# The header's search: a job by its id (GET /find?id=..., answered by a redirect to the
# job's page, or the not-found page).
SEARCH = (
    '<form class="search" method="get" action="/find" role="search">'
    '<input type="search" name="id" maxlength="64" placeholder="job id" '
    'aria-label="job id" required> <button type="submit">find job</button></form>'
)

# The colours of the states, on the job page's graph and its state line.
STATE_COLORS = {
    "waiting": "#8d99ae",
    "scheduled": "#a8dadc",
    "ready": "#457b9d",
    "pending": "#457b9d",
    "retrying": "#f4a261",
    "failed": "#f4a261",
    "parked": "#b5838d",
    "on_hold": "#7b5ea7",
    "processing": "#e9c46a",
    "done": "#2a9d8f",
    "dead": "#c1121f",
    "canceled": "#6c757d",
}


def _figure(value: float) -> str:
    if value >= 100 or float(value).is_integer():
        return f"{value:,.0f}"
    return f"{value:.2g}" if value < 1 else f"{value:.1f}"


def line_chart(
    series: Sequence[tuple[str, str, Sequence[float | None]]],
    first_label: str,
    last_label: str,
    label: str,
    unit: str = "",
    width: int = 560,
    height: int = 110,
) -> str:
    """An inline SVG line chart: one polyline per series (name, colour, one value per
    bucket, None where there is none), a circle (class "pt", its figure in a <title>) at
    each bucket with a value above 0, the peak on the axis, and a legend. Every value
    is a number or None; names and labels are escaped."""
    values = [v for _, _, vs in series for v in vs if v is not None]
    top = max(values, default=0.0) or 1.0
    n = max((len(vs) for _, _, vs in series), default=1)
    step = width / max(n - 1, 1)
    plot = height - 6
    parts = []
    for name, color, vs in series:
        points = [
            (round(i * step, 1), round(height - 3 - v / top * plot, 1), v)
            for i, v in enumerate(vs)
            if v is not None
        ]
        if not points:
            continue
        line = " ".join(f"{x},{y}" for x, y, _ in points)
        parts.append(
            f'<polyline points="{line}" fill="none" stroke="{e(color)}" stroke-width="1.5"/>'
        )
        for x, y, v in points:
            if v > 0:
                parts.append(
                    f'<circle class="pt" cx="{x}" cy="{y}" r="2" fill="{e(color)}">'
                    f"<title>{e(name)}: {e(_figure(v))}{e(unit)}</title></circle>"
                )
    legend = "".join(
        f'<text x="{8 + 110 * i}" y="{height + 28}" font-size="11" fill="{e(color)}">'
        f"■ {e(name)}</text>"
        for i, (name, color, _) in enumerate(series)
    )
    total = height + 34
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + 50}" height="{total}"'
        f' viewBox="-4 -4 {width + 54} {total + 4}" role="img" aria-label="{e(label)}">'
        f'<line x1="0" y1="{height - 3}" x2="{width}" y2="{height - 3}" stroke="#ccc"/>'
        f"{''.join(parts)}"
        f'<text x="{width + 4}" y="10" font-size="11" fill="#666">{e(_figure(top))}{e(unit)}'
        "</text>"
        f'<text x="{width + 4}" y="{height - 3}" font-size="11" fill="#666">0</text>'
        f'<text x="0" y="{height + 12}" font-size="11" fill="#666">{e(first_label)}</text>'
        f'<text x="{width}" y="{height + 12}" font-size="11" fill="#666"'
        f' text-anchor="end">{e(last_label)}</text>{legend}</svg>'
    )


def button(
    action: str,
    label: str,
    csrf: str,
    back: str,
    hint: str = "",
    fields: Sequence[tuple[str, str]] = (),
) -> str:
    """A one-click action: a small POST form to an action's own endpoint (the page
    process's brooq.page.actions answers it, as for the forms of /actions), with
    the session's CSRF token, the page to come back to and ``fields`` (name, value),
    each a hidden input."""
    title = f' title="{e(hint)}"' if hint else ""
    hidden = "".join(
        f'<input type="hidden" name="{e(name)}" value="{e(value)}">' for name, value in fields
    )
    return (
        f'<form class="inline" method="post" action="{href(action)}">'
        f'<input type="hidden" name="csrf" value="{e(csrf)}">'
        f'<input type="hidden" name="back" value="{e(back)}">{hidden}'
        f'<button type="submit"{title}>{e(label)}</button></form>'
    )


def read_only_notice(actions_enabled: bool, signed_in: bool = False) -> str:
    if not actions_enabled:
        return (
            '<p class="note">Read-only: actions (cancel, retry, hold, release, pause, '
            "resume) are off because no admin token is configured. To enable them, give "
            "brooq-master a token in a file named by <code>QUEUE_ADMIN_TOKEN_FILE</code>, or "
            "as the systemd credential <code>admin-token</code> (<code>LoadCredential="
            "admin-token:/path</code> in the unit), and restart it.</p>"
        )
    if signed_in:
        return (
            '<p class="note">Signed in: the lists and job pages carry their buttons (retry, '
            "cancel, hold, release, pause, resume); bulk operations and signing out are on "
            f"{link('/actions', 'actions')}.</p>"
        )
    return (
        '<p class="note">Actions (cancel, retry, hold, release, bulk, pause, resume): '
        f"{link('/sign-in', 'sign in')} once with the admin token; the lists and job pages "
        f"then carry their buttons, and {link('/actions', 'actions')} the bulk forms.</p>"
    )


NAV = (
    ("/", "Overview"),
    ("/charts", "Charts"),
    ("/in-flight", "In flight"),
    ("/failed", "Failed"),
    ("/dead", "Dead"),
    ("/on-hold", "On hold"),
    ("/keys", "Blocked keys"),
    ("/schedules", "Schedules"),
    ("/fleet", "Fleet"),
    ("/actions", "Actions"),
)


def layout(
    title: str,
    body: str,
    *,
    actions_enabled: bool,
    refresh: int | None = None,
    signed_in: bool = False,
    note: str = "",
) -> bytes:
    """The whole document. body is HTML built from e()'d values; title is text; note:
    HTML (built from e()'d values) shown under the title, before everything else (where
    the pages read, when it is a replica)."""
    meta = f'<meta http-equiv="refresh" content="{int(refresh)}">' if refresh else ""
    nav = "".join(link(path, text) for path, text in NAV) + SEARCH
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"{meta}<title>{e(title)} · brooq</title><style>{STYLE}</style></head>"
        f"<body><header><strong>brooq</strong> &nbsp; {nav}</header><main>"
        f"<h1>{e(title)}</h1>{note}{read_only_notice(actions_enabled, signed_in)}{body}"
        "</main></body></html>\n"
    ).encode()
