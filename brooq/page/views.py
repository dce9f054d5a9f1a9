"""The status page's pages: each one's HTML assembled from its reads' rows (brooq.page.reads)
and render's pieces (brooq.page.render): the overview, the in-flight list, the failed and
dead lists, the fleet (one job's page: brooq.page.jobview).

Owns: what each page shows and in which order, the one-click buttons of the lists, the
notes that say what an estimate means. Must never: write to the database, or let a value
reach a page without brooq.page.render.e().
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg

from brooq.ipc import progress
from brooq.job_options import TAG_FORM, TAG_PATTERN
from brooq.operator.masters import MISSED_BEATS, MasterRow, handled, no_handler
from brooq.page import charts, reads
from brooq.page.lines import LIMITS_NOTE, fleet_line, limits_cell, snapshot_line
from brooq.page.reads import Page, Row
from brooq.page.render import (
    age,
    bar_chart,
    button,
    e,
    holder,
    job_link,
    layout,
    link,
    table,
    when,
)
from brooq.sql import Q, Queries

# The overview's counts, in the order every surface shows them
# (docs/explanation/guarantees.md).
COUNTS = (
    "waiting",
    "scheduled",
    "ready",
    "held",
    "retrying",
    "parked",
    "on_hold",
    "processing",
    "dead",
)
COUNTS_NOTE = (
    '<p class="muted">waiting: for the jobs named in their <code>after</code>; scheduled: '
    "due later; ready: due now, a worker may claim them; held: part of ready, held back "
    "now by a limit of their topic; retrying: failed, waiting out their backoff; parked: "
    "a durable handler's jobs sleeping or waiting for an event or their child jobs; "
    "on_hold: held by an operator, never claimed until released; processing: taken by a "
    "worker under a lease; dead: given up on. Each unfinished job is in exactly one of "
    "them (held is part of ready).</p>"
)
CANCEL_RUNNING = "cancel: its handler is interrupted at once (LeaseLost)"
REFRESH = 10  # seconds, the overview and in-flight pages (a meta refresh, no script)
CHARTS_AGE = 30.0  # seconds: how old the overview's charts may be (reads.charts' max_age)
NO_HANDLER = (
    '<strong title="no live master handles this topic in this queue: its ready jobs wait '
    'until one does (see the fleet)">no handler</strong>'
)


def _n(value: object) -> str:
    return e(f"{value:,}") if isinstance(value, int) else e(value)


def about(value: int) -> str:
    """An estimate as shown: two significant figures (the note gives each state's
    margin), marked."""
    shown = value if value < 100 else int(float(f"{value:.2g}"))
    return f"≈ {shown:,}"


def overview_page(
    conn: psycopg.Connection[Any],
    actions_enabled: bool,
    timeout: float,
    csrf: str | None = None,
    q: Queries = Q,
    note: str = "",
) -> bytes:
    data = reads.overview(conn, timeout, q)
    hour = reads.charts(conn, "hour", timeout=timeout, q=q, max_age=CHARTS_AGE)
    paused = {row["name"] for row in data["paused"]}
    live = handled(data["masters"])
    limits = data["limits"]
    rows = []
    buttoned: set[str] = set()  # a queue's button on its first row only
    for g in data["groups"]:
        name = g["queue"]
        queue = e(name) + (" <strong>(paused)</strong>" if name in paused else "")
        if csrf is not None and name not in buttoned:
            buttoned.add(name)
            verb = "resume" if name in paused else "pause"
            queue += " " + button(f"/queues/{name}/{verb}", verb, csrf, "/", f"{verb} queue {name}")

        def figure(name: str, g: Row = g) -> str:
            return e(about(g[name])) if name in g["estimated"] else _n(g[name])

        oldest = age(g["oldest_ready_seconds"])
        if "oldest_ready" in g["estimated"] and g["oldest_ready_seconds"] is not None:
            oldest = f"≥ {oldest}"
        topic_limits = limits.get(g["topic"])
        if topic_limits is not None and topic_limits.held_by and g["ready"]:
            oldest = f"held back ({topic_limits.held_by})"  # waiting its turn, not stuck
        held = (
            '<span class="muted" title="some groups of this topic are held back">some</span>'
            if g["held"] is None
            else figure("held")
        )
        rows.append(
            (
                queue,
                e(g["topic"]),
                *(figure(count) for count in ("waiting", "scheduled", "ready")),
                held,
                *(figure(count) for count in COUNTS[COUNTS.index("retrying") :]),
                e(oldest),
                limits_cell(topic_limits),
                NO_HANDLER if no_handler(name, g["topic"], g["ready"], live) else "",
                link("/charts", "charts", queue=name, topic=g["topic"]),
            )
        )
    headers = ("queue", "topic", *COUNTS, "oldest ready", "limits", "", "")
    parts = [
        fleet_line(data["masters"]),
        snapshot_line(data["oldest_snapshot"], data.get("snapshots_unseen", False)),
        table(headers, rows, numeric=set(range(2, 3 + len(COUNTS)))),
        COUNTS_NOTE,
    ]
    if limits:
        parts.append(LIMITS_NOTE)
    if data["groups_cut"]:
        parts.append(f'<p class="muted">only the first {reads.MAX_GROUPS} shown</p>')
    if data["estimate"] is not None:
        parts.append(estimate_note(data["estimate"]))
    parts.append(f"<h2>Done per minute, last hour</h2>{done_chart(data)}")
    if hour is not None:
        parts.append(
            "<h2>Last hour</h2>"
            + charts.figures(hour, ("failures", "backlog", "pickup"))
            + f"<p>{link('/charts', 'Every chart, per queue and topic, over the hour or the day')}"
            "</p>"
        )
    parts.append("<h2>Paused queues</h2>")

    def resume(name: str) -> str:
        if csrf is not None:
            return button(f"/queues/{name}/resume", "resume", csrf, "/", f"resume queue {name}")
        return link("/actions", "resume…", queue=name) if actions_enabled else ""

    parts.append(
        table(
            ("queue", "paused since", ""),
            ((e(r["name"]), e(when(r["updated_at"])), resume(r["name"])) for r in data["paused"]),
            numeric=set(),
        )
    )
    if data["paused_cut"]:
        parts.append(f'<p class="muted">only the first {reads.MAX_PAUSED} shown</p>')
    return layout(
        "Overview",
        "".join(parts),
        actions_enabled=actions_enabled,
        refresh=REFRESH,
        signed_in=csrf is not None,
        note=note,
    )


def fleet_page(
    masters: list[MasterRow], actions_enabled: bool, signed_in: bool = False, note: str = ""
) -> bytes:
    """Every live master: where, what it runs, when it was last seen; its children."""
    parts = [
        '<p class="muted">Each master writes its row on every beat (QUEUE_FLEET_BEAT) and '
        f"deletes it when it stops; one that missed {MISSED_BEATS} of its beats (killed, "
        "its host gone) is not shown. As <code>brooq fleet</code> lists them.</p>"
    ]
    rows = [
        (
            e(m.host),
            e(m.pid),
            e(m.version),
            e(m.app),
            e(", ".join(m.queues)),
            e(", ".join(m.topics)),
            _n(len(m.children)),
            e(when(m.started_at)),
            e(age(m.seen_seconds_ago)) + " ago",
        )
        for m in masters
    ]
    headers = ("host", "pid", "version", "app", "queues", "topics", "children", "started",
               "seen")  # fmt: skip
    parts.append(table(headers, rows, numeric={1, 6}))
    for m in masters:
        parts.append(f"<h2>{e(m.host)} pid {e(m.pid)}: children</h2>")
        children = (
            (e(c.pid), e(c.kind), _n(c.generation), e(when(c.started_at))) for c in m.children
        )
        parts.append(table(("pid", "kind", "generation", "started"), children, numeric={0, 2}))
    return layout(
        "Fleet",
        "".join(parts),
        actions_enabled=actions_enabled,
        refresh=REFRESH,
        signed_in=signed_in,
        note=note,
    )


def estimate_note(estimate: Row) -> str:
    """What the ≈ figures are, on the page itself: which states, from what sample, how
    precise (each state's margin, from the sample's own spread), and where the exact
    count is."""
    margins = estimate["margins"]
    states = ", ".join(
        f"{e(s)} ({e(about(n))} jobs, ± {margins[s]:.2g} %)" for s, n in estimate["states"].items()
    )
    per_row = max(round(estimate["per_row"]), 1)
    history = estimate.get("history")
    finished = (
        f"The dead jobs of job_history, where finished jobs are kept, are estimated from "
        f"{history['sampled']:,} of its {history['pages']:,} pages (picked at random by "
        "TABLESAMPLE SYSTEM), with those still in job. "
        if history
        else ""
    )
    return (
        f'<p class="note">≈: estimated. {states}: more than the '
        f"{reads.EXACT_BELOW:,} jobs a state may hold to be counted one by one on this "
        f"page, so its figures are estimated from {estimate['sampled']:,} of the table's "
        f"{estimate['pages']:,} pages ({estimate['percent']:.2g} %, evenly spaced); the "
        "margin is the sample's 95 % bound for the state's total. "
        f"{finished}One sampled job stands "
        f"for about {per_row:,}, so a small figure of such a state may be missing or off "
        "by that much, except the waiting jobs of a queue holding fewer than "
        f"{reads.EXACT_BELOW:,}, which are counted exactly. ≥: the oldest ready job is at "
        "least that old. Every other figure is exact. <code>brooq queues</code> counts "
        "every row (per queue).</p>"
    )


def done_per_minute(data: Row) -> list[int]:
    """Sixty figures, oldest minute first, the current (partial) minute last."""
    counts = {row["minute"]: int(row["jobs"]) for row in data["done_per_minute"]}
    last: datetime = data["minute"]
    return [counts.get(last - timedelta(minutes=59 - i), 0) for i in range(60)]


def done_chart(data: Row) -> str:
    values = done_per_minute(data)
    last: datetime = data["minute"]
    first = last - timedelta(minutes=59)
    total = sum(values)
    chart = bar_chart(values, f"{first:%H:%M}", f"{last:%H:%M} (now)")
    if data["done_estimated"]:
        return (
            f'{chart}<p class="muted">{e(about(total))} done in the last hour: more than '
            f"{reads.EXACT_CAP:,}, so estimated from a sample of the hour's pages (of job and "
            "of the finished jobs' job_history)</p>"
        )
    return f'{chart}<p class="muted">{_n(total)} done in the last hour</p>'


# A list's filters (brooq.page.routes checks them): topic, group and tag; None: any.
Filters = dict[str, "str | None"]
# The lists a filter form goes to by state (GET /list?state=... answers a redirect).
LISTS = (
    ("processing", "/in-flight"),
    ("failed", "/failed"),
    ("dead", "/dead"),
    ("on_hold", "/on-hold"),
)


def _pages(path: str, page: Page, filters: Filters | None = None) -> str:
    given = dict(filters or {})
    links = [link(path, "first page", **given)]
    if page.next is not None:
        links.append(link(path, "next page", after=reads.encode_cursor(page.next), **given))
    return f'<nav class="pages">{"".join(links)}</nav>'


def list_filter(path: str, filters: Filters | None = None) -> str:
    """The lists' filters: state (which list), topic, group and tag, a GET form (no
    script) to /list, which sends the browser to the state's list with the others; and
    a link back to every job of this list."""
    filters = filters or {}
    options = "".join(
        f'<option value="{e(state)}"{" selected" if target == path else ""}>{e(state)}</option>'
        for state, target in LISTS
    )

    def field(name: str, size: int, extra: str = "") -> str:
        value = filters.get(name)
        shown = f' value="{e(value)}"' if value else ""
        return (
            f'<label>{e(name)} <input type="text" name="{e(name)}"{shown} '
            f'maxlength="{size}"{extra}></label>'
        )

    tag_rule = f' pattern="{e(TAG_PATTERN.pattern)}" title="{e(TAG_FORM)}"'
    clear = f" {link(path, 'every job')}" if any(filters.values()) else ""
    return (
        '<form class="filter" method="get" action="/list">'
        f'<label>state <select name="state">{options}</select></label>'
        f"{field('topic', 128)}{field('group', 256)}{field('tag', 64, tag_rule)}"
        f'<button type="submit">filter</button>{clear}</form>'
    )


def tag_filter(path: str, tag: str | None) -> str:
    """The filter form with only a tag given (kept for callers of the tag filter)."""
    return list_filter(path, {"tag": tag})


def _tags(tags: list[str]) -> str:
    return e(", ".join(tags)) if tags else ""


def stack_form(job_id: object, csrf: str | None, actions_enabled: bool) -> str:
    """The stack button: a POST like every action's (signed in, with the CSRF token), since
    it asks a worker for something; signed out, the way to sign in."""
    if csrf is None:
        if actions_enabled:
            return link("/sign-in", "sign in for the stack")
        return '<span class="muted">needs an admin token</span>'
    return (
        f'<form method="post" action="{e(f"/jobs/{job_id}/stack")}">'
        f'<input type="hidden" name="csrf" value="{e(csrf)}">'
        '<button type="submit" title="the Python stack of the running handler, now">'
        "stack</button></form>"
    )


def in_flight_page(
    page: Page,
    actions_enabled: bool,
    csrf: str | None = None,
    here: str = "/in-flight",
    note: str = "",
    tag: str | None = None,
    filters: Filters | None = None,
) -> bytes:
    filters = filters if filters is not None else {"tag": tag}
    rows = []
    for r in page.rows:
        host, pid = holder(r["locked_by"])
        lease = "expired" if (r["lease_left"] or 0) < 0 else age(r["lease_left"])
        rows.append(
            (
                job_link(r["id"]),
                e(r["topic"]),
                e(r["queue"]),
                _n(r["attempts"]),
                e(pid),
                e(host),
                e(age(r["running_for"])),
                e(lease),
                e(progress.text(r["progress"], r["progress_message"])),
                _tags(r["tags"]),
                stack_form(r["id"], csrf, actions_enabled),
                *(
                    [button(f"/jobs/{r['id']}/cancel", "cancel", csrf, here, CANCEL_RUNNING)]
                    if csrf is not None
                    else []
                ),
            )
        )
    headers = ["job", "topic", "queue", "attempt", "child pid", "host", "running for",
               "lease left", "progress", "tags", "stack"]  # fmt: skip
    if csrf is not None:
        headers.append("action")
    stack_note = (
        '<p class="muted">The stack button shows the Python stack of the running handler '
        "right now, from whichever host runs it (as <code>brooq jobs stack ID</code>).</p>"
    )
    body = (
        stack_note
        + list_filter("/in-flight", filters)
        + table(headers, rows, numeric={3, 4, 6, 7})
        + _pages("/in-flight", page, filters)
    )
    return layout(
        "In flight",
        body,
        actions_enabled=actions_enabled,
        refresh=REFRESH,
        signed_in=csrf is not None,
        note=note,
    )


# The one-click buttons' hints, by action (a running job's cancel: CANCEL_RUNNING).
HINTS = {
    "retry": "back to pending, now",
    "cancel": "no more attempts",
    "hold": "never claimed until released; its place in line kept",
    "release": "back to pending, its place in line kept",
}


def row_actions(state: str, job_id: object, csrf: str | None, here: str) -> str:
    """A failed, dead or held row's buttons: what brooq.job's rules allow from that
    state (a dead job can be retried; a failed one, which waits for its next attempt
    already, can be canceled; a held one released or canceled), or, signed out, a link
    to the job's forms on /actions."""
    if csrf is None:
        words = "release/cancel…" if state == "on_hold" else "retry/cancel…"
        return link("/actions", words, job=str(job_id))
    if state == "dead":
        return button(f"/jobs/{job_id}/retry", "retry", csrf, here, HINTS["retry"])
    cancel = button(f"/jobs/{job_id}/cancel", "cancel", csrf, here, HINTS["cancel"])
    if state == "on_hold":
        return button(f"/jobs/{job_id}/release", "release", csrf, here, HINTS["release"]) + cancel
    return cancel


TITLES = {
    "failed": "Failed (waiting for a retry)",
    "dead": "Dead",
    "on_hold": "On hold (until released)",
}
HELD_NOTE = (
    '<p class="muted">Held by an operator (a hold button, <code>brooq jobs hold</code>, '
    "<code>queue.hold</code>, or enqueued with <code>held=True</code>): never claimed "
    "until released. A release "
    "puts the job back to pending with its place in line: due at once when its time has "
    "passed. Most recently held first.</p>"
)


def finished_badly_page(
    state: str,
    page: Page,
    actions_enabled: bool,
    csrf: str | None = None,
    here: str = "",
    note: str = "",
    tag: str | None = None,
    filters: Filters | None = None,
) -> bytes:
    filters = filters if filters is not None else {"tag": tag}
    path = dict(LISTS)[state]
    here = here or path
    rows = []
    for r in page.rows:
        error = e(r["last_error"] or "")
        if (r["last_error_length"] or 0) > len(r["last_error"] or ""):
            error += ' <span class="muted">(cut; whole on the job page)</span>'
        rows.append(
            (
                job_link(r["id"]),
                e(r["topic"]),
                e(r["queue"]),
                _n(r["attempts"]),
                e(when(r["updated_at"])),
                e(when(r["available_at"])) if state != "dead" else "",
                f"<pre>{error}</pre>",
                _n(r["errors_count"]),
                _tags(r["tags"]),
                row_actions(state, r["id"], csrf, here) if actions_enabled else "",
            )
        )
    headers = ["job", "topic", "queue", "attempts", "at", "next attempt", "last error", "errors",
               "tags"]  # fmt: skip
    headers.append("" if not actions_enabled else "actions")
    if state == "dead":
        headers[5] = ""
    if state == "on_hold":  # held at (the hold writes updated_at); due once released
        headers[4:6] = ["held at", "due"]
    title = TITLES[state]
    body = (
        (HELD_NOTE if state == "on_hold" else "")
        + list_filter(path, filters)
        + table(headers, rows, numeric={3, 7})
        + _pages(path, page, filters)
    )
    return layout(
        title, body, actions_enabled=actions_enabled, signed_in=csrf is not None, note=note
    )
