"""One job's page: every column, the payload, the outcome, the error history, the logs a
``keep_logs`` handler kept, the jobs of its graph (upstream and downstream), and a durable
handler's side: what the job sleeps until or waits for, its recorded steps and the jobs it
spawned.

Owns: what the job page shows and in which order. Must never: write to the database, or
let a value reach a page without brooq.page.render.e().
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from brooq.page.reads import GRAPH_COUNT_CAP, Row
from brooq.page.render import e, holder, job_link, layout, link, pretty_json, table, when
from brooq.page.views import _n, stack_form

# What the page shows in sections of their own, or not as a column.
_NOT_COLUMNS = frozenset(
    {"errors", "logs", "upstream", "downstream", "upstream_total", "downstream_total",
     "traceparent_chars", "steps", "steps_total", "children", "children_total",
     "event_wait"}
)  # fmt: skip


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


def parked_line(row: Row) -> str:
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
    return f"<h2>Parked</h2><p>{text}</p>"


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


def job_page(row: Row, actions_enabled: bool, csrf: str | None = None, note: str = "") -> bytes:
    job_id = row["id"]
    columns = "".join(
        f"<tr><th>{e(name)}</th><td>{_cell(name, value, row)}</td></tr>"
        for name, value in row.items()
        if name not in _NOT_COLUMNS
    )
    parts = [
        f"<table><tbody>{columns}</tbody></table>",
        parked_line(row),
        graph_tables(row),
        durable_tables(row),
    ]
    if actions_enabled:
        parts.append(f"<p>{link('/actions', 'Cancel or retry this job', job=str(job_id))}</p>")
    state = row.get("state")
    if state == "done":
        parts.append("<h2>Outcome</h2><p>done; the handler returned:</p>")
        parts.append(pretty_json(row.get("result")))
    elif state in ("dead", "canceled", "failed"):
        parts.append(f"<h2>Outcome</h2><p>{e(state)}</p>")
    if state == "processing":
        host, pid = holder(row.get("locked_by"))
        parts.append(
            f"<h2>Running</h2><p>on host {e(host)}, child pid {e(pid)}</p>"
            f"{stack_form(job_id, csrf, actions_enabled)}"
            '<p class="muted">The Python stack of the running handler, '
            "as <code>brooq jobs stack ID</code> prints it.</p>"
        )
    errors = row.get("errors") or []
    parts.append(f"<h2>Error history ({_n(len(errors))})</h2>")
    history = []
    for entry in errors if isinstance(errors, list) else []:
        item = entry if isinstance(entry, dict) else {"error": entry}
        history.append(
            (
                e(item.get("attempt", "")),
                e(item.get("at", "")),
                e(item.get("worker", "")),
                f"<pre>{e(item.get('error', ''))}</pre>",
            )
        )
    parts.append(table(("attempt", "at", "worker", "error"), history, numeric={0}))
    parts.append(kept_logs(row))
    return layout(
        f"Job {job_id}",
        "".join(parts),
        actions_enabled=actions_enabled,
        signed_in=csrf is not None,
        note=note,
    )
