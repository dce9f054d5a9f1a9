"""One job's page: every column, the payload, the outcome, the error history, the logs a
``keep_logs`` handler kept, and the jobs of its graph (upstream and downstream).

Owns: what the job page shows and in which order. Must never: write to the database, or
let a value reach a page without brooq.page.render.e().
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from brooq.page.reads import Row
from brooq.page.render import e, holder, job_link, layout, link, pretty_json, table, when
from brooq.page.views import _n, stack_form


def _cell(name: str, value: Any) -> str:
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


def graph_tables(row: Row) -> str:
    """The jobs this one waits or waited for, and those that wait or waited for it
    (docs/how-to/workflows.md), each with its state; nothing for a job outside a graph."""
    parts = []
    for key, title in (("upstream", "Waits for (upstream)"), ("downstream", "Waited for by")):
        jobs = row.get(key) or []
        if jobs:
            cells = [(job_link(j["id"]), e(j["topic"]), e(j["state"])) for j in jobs]
            parts.append(f"<h2>{e(title)} ({_n(len(jobs))})</h2>")
            parts.append(table(("job", "topic", "state"), cells, numeric=set()))
    return "".join(parts)


def job_page(row: Row, actions_enabled: bool, csrf: str | None = None, note: str = "") -> bytes:
    job_id = row["id"]
    columns = "".join(
        f"<tr><th>{e(name)}</th><td>{_cell(name, value)}</td></tr>"
        for name, value in row.items()
        if name not in ("errors", "logs", "upstream", "downstream")
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
    kept = row.get("logs")  # a keep_logs handler's records, per attempt
    for item in kept if isinstance(kept, list) else []:
        if isinstance(item, dict):
            head = f"Logs of attempt {item.get('attempt', '')}, ended {item.get('at', '')}"
            parts.append(f"<h2>{e(head)}</h2><pre>{e(item.get('text', ''))}</pre>")
    return layout(
        f"Job {job_id}",
        "".join(parts),
        actions_enabled=actions_enabled,
        signed_in=csrf is not None,
        note=note,
    )
