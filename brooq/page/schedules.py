"""The status page's schedules: the periodic schedules stored in the database
(brooq_schedule, brooq.operator.schedules), each with when it runs, the job of its ticks,
its next tick or that it is paused, its last tick and that tick's job; signed in, each
row's buttons pause or resume it, run its job now, or remove it (brooq.page.actions
answers them).

Owns: the read of the stored schedules under the pages' statement timeout, and their
page. Must never: write to the database, or let a value reach a page without
brooq.page.render.e() (a schedule's name and payload may be written by hand in SQL).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import psycopg

from brooq.declare.periodic import next_tick
from brooq.operator import schedules
from brooq.operator.schedules import StoredSchedule
from brooq.page import reads
from brooq.page.render import button, e, job_link, layout, link, table, when
from brooq.sql import Q, Queries

MAX_SHOWN = 500  # rows of the page; the rest are counted, not shown
PAYLOAD_CHARS = 200  # of a payload in a row, as compact JSON

# The one-click buttons' hints, by action.
HINTS = {
    "pause": "no tick is enqueued until resumed (every master within a second)",
    "resume": "its ticks come again from the next one (missed ones as its backfill says)",
    "run": "enqueue its job now, outside its ticks",
    "remove": "delete the schedule; the jobs it enqueued stay",
}
NOTE = (
    '<p class="muted">Schedules stored in the database (<code>brooq periodic</code>, '
    "<code>queue.add_schedule</code>), which every master reads each second beside the "
    "schedules its application declares in code (those are not listed here; a name the "
    "application declares too runs the application's). Times are UTC. A pause, a resume "
    "or a removal holds on every master within a second; run now enqueues the schedule's "
    "job at once (a schedule naming no queue: the default queue, as "
    "<code>brooq periodic run</code> without an application) and shows it.</p>"
)


def read(
    conn: psycopg.Connection[Any], timeout: float = reads.STATEMENT_TIMEOUT, q: Queries = Q
) -> list[StoredSchedule]:
    """The stored schedules, by name, with their last claimed tick."""
    with reads.read_only(conn, timeout, q) as cur:
        return schedules.listed(cur.connection, q=q)


def _when(s: StoredSchedule) -> str:
    return s.cron if s.cron is not None else f"every {s.every}s"


def _next(s: StoredSchedule, now: datetime) -> str:
    if s.paused:
        return "<strong>paused</strong>"
    try:
        return e(when(next_tick(s.schedule(), now)))
    except Exception as exc:  # a row written by hand that the masters refuse
        return f'<span class="muted">never: {e(" ".join(str(exc).split()))}</span>'


def _payload(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    if len(text) > PAYLOAD_CHARS:
        text = text[:PAYLOAD_CHARS] + "…"
    return f"<code>{e(text)}</code>"


def row_buttons(s: StoredSchedule, csrf: str | None, actions_enabled: bool) -> str:
    """Signed in: pause (or resume), run now, remove; signed out: how to sign in."""
    if not actions_enabled:
        return ""
    if csrf is None:
        return link("/sign-in", "sign in…")
    path = f"/schedules/{s.name}"
    toggle = "resume" if s.paused else "pause"
    return (
        button(f"{path}/{toggle}", toggle, csrf, "/schedules", HINTS[toggle])
        + button(f"{path}/run", "run now", csrf, "/schedules", HINTS["run"])
        + button(f"{path}/remove", "remove", csrf, "/schedules", HINTS["remove"])
    )


def schedules_page(
    stored: list[StoredSchedule],
    actions_enabled: bool,
    csrf: str | None = None,
    note: str = "",
) -> bytes:
    now = datetime.now(timezone.utc)
    rows = [
        (
            e(s.name),
            f"<code>{e(_when(s))}</code>",
            e(s.tz),
            e(s.topic),
            _payload(s.payload),
            e(s.queue or "—"),
            _next(s, now),
            e(when(s.last_tick)),
            job_link(s.last_job) if s.last_job is not None else "—",
            row_buttons(s, csrf, actions_enabled),
        )
        for s in stored[:MAX_SHOWN]
    ]
    headers = ["name", "schedule", "tz", "topic", "payload", "queue", "next tick", "last tick",
               "last job", "actions" if actions_enabled else ""]  # fmt: skip
    body = NOTE + table(headers, rows, numeric=set())
    if len(stored) > MAX_SHOWN:
        body += f'<p class="muted">only the first {MAX_SHOWN} of {len(stored):,} shown</p>'
    return layout(
        "Schedules", body, actions_enabled=actions_enabled, signed_in=csrf is not None, note=note
    )
