"""What the status page reads: one function per page, each running its named statements
(brooq/sql/page.sql, the web_ statements, brooq.operator.masters' fleet_live, the topics' limits,
topic_limits_held, and brooq.operator.snapshots' snapshot_holders) on a given psycopg
connection.

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

import math
import time
import uuid
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
from psycopg.rows import dict_row

from brooq.operator import masters as masters_mod
from brooq.operator import replica, snapshots
from brooq.operator.masters import MasterRow
from brooq.operator.records import TopicLimits
from brooq.operator.replica import ReplicaLag
from brooq.sql import Q, Queries

Row = dict[str, Any]

STATEMENT_TIMEOUT = 2.0  # seconds, for each statement of a page
PAGE_SIZE = 50  # rows of a list page
MAX_GROUPS = 500  # (queue, topic) rows on the overview
MAX_PAUSED = 200
# The overview counts a state's jobs exactly when its sample says there are fewer than
# EXACT_BELOW, reading at most EXACT_CAP of them (more: the estimate stands); a larger
# state is estimated from the sample, about SAMPLE_PAGES pages of the table picked at
# random. Exact counting costs a read per row: a large state counted whole would hit
# the statement timeout.
EXACT_BELOW = 50_000
EXACT_CAP = 100_000
SAMPLE_PAGES = 500
# The same seed each time (REPEATABLE): the sample is the same pages while the table
# keeps its size, so a refresh does not move an estimate by chance alone, and the pages
# it reads stay in the cache (a new seed per render reads cold pages).
SAMPLE_SEED = 1.0
STATES = ("pending", "failed", "processing", "dead", "waiting", "on_hold")
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


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)


def encode_cursor(cursor: Cursor) -> str:
    """`<microseconds since the epoch>_<uuid>`: exact (PostgreSQL keeps microseconds),
    and nothing in it needs quoting in a URL (an ISO time's `+` would)."""
    return f"{(cursor.at - _EPOCH) // _MICROSECOND}_{cursor.id}"


def decode_cursor(text: str) -> Cursor:
    """The cursor encode_cursor wrote; ValueError for anything else."""
    micros, sep, ident = text.partition("_")
    try:
        if not sep or not micros.isdigit() or len(micros) > 18:
            raise ValueError(text)
        return Cursor(_EPOCH + int(micros) * _MICROSECOND, uuid.UUID(ident))
    except OverflowError:
        raise ValueError(text) from None


@contextmanager
def read_only(
    conn: psycopg.Connection[Any], timeout: float = STATEMENT_TIMEOUT, q: Queries = Q
) -> Iterator[psycopg.Cursor[Row]]:
    # A statement_timeout of zero means none at all: at least a millisecond.
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
        blocks = sample_blocks(pages, SAMPLE_PAGES)
        percent = 100.0 * len(blocks) / pages if pages else 100.0
        scale = pages / len(blocks) if blocks else 1.0
        by_state, moments = _sample(cur, blocks, scale, q)
        estimated: dict[str, int] = {}
        margins: dict[str, float] = {}
        exact_queues: set[str] = set()
        if len(blocks) < pages:  # (else every page was read: the sample is exact)
            guess = {s: round(moments[s][0] * scale) for s in STATES}
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
                    total, squares = moments[state]
                    margins[state] = margin(total, squares, len(blocks), pages)
            if "pending" in estimated or "failed" in estimated:
                exact_queues = _small_queues_exactly(cur, by_state, scale, q)
        history = _history_dead(cur, by_state, estimated, margins, q)
        done = cur.execute(q.web_done_per_minute, {"cap": EXACT_CAP}).fetchall()
        done_estimated = False
        done_scale = 1.0
        if sum(int(r["jobs"]) for r in done) > EXACT_CAP:
            # The done jobs of the hour are in job_history's partitions of the hour (and,
            # ended before migration 0020, in job): about SAMPLE_PAGES of their pages.
            step, buckets = WINDOWS["hour"]
            hour = cur.execute(q.web_charts_pages, {"step": step, "buckets": buckets}).fetchone()
            done_pages = int(hour["pages"]) if hour is not None else 0
            done_percent = min(100.0, 100.0 * SAMPLE_PAGES / max(done_pages, 1))
            done_scale = 100.0 / done_percent
            sample = {"percent": done_percent, "seed": SAMPLE_SEED}
            done = [
                {"minute": r["minute"], "jobs": round(int(r["jobs"]) * done_scale)}
                for r in cur.execute(q.web_done_per_minute_sample, sample).fetchall()
            ]
            done_estimated = done_percent < 100.0
        paused = cur.execute(q.web_paused_queues, {"limit": MAX_PAUSED + 1}).fetchall()
        fleet = masters_mod.live(cur.connection, q)
        # What holds the table's cleanup back (its own snapshot, this page's, left out).
        # A standby's sessions are not the primary's: read on a replica, the page names
        # none and says where to look instead.
        recovery = cur.execute(q.web_in_recovery).fetchone()
        on_standby = bool(recovery and recovery["standby"])
        held = [] if on_standby else snapshots.holders(cur.connection, q, limit=1)
        # The topics' limits and what they hold back (the processing rows and the rates'
        # windows only), when a live master publishes any.
        limits = cur.execute(q.topic_limits_held).fetchall() if any(m.limits for m in fleet) else []
        # held (part of ready): every ready job of a topic at its global_limit or
        # rate_limit; a topic whose groups are held, counted exactly when its ready jobs
        # were (they are then fewer than EXACT_BELOW a state: a bounded read).
        held_exact: dict[tuple[str, str], int] = {}
        if any(int(r.get("groups_held") or 0) for r in limits) and not (
            {"pending", "failed"} & estimated.keys()
        ):
            for row in cur.execute(q.job_held_by_topic).fetchall():
                held_exact[(row["queue"], row["topic"])] = int(row["held"])
    keys = sorted(set().union(*by_state.values()))
    groups = [
        _group(key, by_state, estimated, clock["now"], key[0] in exact_queues)
        for key in keys[:MAX_GROUPS]
    ]
    topic_limits = {row["topic"]: TopicLimits.from_row(row) for row in limits}
    for g in groups:
        held_by = topic_limits.get(g["topic"])
        if held_by is not None and held_by.held_by:
            g["held"] = g["ready"]
        elif (g["queue"], g["topic"]) in held_exact:
            g["held"] = min(held_exact[(g["queue"], g["topic"])], g["ready"])
        elif held_by is not None and held_by.groups_held and g["ready"]:
            g["held"] = None  # some of an estimated backlog: not counted
    return {
        "groups": groups,
        "groups_cut": len(keys) > MAX_GROUPS,
        "estimate": (
            {
                "states": estimated,
                "margins": margins,
                "percent": percent,
                "sampled": len(blocks),
                "pages": pages,
                "per_row": scale,
                "history": history,
            }
            if estimated
            else None
        ),
        "paused": paused[:MAX_PAUSED],
        "paused_cut": len(paused) > MAX_PAUSED,
        "done_per_minute": done,
        "done_estimated": done_estimated,
        "done_per_row": done_scale,
        "now": clock["now"],
        "minute": clock["minute"],
        "masters": fleet,
        "oldest_snapshot": held[0] if held else None,
        "snapshots_unseen": on_standby,
        "limits": topic_limits,
    }


def sample_blocks(pages: int, wanted: int) -> list[int]:
    """The blocks of the overview's sample: ``wanted`` of a table's ``pages``, evenly
    spaced (each in the middle of its stretch), or every block of a table that has no
    more. A systematic sample of a known size: TABLESAMPLE SYSTEM reads a number of pages
    that varies by about 1/sqrt(wanted) (4.5 % at 500), and scaling by the nominal share
    carried that error into every estimate.
    The same blocks while the table keeps its size, so a refresh does not move a figure
    by chance and the pages stay cached."""
    if pages <= wanted:
        return list(range(pages))
    return [int((i + 0.5) * pages / wanted) for i in range(wanted)]


def margin(total: float, squares: float, n: int, pages: int) -> float:
    """The 95 % margin of an estimate from ``n`` of ``pages`` pages, in per cent of it:
    1.96 standard errors of the expansion estimator, from the sample's own spread of a
    state's jobs per page (``total``: their sum over the sampled pages, ``squares``: the
    sum of their squares). 0 when every page was read; 100 when the sample holds none."""
    if n >= pages:
        return 0.0
    if total <= 0 or n < 2:
        return 100.0
    spread = max(squares - total * total / n, 0.0) / (n - 1)
    error = pages * math.sqrt((1 - n / pages) * spread / n)
    return min(100.0 * 1.96 * error / (total * pages / n), 100.0)


def _sample(
    cur: psycopg.Cursor[Row], blocks: list[int], scale: float, q: Queries
) -> tuple[dict[str, dict[tuple[str, str], Row]], dict[str, list[float]]]:
    """Read the sampled blocks (one statement each, pipelined: one round trip): the
    figures of each state and group scaled up, and per state the sum of its jobs per
    sampled page and of their squares (for its margin)."""
    sums: dict[str, dict[tuple[str, str], Row]] = {s: {} for s in STATES}
    moments: dict[str, list[float]] = {s: [0.0, 0.0] for s in STATES}
    if not blocks:
        return sums, moments
    params = [{"lo": f"({b},0)", "hi": f"({b + 1},0)"} for b in blocks]
    cur.executemany(q.web_overview_page, params, returning=True)
    while True:
        per_state: dict[str, int] = {}
        for row in cur.fetchall():
            state, jobs = row["state"], int(row["jobs"])
            per_state[state] = per_state.get(state, 0) + jobs
            group = sums[state].setdefault(
                (row["queue"], row["topic"]),
                {"jobs": 0, "ready": 0, "oldest_ready_at": None, "parked": 0},
            )
            group["jobs"] += jobs
            group["ready"] += int(row["ready"])
            group["parked"] += int(row["parked"])
            oldest = row["oldest_ready_at"]
            if oldest is not None and (
                group["oldest_ready_at"] is None or oldest < group["oldest_ready_at"]
            ):
                group["oldest_ready_at"] = oldest
        for state, y in per_state.items():
            moments[state][0] += y
            moments[state][1] += y * y
        if not cur.nextset():
            break
    for groups in sums.values():
        for group in groups.values():
            # parked rounded with ready (pending's are apart from its ready ones), so that
            # jobs - ready - parked rounds to 0 when the sample holds no other job.
            ready = round(group["ready"] * scale)
            group["parked"] = round((group["ready"] + group["parked"]) * scale) - ready
            group["jobs"] = round(group["jobs"] * scale)
            group["ready"] = ready
    return sums, moments


def _small_queues_exactly(
    cur: psycopg.Cursor[Row],
    by_state: dict[str, dict[tuple[str, str], Row]],
    scale: float,
    q: Queries,
) -> set[str]:
    """Beside an estimated pending or failed backlog, the queues it does not hold: a queue
    the sample put under EXACT_BELOW waiting jobs, or missed (7 jobs among 2,000,000 are
    rarely in 500 pages), is counted exactly, its figures replacing the sample's. The
    queues so counted; none when together they hold more than EXACT_CAP."""
    names = [r["queue"] for r in cur.execute(q.web_ready_queue_names, {"limit": MAX_GROUPS + 1})]
    waiting: dict[str, int] = dict.fromkeys(names, 0)
    for state in ("pending", "failed"):
        for (queue, _topic), row in by_state[state].items():
            waiting[queue] = waiting.get(queue, 0) + int(row["jobs"])
    small = [name for name in names if waiting[name] < EXACT_BELOW]
    if not small:
        return set()
    rows = cur.execute(q.web_overview_queues_exact, {"queues": small, "cap": EXACT_CAP}).fetchall()
    if rows and int(rows[0]["state_jobs"]) > EXACT_CAP:
        return set()  # cut short: the sample's figures stand
    for state in ("pending", "failed"):
        by_state[state] = {k: v for k, v in by_state[state].items() if k[0] not in small}
    for row in rows:
        by_state[row["state"]][(row["queue"], row["topic"])] = row
    return set(small)


_EMPTY: Row = {"jobs": 0, "ready": 0, "oldest_ready_at": None, "parked": 0}


def _history_dead(
    cur: psycopg.Cursor[Row],
    by_state: dict[str, dict[tuple[str, str], Row]],
    estimated: dict[str, int],
    margins: dict[str, float],
    q: Queries,
) -> Row | None:
    """Add job_history's dead jobs to ``by_state["dead"]`` (which holds those still in
    job): counted exactly (at most EXACT_CAP read) when the catalog's count of them
    (web_history_dead_guess) is under EXACT_BELOW, or when the history has no more than
    SAMPLE_PAGES pages; else, or when the count is cut short, estimated from a sample of
    about SAMPLE_PAGES of its pages (``estimated["dead"]`` and its margin then cover both
    tables). The history's sample (``sampled``, ``pages``) when it was estimated."""
    table = cur.execute(q.web_history_pages).fetchone()
    pages = int(table["pages"]) if table is not None else 0
    if pages == 0:
        return None
    sample: list[Row] | None = None
    if pages > SAMPLE_PAGES:
        counted = cur.execute(q.web_history_dead_guess).fetchone()
        if counted is not None and int(counted["dead"]) >= EXACT_BELOW:
            sample = _history_sample(cur, pages, q)
    if sample is None:
        params = {"cap": EXACT_CAP, "groups": MAX_GROUPS + 1}
        rows = cur.execute(q.web_history_dead_exact, params).fetchall()
        if not rows or int(rows[0]["state_jobs"]) <= EXACT_CAP:
            for row in rows:
                _add_dead(by_state, (row["queue"], row["topic"]), int(row["jobs"]))
            return None
        sample = _history_sample(cur, pages, q)  # more than EXACT_CAP: the count stands
    summary = next(r for r in sample if r["queue"] is None)
    read = int(summary["jobs"])
    scale = pages / read if read else 0.0
    total, squares = float(summary["dead_sum"]), float(summary["dead_squares"])
    guess = round(total * scale)
    error = margin(total, squares, read, pages) * guess / 100.0
    if "dead" in estimated:  # the rows in job estimated too: their errors add up
        in_job = estimated["dead"]
        error = math.hypot(error, margins["dead"] * in_job / 100.0)
    else:
        in_job = sum(int(r["jobs"]) for r in by_state["dead"].values())
    for row in sample:
        if row["queue"] is not None:
            _add_dead(by_state, (row["queue"], row["topic"]), round(int(row["jobs"]) * scale))
    estimated["dead"] = in_job + guess
    margins["dead"] = min(100.0 * error / (in_job + guess), 100.0) if in_job + guess else 100.0
    return {"sampled": read, "pages": pages}


def _history_sample(cur: psycopg.Cursor[Row], pages: int, q: Queries) -> list[Row]:
    """About SAMPLE_PAGES of job_history's pages (web_history_dead_sample)."""
    params = {"percent": min(100.0, 100.0 * SAMPLE_PAGES / pages), "seed": SAMPLE_SEED}
    return cur.execute(q.web_history_dead_sample, params).fetchall()


def _add_dead(
    by_state: dict[str, dict[tuple[str, str], Row]], key: tuple[str, str], n: int
) -> None:
    row = by_state["dead"].get(key)
    if row is None:
        by_state["dead"][key] = {**_EMPTY, "jobs": n}
    else:
        row["jobs"] = int(row["jobs"]) + n


def _group(
    key: tuple[str, str],
    by_state: dict[str, dict[tuple[str, str], Row]],
    estimated: Collection[str],
    now: datetime,
    exact_queue: bool = False,
) -> Row:
    """One (queue, topic) row of the overview from its states' figures. ready and
    scheduled are pending's and failed's, parked (a durable handler's jobs sleeping or
    waiting for an event or child jobs) pending's and waiting's, counted in neither
    scheduled nor waiting; on_hold (held by an operator until released) its own state's,
    never in ready or scheduled whatever its available_at. An estimated state makes the
    figures it contributes to estimates, and the oldest ready age a lower bound (the
    sample may have missed an older job). ``exact_queue``: its queue's pending and
    failed jobs were counted exactly, whatever the state's estimate elsewhere."""
    pending, failed, processing, dead, waits, on_hold = (
        by_state[s].get(key, _EMPTY) for s in STATES
    )
    waiting = (pending, failed)
    oldest = [r["oldest_ready_at"] for r in waiting if r["oldest_ready_at"] is not None]
    marks = set()
    if ("pending" in estimated or "failed" in estimated) and not exact_queue:
        marks |= {"ready", "held", "oldest_ready"}
    if "pending" in estimated and not exact_queue:
        marks.add("scheduled")
    marks |= {s for s in ("processing", "dead", "waiting", "on_hold") if s in estimated}
    if ("pending" in estimated and not exact_queue) or "waiting" in estimated:
        marks.add("parked")
    if "failed" in estimated and not exact_queue:
        marks |= {"failed", "retrying"}
    return {
        "queue": key[0],
        "topic": key[1],
        # The counts of docs/explanation/guarantees.md: scheduled is pending's due later
        # (not parked), retrying failed's due later; ready both states' due now.
        "ready": sum(int(r["ready"]) for r in waiting),
        "held": 0,  # part of ready: set by overview() from the topics' limits
        "scheduled": max(int(pending["jobs"]) - int(pending["ready"]) - int(pending["parked"]), 0),
        "retrying": max(int(failed["jobs"]) - int(failed["ready"]), 0),
        "processing": int(processing["jobs"]),
        "failed": int(failed["jobs"]),
        "dead": int(dead["jobs"]),
        "waiting": max(int(waits["jobs"]) - int(waits["parked"]), 0),
        "parked": int(pending["parked"]) + int(waits["parked"]),
        "on_hold": int(on_hold["jobs"]),
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
    tag: str | None = None,
    topic: str | None = None,
    group: str | None = None,
) -> Page:
    """Jobs in state processing (carrying ``tag``, of ``topic`` and ``group``, if
    given), longest running first."""
    params = {
        "after_at": after.at if after else "-infinity",
        "after_id": after.id if after else _NIL,
        "limit": size + 1,
        "tag": tag,
        "topic": topic,
        "group": group,
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
    tag: str | None = None,
    topic: str | None = None,
    group: str | None = None,
) -> Page:
    """Failed, dead or held jobs (state: failed, dead or on_hold; carrying ``tag``, of
    ``topic`` and ``group``, if given), newest first (the held ones: most recently held)."""
    if state not in ("failed", "dead", "on_hold"):
        raise ValueError(f"not a list of the status page: {state!r}")
    params = {
        "state": state,
        "after_at": after.at if after else "infinity",
        "after_id": after.id if after else _MAX,
        "limit": size + 1,
        "error_chars": ERROR_CHARS,
        "tag": tag,
        "topic": topic,
        "group": group,
    }
    # The dead ones are mostly in job_history (finished jobs move there).
    statement = q.web_dead if state == "dead" else q.web_finished_badly
    with read_only(conn, timeout, q) as cur:
        return _page(cur.execute(statement, params).fetchall(), size)


# The upstream and downstream jobs a job's page lists (a fan-out may hold many more),
# and how far their count goes (more: "10,000+").
GRAPH_LIMIT = 100
GRAPH_COUNT_CAP = 10_000
# A job page's kept logs: the last LOG_ATTEMPTS attempts (brooq keeps 20), each cut to
# its last LOG_TAIL_CHARS characters (`brooq jobs logs ID` prints them whole). At most
# 20 x 8,192 characters: under 1 MB of page even escaped, whatever the handlers kept
# (up to 1 MiB per attempt).
LOG_ATTEMPTS = 20
LOG_TAIL_CHARS = 8192
# A durable handler's job: its first STEPS_SHOWN recorded steps (names cut to
# NAME_CHARS characters; never a result, only its size) and the event key it waits for
# (cut the same way); `brooq jobs show ID --json` lists every step.
STEPS_SHOWN = 100
NAME_CHARS = 200


def job(
    conn: psycopg.Connection[Any],
    job_id: uuid.UUID,
    timeout: float = STATEMENT_TIMEOUT,
    q: Queries = Q,
) -> Row | None:
    """The job's row, bounded (web_job_get: no logs, a traceparent of its W3C size),
    with the tails of its kept logs (``logs``: oldest first, each with ``text_bytes``,
    ``shown_bytes`` and ``entries``, the attempts kept in all), the jobs it waits or
    waited for (``upstream``, in the order named) and those that wait or waited for it
    (``downstream``), the first GRAPH_LIMIT of each, with ``upstream_total`` and
    ``downstream_total`` counting them all up to GRAPH_COUNT_CAP + 1. A durable
    handler's job adds its recorded steps (``steps``: the first STEPS_SHOWN, oldest
    first, name, when and size; ``steps_total``), the event it waits for (``event_wait``:
    key and since, or None) and the jobs it spawned (``children``, the first GRAPH_LIMIT
    in the order spawned; ``children_total``)."""
    with read_only(conn, timeout, q) as cur:
        row = cur.execute(q.web_job_get, {"id": job_id}).fetchone()
        if row is None:
            return None
        logs = {"id": job_id, "chars": LOG_TAIL_CHARS, "attempts": LOG_ATTEMPTS}
        row["logs"] = cur.execute(q.web_job_logs, logs).fetchall()[::-1]
        graph = {"id": job_id, "limit": GRAPH_LIMIT, "cap": GRAPH_COUNT_CAP}
        for side, statement in (
            ("upstream", q.web_job_upstream),
            ("downstream", q.web_job_downstream),
        ):
            jobs = cur.execute(statement, graph).fetchall()
            row[side] = jobs
            row[f"{side}_total"] = int(jobs[0]["total"]) if jobs else 0
        children = cur.execute(q.web_job_children, graph).fetchall()
        row["children"] = children
        row["children_total"] = int(children[0]["total"]) if children else 0
        steps = {"id": job_id, "limit": STEPS_SHOWN, "cap": GRAPH_COUNT_CAP}
        found = cur.execute(q.web_job_steps, {**steps, "name_chars": NAME_CHARS}).fetchall()
        row["steps"] = found
        row["steps_total"] = int(found[0]["total"]) if found else 0
        wait = {"id": job_id, "key_chars": NAME_CHARS}
        row["event_wait"] = cur.execute(q.web_job_event_wait, wait).fetchone()
        clock = cur.execute(q.web_now).fetchone()
        row["now"] = clock["now"] if clock is not None else None  # the ages shown
        # A ready job: whether its topic's limits hold it back now (held, in the counts'
        # words); topic_limits_held reads the limited topics' processing rows and windows.
        row["limits_held"] = None
        due = row.get("available_at")
        if row.get("state") in ("pending", "failed") and due is not None and row["now"] >= due:
            for limited in cur.execute(q.topic_limits_held).fetchall():
                if limited["topic"] == row.get("topic"):
                    row["limits_held"] = {
                        "held_by": limited["held_by"],
                        "groups_held": int(limited["groups_held"] or 0),
                    }
        return row


def fleet(
    conn: psycopg.Connection[Any], timeout: float = STATEMENT_TIMEOUT, q: Queries = Q
) -> list[MasterRow]:
    """The live masters and their children (brooq.operator.masters)."""
    with read_only(conn, timeout, q) as cur:
        return masters_mod.live(cur.connection, q)


def standing(
    conn: psycopg.Connection[Any], timeout: float = STATEMENT_TIMEOUT, q: Queries = Q
) -> ReplicaLag:
    """Whether the database the pages read is a standby, and how far behind its primary
    (brooq.operator.replica): read before each page when a read target is set."""
    with read_only(conn, timeout, q) as cur:
        return replica.lag(cur.connection, q)


# The charts' windows: (bucket seconds, buckets). The last bucket is the current one.
WINDOWS = {"hour": (60, 60), "day": (900, 96)}
# A chart source (the terminal rows of the window, the failed, the processing, the ready
# ones) is read exactly up to CHART_CAP rows; beyond, every series is drawn from a
# TABLESAMPLE SYSTEM sample of about CHART_SAMPLE_PAGES pages, its counts scaled up.
CHART_CAP = 100_000
CHART_SAMPLE_PAGES = 2_000
CHART_WORK_MEM = "32MB"  # the charts' transaction only (web_charts_memory)


# The charts a page process read last, by window, filter and database, for a caller that
# takes figures up to `max_age` seconds old (the overview: several viewers, or one whose
# page reloads every 10 s, share one read). At most CHART_CACHE_ENTRIES kept.
_CHARTS_READ: dict[tuple[Any, ...], tuple[float, Row]] = {}
CHART_CACHE_ENTRIES = 32


def charts(
    conn: psycopg.Connection[Any],
    window: str = "hour",
    queue: str | None = None,
    topic: str | None = None,
    timeout: float = STATEMENT_TIMEOUT,
    q: Queries = Q,
    max_age: float = 0.0,
) -> Row:
    """The charts' series over the last hour (60 one-minute buckets) or day (96 buckets
    of 15 minutes), of the jobs of ``queue`` and ``topic`` (None: all): ``counts`` per
    series (done, dead, failed attempts, backlog: a list of one figure per bucket, oldest
    first) and ``percentiles`` (run, pickup: per bucket (p50, p95, p99) in seconds, or
    None where no attempt was seen), with ``start`` (the first bucket's start), ``step``
    (seconds), ``now`` and ``sampled`` (the sample's per cent of the table's pages, None
    when every figure is exact). web_charts says what each series counts. ``max_age``:
    the figures this process read for the same window, filter and database at most that
    many seconds ago will do (0: read now)."""
    info = conn.info
    key = (window, queue, topic, id(q), info.host, info.port, info.dbname)
    kept = _CHARTS_READ.get(key)
    if max_age > 0 and kept is not None and time.monotonic() - kept[0] < max_age:
        return kept[1]
    data = _read_charts(conn, window, queue, topic, timeout, q)
    if len(_CHARTS_READ) >= CHART_CACHE_ENTRIES:
        _CHARTS_READ.clear()
    _CHARTS_READ[key] = (time.monotonic(), data)
    return data


def _read_charts(
    conn: psycopg.Connection[Any],
    window: str,
    queue: str | None,
    topic: str | None,
    timeout: float,
    q: Queries,
) -> Row:
    step, buckets = WINDOWS[window]
    params: dict[str, Any] = {
        "step": step,
        "buckets": buckets,
        "queue": queue,
        "topic": topic,
        "cap": CHART_CAP,
    }
    sampled: float | None = None
    with read_only(conn, timeout, q) as cur:
        clock = cur.execute(q.web_now).fetchone()
        assert clock is not None
        cur.execute(q.web_charts_memory, {"work_mem": CHART_WORK_MEM})
        sizes = cur.execute(q.web_charts_sizes, params).fetchone() or {}
        rows = []
        cut = any(int(n) > CHART_CAP for n in sizes.values())
        if not cut:
            rows = cur.execute(q.web_charts, params).fetchall()
            cut = any(r["series"].startswith("rows:") and r["n"] > CHART_CAP for r in rows)
        if cut:
            # job's pages and those of job_history's partitions of the window.
            table = cur.execute(q.web_charts_pages, params).fetchone()
            pages = int(table["pages"]) if table is not None else 0
            sampled = min(100.0, 100.0 * CHART_SAMPLE_PAGES / max(pages, 1))
            sample = {**params, "percent": sampled, "seed": SAMPLE_SEED}
            rows = cur.execute(q.web_charts_sample, sample).fetchall()
    scale = 100.0 / sampled if sampled else 1.0
    counts: dict[str, list[float]] = {s: [0.0] * buckets for s in ("done", "dead", "failed")}
    deltas = [0.0] * buckets
    percentiles: dict[str, list[tuple[float, float, float] | None]] = {
        s: [None] * buckets for s in ("run", "pickup")
    }
    seen: dict[str, list[int]] = {s: [0] * buckets for s in ("run", "pickup")}
    for r in rows:
        series, bucket = r["series"], r["bucket"]
        if bucket is None or not 0 <= bucket < buckets:
            continue
        if series in counts:
            counts[series][bucket] = float(r["n"]) * scale
        elif series == "backlog":
            deltas[bucket] = float(r["n"]) * scale
        elif series in percentiles and r["p"]:
            p50, p95, p99 = (float(x) for x in r["p"])
            percentiles[series][bucket] = (p50, p95, p99)
            seen[series][bucket] = int(r["n"])
    backlog, level = [], 0.0
    for delta in deltas:
        level += delta
        backlog.append(max(level, 0.0))
    counts["backlog"] = backlog
    start = clock["now"].fromtimestamp(
        (int(clock["now"].timestamp()) // step - buckets + 1) * step, clock["now"].tzinfo
    )
    return {
        "window": window,
        "step": step,
        "buckets": buckets,
        "start": start,
        "now": clock["now"],
        "counts": {k: [round(v) for v in vals] for k, vals in counts.items()},
        "percentiles": percentiles,
        "attempts_seen": seen,
        "sampled": sampled,
        "cap": CHART_CAP,
        "queue": queue,
        "topic": topic,
    }
