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
from collections.abc import Collection, Iterator
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
# The overview counts a state's jobs exactly when its sample says there are fewer than
# EXACT_BELOW, reading at most EXACT_CAP of them (more: the estimate stands); a larger
# state is estimated from the sample, about SAMPLE_PAGES pages of the table picked at
# random. Exact counting costs a read per row (about 0.3 us each on 2 cores): 970,000
# ready jobs took 240 ms, 8,000,000 would hit the statement timeout.
EXACT_BELOW = 50_000
EXACT_CAP = 100_000
SAMPLE_PAGES = 500
# The same seed each time (REPEATABLE): the sample is the same pages while the table
# keeps its size, so a refresh does not move an estimate by chance alone, and the pages
# it reads stay in the cache (a new seed per render read cold pages: 357 ms on 8,000,000).
SAMPLE_SEED = 1.0
STATES = ("pending", "failed", "processing", "dead")
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
    """The overview's figures, per queue and topic: exact for a state the sample puts
    under EXACT_BELOW jobs, estimated from the sample for a larger one (listed in
    ``estimate``, and each estimated figure in its group's ``estimated``). So the page
    reads about SAMPLE_PAGES pages plus at most EXACT_CAP rows per exact state, however
    large the backlog (docs/status-page.md)."""
    with read_only(conn, timeout, q) as cur:
        clock = cur.execute(q.web_now).fetchone()
        assert clock is not None
        table = cur.execute(q.web_table_pages).fetchone()
        pages = int(table["pages"]) if table is not None else 0
        percent = 100.0 if pages <= SAMPLE_PAGES else 100.0 * SAMPLE_PAGES / pages
        sample = {"percent": percent, "seed": SAMPLE_SEED}
        sampled = cur.execute(q.web_overview_sample, {**sample, "groups": MAX_GROUPS + 1})
        scale = 100.0 / percent
        by_state: dict[str, dict[tuple[str, str], Row]] = {s: {} for s in STATES}
        sampled_jobs: dict[str, int] = dict.fromkeys(STATES, 0)
        for row in sampled.fetchall():
            by_state[row["state"]][(row["queue"], row["topic"])] = _scaled(row, scale)
            sampled_jobs[row["state"]] = int(row["state_jobs"])
        estimated: dict[str, int] = {}
        if percent < 100.0:  # at 100 % the sample is the whole table: exact
            guess = {s: round(n * scale) for s, n in sampled_jobs.items()}
            to_count = {s: guess[s] < EXACT_BELOW for s in STATES}
            counted: dict[str, dict[tuple[str, str], Row]] = {s: {} for s in STATES if to_count[s]}
            if counted:
                params = {**to_count, "cap": EXACT_CAP, "groups": MAX_GROUPS + 1}
                for row in cur.execute(q.web_overview_exact, params).fetchall():
                    if int(row["state_jobs"]) > EXACT_CAP:
                        counted.pop(row["state"], None)  # cut short: the estimate stands
                    elif row["state"] in counted:
                        counted[row["state"]][(row["queue"], row["topic"])] = row
            for state in STATES:
                if state in counted:
                    by_state[state] = counted[state]
                else:
                    estimated[state] = guess[state]
        done = cur.execute(q.web_done_per_minute, {"cap": EXACT_CAP}).fetchall()
        done_estimated = False
        if sum(int(r["jobs"]) for r in done) > EXACT_CAP:
            done = [
                {"minute": r["minute"], "jobs": round(int(r["jobs"]) * scale)}
                for r in cur.execute(q.web_done_per_minute_sample, sample).fetchall()
            ]
            done_estimated = percent < 100.0
        paused = cur.execute(q.web_paused_queues, {"limit": MAX_PAUSED + 1}).fetchall()
    keys = sorted(set().union(*by_state.values()))
    groups = [_group(key, by_state, estimated, clock["now"]) for key in keys[:MAX_GROUPS]]
    return {
        "groups": groups,
        "groups_cut": len(keys) > MAX_GROUPS,
        "estimate": (
            {"states": estimated, "percent": percent, "pages": pages, "per_row": scale}
            if estimated
            else None
        ),
        "paused": paused[:MAX_PAUSED],
        "paused_cut": len(paused) > MAX_PAUSED,
        "done_per_minute": done,
        "done_estimated": done_estimated,
        "done_per_row": scale,
        "now": clock["now"],
        "minute": clock["minute"],
    }


def _scaled(row: Row, scale: float) -> Row:
    return {
        "jobs": round(int(row["jobs"]) * scale),
        "ready": round(int(row["ready"]) * scale),
        "oldest_ready_at": row["oldest_ready_at"],
    }


_EMPTY: Row = {"jobs": 0, "ready": 0, "oldest_ready_at": None}


def _group(
    key: tuple[str, str],
    by_state: dict[str, dict[tuple[str, str], Row]],
    estimated: Collection[str],
    now: datetime,
) -> Row:
    """One (queue, topic) row of the overview from its states' figures. ready and
    scheduled are pending's and failed's; an estimated state makes the figures it
    contributes to estimates, and the oldest ready age a lower bound (the sample may have
    missed an older job)."""
    pending, failed, processing, dead = (by_state[s].get(key, _EMPTY) for s in STATES)
    waiting = (pending, failed)
    oldest = [r["oldest_ready_at"] for r in waiting if r["oldest_ready_at"] is not None]
    marks = set()
    if "pending" in estimated or "failed" in estimated:
        marks |= {"ready", "scheduled", "oldest_ready"}
    marks |= {s for s in ("processing", "failed", "dead") if s in estimated}
    return {
        "queue": key[0],
        "topic": key[1],
        "ready": sum(int(r["ready"]) for r in waiting),
        "scheduled": sum(int(r["jobs"]) - int(r["ready"]) for r in waiting),
        "processing": int(processing["jobs"]),
        "failed": int(failed["jobs"]),
        "dead": int(dead["jobs"]),
        "oldest_ready_seconds": (now - min(oldest)).total_seconds() if oldest else None,
        "estimated": marks,
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
