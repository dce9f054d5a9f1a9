"""One job's page, for people: what the job is (topic, queue, payload, tags, group,
priority), where it stands (its state in the counts' words, with when and why), its
attempts as a timeline (when, on which worker, how long, how each ended, the traceback a
click away), its progress, the jobs of its graph drawn as SVG (upstream and downstream,
a durable handler's child jobs) and listed, its recorded steps, the logs a
``keep_logs`` handler kept, and every field of the row behind a toggle.

Owns: what the job page shows and in which order. Must never: write to the database, or
let a value reach a page without brooq.page.render.e().
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

from brooq.ipc import progress
from brooq.job import FROM_STATES, Transition
from brooq.page.reads import GRAPH_COUNT_CAP, Row
from brooq.page.render import (
    STATE_COLORS,
    age,
    button,
    e,
    holder,
    href,
    job_link,
    layout,
    link,
    pretty_json,
    table,
    when,
)
from brooq.page.views import CANCEL_RUNNING, HINTS, _n, stack_form

# What the page shows in sections of their own, or not as a column.
_NOT_COLUMNS = frozenset(
    {"logs", "upstream", "downstream", "upstream_total", "downstream_total",
     "traceparent_chars", "steps", "steps_total", "children", "children_total",
     "event_wait", "now", "limits_held"}
)  # fmt: skip
SUMMARY_CHARS = 160  # of the payload's JSON in the job's summary (whole below it)
TRACEBACK_CHARS = 16_384  # of an attempt's traceback (brooq keeps at most 8,192)
GRAPH_NODES = 8  # jobs drawn on each side of the graph (every one listed below it)


def _cell(name: str, value: Any, row: Row | None = None) -> str:
    if name == "traceparent" and value is None and row and row.get("traceparent_chars"):
        chars = int(row["traceparent_chars"])
        return f'<span class="muted">not a W3C traceparent ({chars:,} characters)</span>'
    if value is None:
        return '<span class="muted">NULL</span>'
    if name in ("payload", "result", "errors"):
        return pretty_json(value)
    if isinstance(value, datetime):
        return e(when(value))
    if name == "last_error":
        return f"<pre>{e(value)}</pre>"
    if name == "tags" and isinstance(value, list):
        return e(", ".join(map(str, value)))
    return e(value)


def shown_of(shown: int, total: int) -> str:
    """A list's heading count: "(3)" when the page shows them all, else "(100 of
    5,000)" or "(100 of 10,000+)" beyond the count's cap."""
    if total <= shown:
        return f"({shown:,})"
    more = "+" if total > GRAPH_COUNT_CAP else ""
    return f"({shown:,} of {min(total, GRAPH_COUNT_CAP):,}{more})"


def graph_tables(row: Row) -> str:
    """The jobs this one waits or waited for, and those that wait or waited for it
    (docs/how-to/workflows.md), each with its state; nothing for a job outside a graph."""
    parts = []
    for key, title in (("upstream", "Waits for (upstream)"), ("downstream", "Waited for by")):
        jobs = row.get(key) or []
        if jobs:
            cells = [(job_link(j["id"]), e(j["topic"]), e(j["state"])) for j in jobs]
            count = shown_of(len(jobs), int(row.get(f"{key}_total") or len(jobs)))
            parts.append(f"<h2>{e(title)} {e(count)}</h2>")
            parts.append(table(("job", "topic", "state"), cells, numeric=set()))
            if len(jobs) < int(row.get(f"{key}_total") or 0):
                parts.append(f'<p class="muted">only the first {len(jobs):,} shown</p>')
    return "".join(parts)


def parked_line(row: Row, heading: bool = True) -> str:
    """What a parked job (a durable handler's: job.parked, read with its state) sleeps
    until or waits for; nothing for a job that is not parked."""
    state, parked, until = row.get("state"), row.get("parked"), row.get("available_at")
    wait = row.get("event_wait")
    if parked == "sleep" and state == "pending":
        text = f"sleeps until {e(when(until))}"
    elif parked == "event" and state in ("pending", "waiting") and wait is not None:
        key = f"<code>{e(wait['key'])}</code>"
        if int(wait["key_chars"]) > len(wait["key"]):
            key += f' <span class="muted">(first {len(wait["key"]):,} of '
            key += f"{int(wait['key_chars']):,} characters)</span>"
        text = f"waits for the event {key} since {e(when(wait['since']))}"
        if state == "pending":
            text += f", until {e(when(until))}"
    elif parked == "jobs" and state == "waiting":
        open_ = row.get("upstream_open")
        count = "" if open_ is None else f": {_n(int(open_))} not ended yet"
        text = f"waits for its child jobs{count}"
    else:
        return ""
    return f"<h2>Parked</h2><p>{text}</p>" if heading else text


def durable_tables(row: Row) -> str:
    """A durable handler's job: the jobs it spawned (claim.spawn) with their states, and
    its recorded steps (name, when, size of the result; never the result itself), each
    list bounded, its heading counting them all; nothing for a job that used none."""
    parts = []
    children = row.get("children") or []
    if children:
        total = int(row.get("children_total") or len(children))
        parts.append(f"<h2>Child jobs {e(shown_of(len(children), total))}</h2>")
        cells = [(job_link(j["id"]), e(j["topic"]), e(j["state"])) for j in children]
        parts.append(table(("job", "topic", "state"), cells, numeric=set()))
        if len(children) < total:
            parts.append(f'<p class="muted">only the first {len(children):,} shown</p>')
    steps = row.get("steps") or []
    if steps:
        total = int(row.get("steps_total") or len(steps))
        parts.append(f"<h2>Recorded steps {e(shown_of(len(steps), total))}</h2>")
        cells = []
        for s in steps:
            name = e(s["name"])
            if int(s["name_chars"]) > len(s["name"]):
                name += " …"
            size = "NULL" if s["size"] is None else f"{int(s['size']):,} B"
            cells.append((name, e(when(s["created_at"])), e(size)))
        parts.append(table(("step", "recorded", "result size"), cells, numeric={2}))
        if len(steps) < total:
            parts.append(
                f'<p class="muted">only the first {len(steps):,} shown; '
                f"<code>brooq jobs show {e(row['id'])} --json</code> lists them all</p>"
            )
    return "".join(parts)


def kept_logs(row: Row) -> str:
    """The tails of the kept logs, oldest attempt first, each saying what was cut and
    where the whole text is."""
    parts = []
    kept = row.get("logs") or []
    entries = int(kept[0]["entries"]) if kept else 0
    if entries > len(kept):
        parts.append(
            f'<p class="muted">the last {len(kept):,} of {entries:,} attempts\' logs shown</p>'
        )
    for item in kept:
        head = f"Logs of attempt {item['attempt'] or ''}, ended {item['at'] or ''}"
        parts.append(f"<h2>{e(head)}</h2>")
        more = int(item["text_bytes"]) - int(item["shown_bytes"])
        if more > 0:
            parts.append(
                f'<p class="muted">… {more:,} bytes more before this, see '
                f"<code>brooq jobs logs {e(row['id'])}</code></p>"
            )
        parts.append(f"<pre>{e(item['text'] or '')}</pre>")
    return "".join(parts)


_INSTANT = re.compile(
    r"^(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d)(?:\.(\d{1,6}))?(Z|[+-]\d\d(?::?\d\d)?)?$"
)


def instant(value: object) -> datetime | None:
    """A time of a history entry (JSON text as PostgreSQL writes a timestamptz, or a
    datetime), or None for anything else."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        return None
    found = _INSTANT.match(value.strip())
    if found is None:
        return None
    base, fraction, zone = found.groups()
    zone = zone or "+00:00"
    zone = "+00:00" if zone == "Z" else zone
    if len(zone) == 3:
        zone += ":00"
    elif ":" not in zone:
        zone = f"{zone[:3]}:{zone[3:]}"
    try:
        micros = (fraction or "").ljust(6, "0")
        return datetime.fromisoformat(f"{base.replace(' ', 'T')}.{micros}{zone}")
    except ValueError:
        return None


def duration(seconds: float) -> str:
    """How long an attempt ran: 0.35 s under a second, else as age() writes it."""
    return f"{seconds:.2f} s" if 0 <= seconds < 1 else age(seconds)


def standing(row: Row) -> tuple[str, str]:
    """The job's standing in the counts' words (waiting, scheduled, ready, retrying,
    parked, on_hold, processing, or the finished states) and a sentence of when and why,
    as HTML."""
    state, now = row.get("state"), row.get("now")
    due: datetime | None = row.get("available_at")
    updated: datetime | None = row.get("updated_at")
    attempts = int(row.get("attempts") or 0)

    def since(moment: datetime | None) -> str:
        if moment is None or now is None:
            return ""
        gap = (now - moment).total_seconds()
        return f" ({e(age(gap))} ago)" if gap >= 0 else f" (in {e(age(-gap))})"

    parked = parked_line(row, heading=False)
    if parked:
        return "parked", parked
    later = due is not None and now is not None and due > now
    error = (str(row.get("last_error") or "").splitlines() or [""])[0][:300]
    if state == "on_hold":
        place = f"due at {e(when(due))}{since(due)}" if later else "ready at once"
        return "on_hold", (
            f"on hold since {e(when(updated))}{since(updated)}: never claimed until "
            f"released; released, it keeps its place in line ({place})"
        )
    if state == "waiting":
        open_ = row.get("upstream_open")
        count = "its upstream jobs" if open_ is None else f"{_n(int(open_))} upstream job(s)"
        return "waiting", f"waits for {count} to end (listed below)"
    if state == "pending" and later:
        return "scheduled", f"due at {e(when(due))}{since(due)}"
    if state == "failed" and later:
        return "retrying", (
            f"attempt {attempts:,} failed at {e(when(updated))}{since(updated)}: "
            f"<code>{e(error)}</code>; the next attempt is due at {e(when(due))}{since(due)}"
        )
    if state in ("pending", "failed"):
        held = row.get("limits_held") or {}
        if held.get("held_by"):
            return "held", (
                f"ready since {e(when(due))}{since(due)}, held back now by its topic's "
                f"<code>{e(held['held_by'])}</code> (a worker claims it once there is room)"
            )
        text = f"due since {e(when(due))}{since(due)}: a worker may claim it now"
        if held.get("groups_held") and row.get("group_key"):
            groups = int(held["groups_held"])
            text += (
                f"; {groups:,} group(s) of its topic are at their limit now, its group "
                f"<code>{e(row['group_key'])}</code> may be one"
            )
        return "ready", text
    if state == "processing":
        host, pid = holder(row.get("locked_by"))
        claimed = row.get("started_at") or updated  # a claim of an older master: updated_at
        return "processing", (
            f"attempt {attempts:,}, claimed at {e(when(claimed))}{since(claimed)} on host "
            f"{e(host)}, child pid {e(pid)}; its lease runs until "
            f"{e(when(row.get('locked_until')))}"
        )
    if state == "done":
        text = f"at {e(when(updated))}{since(updated)}, after {attempts:,} attempt(s)"
        started: datetime | None = row.get("started_at")
        if started is not None and updated is not None and started <= updated:
            text += f"; the last one ran {e(duration((updated - started).total_seconds()))}"
        return "done", text
    if state == "dead":
        return "dead", (
            f"given up at {e(when(updated))}{since(updated)} after {attempts:,} attempt(s): "
            f"<code>{e(error)}</code>"
        )
    if state == "canceled":
        why = f": <code>{e(error)}</code>" if error else ""
        return "canceled", f"at {e(when(updated))}{since(updated)}{why}"
    return str(state), ""


def facts(row: Row) -> str:
    """What the job is, in a few lines."""
    payload = json.dumps(row.get("payload"), ensure_ascii=False, sort_keys=True, default=str)
    if len(payload) > SUMMARY_CHARS:
        payload = payload[:SUMMARY_CHARS] + " …"
    tags = row.get("tags") or []
    items = [
        ("job", e(row.get("id"))),
        ("topic", e(row.get("topic"))),
        ("queue", e(row.get("queue"))),
        ("priority", e(row.get("priority"))),
        ("group", e(row.get("group_key")) if row.get("group_key") else "—"),
        ("tags", e(", ".join(map(str, tags))) if tags else "—"),
        ("payload", f"<code>{e(payload)}</code>"),
        ("created", e(when(row.get("created_at")))),
    ]
    for name, key in (("unique key", "unique_key"), ("idempotency key", "idempotency_key")):
        if row.get(key):
            items.append((name, f"<code>{e(row[key])}</code>"))
    cells = "".join(f"<dt>{e(k)}</dt><dd>{v}</dd>" for k, v in items)
    return f'<dl class="facts">{cells}</dl>'


def _attempt_item(entry: dict[str, Any], final_state: str | None, last: bool) -> str:
    started, ended = instant(entry.get("started_at")), instant(entry.get("at"))
    host, pid = holder(str(entry["worker"])) if entry.get("worker") else ("—", "—")
    kind = str(entry.get("kind") or "failed")
    how = "dead" if last and final_state == "dead" else kind
    lines = [f"<strong>attempt {e(entry.get('attempt', '?'))}</strong>: {e(how)}"]
    where = f"host {e(host)}, child pid {e(pid)}"
    if started is not None:
        lines.append(f"started {e(when(started))} on {where}")
    else:
        lines.append(f"on {where}")
    if ended is not None:
        took = ""
        if started is not None:
            took = f", after {e(duration((ended - started).total_seconds()))}"
        lines.append(f"ended {e(when(ended))}{took}")
    elif entry.get("at"):
        lines.append(f"ended {e(entry['at'])}")
    text = "<br>".join(lines)
    text += f"<pre>{e(entry.get('error', ''))}</pre>"
    trace = entry.get("traceback")
    if isinstance(trace, str) and trace:
        cut = ""
        if len(trace) > TRACEBACK_CHARS:
            cut = f'<p class="muted">the last {TRACEBACK_CHARS:,} of {len(trace):,} characters</p>'
            trace = trace[-TRACEBACK_CHARS:]
        text += (
            f'<details class="traceback"><summary>traceback</summary>{cut}<pre>{e(trace)}</pre>'
            "</details>"
        )
    return f'<li class="bad">{text}</li>'


def timeline(row: Row) -> str:
    """The attempts, oldest first: each failed one from the error history (job.errors:
    attempt, at, started_at, worker, error, kind, traceback; entries of older releases
    carry the first four), then the attempt running now or the one that ended the job
    well, from the row: its start (started_at, the claim) and, once done, its end
    (updated_at) and how long it ran."""
    errors = row.get("errors")
    entries = [
        x if isinstance(x, dict) else {"error": x}
        for x in (errors if isinstance(errors, list) else [])
    ]
    state = row.get("state")
    attempts = int(row.get("attempts") or 0)
    items = [_attempt_item(x, state, i == len(entries) - 1) for i, x in enumerate(entries)]
    started: datetime | None = row.get("started_at")
    ended: datetime | None = row.get("updated_at")
    if state == "processing":
        host, pid = holder(row.get("locked_by"))
        started = started or ended  # claimed by an older master: updated_at is the claim
        running = ""
        if row.get("now") is not None and started is not None:
            running = f", running for {e(age((row['now'] - started).total_seconds()))}"
        items.append(
            f"<li><strong>attempt {attempts:,}</strong>: processing<br>started "
            f"{e(when(started))} on host {e(host)}, child pid {e(pid)}"
            f"{running}</li>"
        )
    elif state == "done":
        lines = [f"<strong>attempt {attempts:,}</strong>: done"]
        if started is not None and ended is not None and started <= ended:
            host, pid = holder(row.get("locked_by"))
            lines.append(f"started {e(when(started))} on host {e(host)}, child pid {e(pid)}")
            took = f", after {e(duration((ended - started).total_seconds()))}"
        else:
            took = ""
        lines.append(f"ended {e(when(ended))}{took}")
        items.append(f'<li class="good">{"<br>".join(lines)}</li>')
    kept = ""
    numbered = [int(x["attempt"]) for x in entries if isinstance(x.get("attempt"), int)]
    if numbered and min(numbered) > 1:
        kept = (
            f'<p class="muted">attempts before {min(numbered):,} are no longer kept '
            "(a job keeps its last 20 failures)</p>"
        )
    if not items:
        return '<h2>Attempts (0)</h2><p class="muted">not claimed yet</p>'
    return (
        f"<h2>Attempts ({_n(max(attempts, len(entries)))})</h2>{kept}"
        f'<ol class="timeline">{"".join(items)}</ol>'
    )


def _node(job: Row, x: int, y: int, width: int, here: bool = False) -> str:
    state = str(job.get("state") or "")
    color = STATE_COLORS.get(state, "#adb5bd")
    topic = str(job.get("topic") or "")
    if len(topic) > 26:
        topic = topic[:25] + "…"
    short = "…" + str(job.get("id"))[-8:]
    stroke = ' stroke="#1d1d1f" stroke-width="2"' if here else ""
    box = (
        f'<rect x="{x}" y="{y}" width="{width}" height="34" rx="5" fill="{e(color)}"'
        f' fill-opacity="0.35"{stroke}/>'
        f'<text x="{x + 6}" y="{y + 14}" font-size="11" fill="#1d1d1f">{e(topic)}</text>'
        f'<text x="{x + 6}" y="{y + 28}" font-size="10" fill="#333">{e(short)} · {e(state)}'
        f"</text><title>{e(job.get('id'))}: {e(state)}</title>"
    )
    if here:
        return f'<g class="node here">{box}</g>'
    target = href(f"/jobs/{job.get('id')}")
    return f'<a class="node" href="{target}">{box}</a>'


def graph_svg(row: Row) -> str:
    """The job between the jobs it waits or waited for (left) and those that wait or
    waited for it and the child jobs it spawned (right), each drawn in its state's
    colour and linking to its page; at most GRAPH_NODES a side, the rest counted."""
    left = list(row.get("upstream") or [])
    right = [*(row.get("downstream") or []), *(row.get("children") or [])]
    if not left and not right:
        return ""
    totals = {
        "left": int(row.get("upstream_total") or len(left)),
        "right": int(row.get("downstream_total") or 0) + int(row.get("children_total") or 0),
    }
    totals["right"] = max(totals["right"], len(right))
    width, gap, box = 640, 44, 180
    rows_ = max(min(len(left), GRAPH_NODES), min(len(right), GRAPH_NODES), 1)
    extra = 1 if max(totals["left"], totals["right"]) > GRAPH_NODES else 0
    height = (rows_ + extra) * gap + 10
    centre_y = (height - 34) // 2
    parts = []
    columns = {"left": (left[:GRAPH_NODES], 0), "right": (right[:GRAPH_NODES], width - box)}
    for side, (jobs, x) in columns.items():
        for i, job in enumerate(jobs):
            y = 5 + i * gap
            if side == "left":
                x1, y1, x2, y2 = x + box, y + 17, (width - box) // 2, centre_y + 17
            else:
                x1, y1, x2, y2 = (width + box) // 2, centre_y + 17, x, y + 17
            parts.append(
                f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#999"'
                ' marker-end="url(#arrow)"/>'
            )
            parts.append(_node(job, x, y, box))
        more = totals[side] - len(jobs)
        if more > 0:
            plus = "+" if totals[side] > GRAPH_COUNT_CAP else ""
            parts.append(
                f'<text x="{x + 6}" y="{5 + len(jobs) * gap + 18}" font-size="11" '
                f'fill="#666">… {more:,}{plus} more (listed below)</text>'
            )
    here = {"id": row.get("id"), "topic": row.get("topic"), "state": row.get("state")}
    parts.append(_node(here, (width - box) // 2, centre_y, box, here=True))
    arrow = (
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" '
        'markerHeight="6" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" '
        'fill="#999"/></marker></defs>'
    )
    return (
        "<h2>Graph</h2>"
        f'<svg id="graph" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        f' viewBox="0 0 {width} {height}" role="img" aria-label="the job\'s graph">'
        f"{arrow}{''.join(parts)}</svg>"
        '<p class="muted">left: the jobs it waits or waited for; right: the jobs waiting '
        "for it and the child jobs it spawned. Each links to its page.</p>"
    )


def raw_fields(row: Row) -> str:
    columns = "".join(
        f"<tr><th>{e(name)}</th><td>{_cell(name, value, row)}</td></tr>"
        for name, value in row.items()
        if name not in _NOT_COLUMNS
    )
    return (
        '<details class="raw"><summary>Every field of the row</summary>'
        f"<table><tbody>{columns}</tbody></table></details>"
    )


# The job page's buttons, in this order, each shown when brooq.job's rules allow it from
# the job's state.
ACTIONS: tuple[Transition, ...] = ("hold", "release", "retry", "cancel")


def job_actions(row: Row, csrf: str | None) -> str:
    """The buttons of what may be done to the job now (hold a pending or failed job,
    release a held one, retry a dead or canceled one, cancel an unfinished one), each
    coming back to this page; signed out, a link to the job's forms on /actions. A hold
    the statement would refuse whatever the state (a unique_key, a parked job) is no
    button but a line saying why."""
    job_id, state = row["id"], row.get("state")
    if csrf is None:
        words = "Cancel, retry, hold or release this job"
        return f"<p>{link('/actions', words, job=str(job_id))}</p>"
    here = f"/jobs/{job_id}"
    buttons, why_not = [], ""
    for action in ACTIONS:
        if state not in FROM_STATES[action]:
            continue
        if action == "hold" and row.get("unique_key") is not None:
            why_not = "no hold: a job on hold would give its unique_key up"
            continue
        if action == "hold" and row.get("parked") is not None:
            why_not = "no hold: a durable handler's parked job has started"
            continue
        hint = CANCEL_RUNNING if action == "cancel" and state == "processing" else HINTS[action]
        buttons.append(button(f"/jobs/{job_id}/{action}", action, csrf, here, hint))
    if why_not:
        buttons.append(f'<span class="muted">{e(why_not)}</span>')
    return f'<div class="actions">{"".join(buttons)}</div>' if buttons else ""


def job_page(row: Row, actions_enabled: bool, csrf: str | None = None, note: str = "") -> bytes:
    job_id = row["id"]
    word, why = standing(row)
    color = STATE_COLORS.get(word, "#adb5bd")
    swatch = (
        f'<svg class="dot" width="12" height="12" role="img" aria-label="{e(word)}">'
        f'<circle cx="6" cy="6" r="6" fill="{e(color)}"/></svg>'
    )
    parts = [
        facts(row),
        f'<h2>Where it stands</h2><p id="standing">{swatch} <span class="state">{e(word)}</span>'
        f"{': ' + why if why else ''}</p>",
    ]
    if actions_enabled:
        parts.append(job_actions(row, csrf))
    state = row.get("state")
    if state == "processing":
        parts.append(
            f"{stack_form(job_id, csrf, actions_enabled)}"
            '<p class="muted">The Python stack of the running handler, '
            "as <code>brooq jobs stack ID</code> prints it.</p>"
        )
    if row.get("progress") is not None:
        fraction = float(row["progress"])
        parts.append(
            f'<h2>Progress</h2><p><progress max="1" value="{e(f"{fraction:.3f}")}"></progress> '
            f"{e(progress.text(fraction, row.get('progress_message')))}</p>"
        )
    parts.append(timeline(row))
    if state == "done":
        parts.append("<h2>Result</h2>")
        parts.append(pretty_json(row.get("result")))
    parts.append(graph_svg(row))
    parts.append(graph_tables(row))
    parts.append(durable_tables(row))
    parts.append(kept_logs(row))
    parts.append(
        f'<details class="payload" open><summary>Payload</summary>'
        f"{pretty_json(row.get('payload'))}</details>"
    )
    parts.append(raw_fields(row))
    return layout(
        f"Job {job_id}",
        "".join(parts),
        actions_enabled=actions_enabled,
        signed_in=csrf is not None,
        note=note,
    )
