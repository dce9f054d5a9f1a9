"""One job's page: every column, the payload, the outcome, the error history, the logs a
``keep_logs`` handler kept, and the jobs of its graph (upstream and downstream).

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
     "traceparent_chars"}
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
    parts = [f"<table><tbody>{columns}</tbody></table>", graph_tables(row)]
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
