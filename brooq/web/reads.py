"""What the status page reads: one function per page, each running its named statements
(brooq/sql/queries.sql, the web_ block) on a given psycopg connection.

Each read is one read-only REPEATABLE READ transaction (one snapshot, so a page's
figures agree) under a transaction-local statement_timeout: a slow page fails with
psycopg.errors.QueryCanceled instead of holding the connection, and the connection's own
settings are left as they were. Every list is bounded by a LIMIT; the big ones page by
keyset (updated_at, id).

Owns: the statements' parameters and the shape of what they return (plain dicts).
Must never: write, build SQL text, or leave a transaction open (the connection is
handed back idle, whether it was in autocommit or not).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from brooq.sql import Q, Queries

Row = dict[str, Any]

STATEMENT_TIMEOUT = 2.0  # seconds, for each statement of a page
PAGE_SIZE = 50  # rows of a list page
MAX_GROUPS = 500  # (queue, topic) rows on the overview
MAX_PAUSED = 200
ERROR_CHARS = 300  # of last_error in a list; the job page shows it whole

# The first page's cursors: before (or after) every row, so each list is one statement
# whose keyset condition is always an index condition.
_NIL = uuid.UUID(int=0)
_MAX = uuid.UUID(int=(1 << 128) - 1)


@dataclass(frozen=True)
class Cursor:
    """Where a keyset page starts: after (or, newest first, before) this row."""

    at: datetime
    id: uuid.UUID


@dataclass
class Page:
    rows: list[Row]
    next: Cursor | None  # None: this is the last page


@contextmanager
def read_only(
    conn: psycopg.Connection[Any], timeout: float = STATEMENT_TIMEOUT, q: Queries = Q
) -> Iterator[psycopg.Cursor[Row]]:
    # 0 ms would mean no timeout at all: at least 1 ms.
    # A transaction of its own even on a connection in autocommit; in a non-autocommit
    # connection with nothing open, transaction() begins one and commits it (psycopg).
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q.web_begin_read_only)
        cur.execute(q.web_statement_timeout, {"timeout": f"{max(round(timeout * 1000), 1)}ms"})
        yield cur


def overview(
    conn: psycopg.Connection[Any], timeout: float = STATEMENT_TIMEOUT, q: Queries = Q
) -> Row:
    with read_only(conn, timeout, q) as cur:
        groups = cur.execute(q.web_overview_by_topic, {"limit": MAX_GROUPS + 1}).fetchall()
        paused = cur.execute(q.web_paused_queues, {"limit": MAX_PAUSED + 1}).fetchall()
        done = cur.execute(q.web_done_per_minute).fetchall()
        now = cur.execute(q.web_now).fetchone()
    assert now is not None
    return {
        "groups": groups[:MAX_GROUPS],
        "groups_cut": len(groups) > MAX_GROUPS,
        "paused": paused[:MAX_PAUSED],
        "paused_cut": len(paused) > MAX_PAUSED,
        "done_per_minute": done,
        "now": now["now"],
        "minute": now["minute"],
    }


def _page(rows: list[Row], size: int) -> Page:
    if len(rows) > size:
        last = rows[size - 1]
        return Page(rows[:size], Cursor(last["updated_at"], last["id"]))
    return Page(rows, None)


def in_flight(
    conn: psycopg.Connection[Any],
    after: Cursor | None = None,
    size: int = PAGE_SIZE,
    timeout: float = STATEMENT_TIMEOUT,
    q: Queries = Q,
) -> Page:
    params = {
        "after_at": after.at if after else "-infinity",
        "after_id": after.id if after else _NIL,
        "limit": size + 1,
    }
    with read_only(conn, timeout, q) as cur:
        return _page(cur.execute(q.web_in_flight, params).fetchall(), size)


def finished_badly(
    conn: psycopg.Connection[Any],
    state: str,
    after: Cursor | None = None,
    size: int = PAGE_SIZE,
    timeout: float = STATEMENT_TIMEOUT,
    q: Queries = Q,
) -> Page:
    """Failed or dead jobs (state), newest first."""
    if state not in ("failed", "dead"):
        raise ValueError(f"not a list of the status page: {state!r}")
    params = {
        "state": state,
        "after_at": after.at if after else "infinity",
        "after_id": after.id if after else _MAX,
        "limit": size + 1,
        "error_chars": ERROR_CHARS,
    }
    with read_only(conn, timeout, q) as cur:
        return _page(cur.execute(q.web_finished_badly, params).fetchall(), size)


def job(
    conn: psycopg.Connection[Any],
    job_id: uuid.UUID,
    timeout: float = STATEMENT_TIMEOUT,
    q: Queries = Q,
) -> Row | None:
    with read_only(conn, timeout, q) as cur:
        return cur.execute(q.web_job_get, {"id": job_id}).fetchone()
