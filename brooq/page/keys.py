"""The status page's blocked keys: the ordered keys (Job(ordering_key=...),
brooq.operator.keys) whose next job cannot start, oldest first, each with why (a dead
job blocks it, or its job waits for a retry), that job linked to its page, its queue,
since when, when the retry is due and how many of its jobs wait their turn; signed in,
each key a dead job blocks carries an unblock button (brooq.page.actions answers it,
then comes back here with a note saying what the unblock started).

Owns: the read of the blocked keys under the pages' statement timeout, and their page.
Must never: write to the database, or let a value reach a page without
brooq.page.render.e() (an ordering key is any printable text a producer chose).
"""

from __future__ import annotations

from typing import Any

import psycopg

from brooq.operator import keys
from brooq.operator.keys import BlockedKey
from brooq.page import reads
from brooq.page.render import button, e, job_link, layout, link, table, when
from brooq.sql import Q, Queries

MAX_SHOWN = 500  # rows of the page, oldest first; one more is read to say there are more

# The ?unblocked= of an unblock's way back when no job of the key could start.
NONE_STARTED = "none"

HINT = (
    "the dead job stays dead and stops blocking its key; the key's next waiting job "
    "starts (retrying the dead job instead puts it first again)"
)
NOTE = (
    '<p class="muted">Ordered keys (<code>Job(ordering_key=…)</code>) whose next job cannot '
    "start, oldest first. <strong>retrying</strong>: the key's job failed and runs again at "
    "its retry time; the key goes on by itself after that. <strong>dead</strong>: the "
    "key's job was given up on, and its key waits until the job is retried (its page has "
    "the button) or the key is unblocked here: the dead job stays dead and the key's next "
    "waiting job starts. A handler declared with <code>ordering_skip_dead=True</code> hands "
    "its dead keys on by itself (a master that runs it, within a second). Times are UTC.</p>"
)


def read(
    conn: psycopg.Connection[Any], timeout: float = reads.STATEMENT_TIMEOUT, q: Queries = Q
) -> list[BlockedKey]:
    """The blocked keys, oldest first: at most MAX_SHOWN + 1 (the last one only says
    that there are more)."""
    with reads.read_only(conn, timeout, q) as cur:
        return keys.blocked(cur.connection, limit=MAX_SHOWN + 1, q=q)


def row_buttons(k: BlockedKey, csrf: str | None, actions_enabled: bool) -> str:
    """A dead key signed in: unblock; signed out: how to sign in. A retrying key: none
    (it goes on by itself)."""
    if not actions_enabled or k.reason != keys.DEAD:
        return ""
    if csrf is None:
        return link("/sign-in", "sign in…")
    fields = (("topic", k.topic), ("key", k.ordering_key))
    return button("/keys/unblock", "unblock", csrf, "/keys", HINT, fields)


def unblocked_note(unblocked: str) -> str:
    """The note above the list after an unblock: the job it started (``unblocked``, a
    job id checked by brooq.page.routes), or NONE_STARTED."""
    if unblocked == NONE_STARTED:
        return (
            '<p class="note" id="unblocked">Unblocked: no job of the key started (none '
            "waits its turn, or another job of the key is not finished).</p>"
        )
    return (
        f'<p class="note" id="unblocked">Unblocked: the key\'s next job, '
        f"{job_link(unblocked)}, is ready to start.</p>"
    )


def keys_page(
    blocked: list[BlockedKey],
    actions_enabled: bool,
    csrf: str | None = None,
    note: str = "",
    unblocked: str | None = None,
) -> bytes:
    body = unblocked_note(unblocked) if unblocked is not None else ""
    body += NOTE
    if not blocked:
        body += (
            '<p id="empty">No key is blocked: the next job of every ordered key starts as '
            "soon as the one before it ends.</p>"
        )
    else:
        rows = [
            (
                e(k.topic),
                f"<code>{e(k.ordering_key)}</code>",
                f"<strong>{e(k.reason)}</strong>" if k.reason == keys.DEAD else e(k.reason),
                job_link(k.job_id),
                e(k.queue),
                e(when(k.since)),
                e(when(k.retry_at)),
                f"{k.waiting:,}",
                row_buttons(k, csrf, actions_enabled),
            )
            for k in blocked[:MAX_SHOWN]
        ]
        headers = ["topic", "key", "reason", "job", "queue", "since", "retry at", "waiting",
                   "actions" if actions_enabled else ""]  # fmt: skip
        body += table(headers, rows, numeric={7})
        if len(blocked) > MAX_SHOWN:
            body += (
                f'<p class="muted">only the oldest {MAX_SHOWN} shown; more keys are blocked '
                "(<code>queue.blocked_keys(limit=…)</code> lists up to "
                f"{keys.BLOCKED_LIMIT_MAX:,})</p>"
            )
    return layout(
        "Blocked keys", body, actions_enabled=actions_enabled, signed_in=csrf is not None, note=note
    )
