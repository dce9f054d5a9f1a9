"""The master's statements on the table, each a function of a connection returning counts,
so tests call them without timers (brooq.supervisor.duties runs them on a clock).

Owns lease renewal, the reaper, retention, settling a dead worker's jobs, giving jobs
back and moving up a debounced job left waiting with nothing before it. Each is one
guarded statement (or a bounded series), safe when several masters run against one
database; rows are read by name. They must never wait on a row lock (SKIP LOCKED, or a
guard on the holder; the move up waits at most 100 ms, brooq_job_promote's
lock_timeout) and never decide policy: the caller passes the lease, the limits and the
handlers' policies.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row

from brooq.declare.handlers import Policy
from brooq.rules import backoff, bounded
from brooq.sql import Q, Queries

log = logging.getLogger("brooq.master")

# Retention runs in the master's loop: one pass deletes batches for at most this long,
# then hands the loop back (pickup wake-ups, the watchdog, the ops surface); a pass that
# left work runs again right after (Retention.again_after), so a backlog still drains at
# the database's pace without ever holding the loop for more than about one batch.
RETENTION_PASS_SECONDS = 0.05
HISTORY_ERROR_MAX = 1000  # characters of an error history entry (job_set_failed)


def renew_leases(
    conn: psycopg.Connection[Any],
    held: Sequence[tuple[uuid.UUID, str]],
    lease: float,
    q: Queries = Q,
) -> set[uuid.UUID]:
    """Extend every (job, holder) lease in one statement; the ids still held."""
    if not held:
        return set()
    ids = [job_id for job_id, _ in held]
    workers = [worker for _, worker in held]
    params: dict[str, Any] = {"ids": ids, "workers": workers, "lease": lease}
    rows = conn.cursor(row_factory=dict_row).execute(q.job_renew_leases, params).fetchall()
    return {r["id"] for r in rows}


# A running handler's last claim.progress(): (job id, holder, attempt, fraction, message).
Report = tuple[uuid.UUID, str, int, float, str]


def write_progress(
    conn: psycopg.Connection[Any], reports: Sequence[Report], q: Queries = Q
) -> set[uuid.UUID]:
    """Write the running handlers' last progress reports in one statement
    (job_write_progress): each only while its job is processing under that attempt and
    holder. The ids whose row was locked (not written, still processing): the caller
    writes them again later."""
    if not reports:
        return set()
    params = {
        "ids": [r[0] for r in reports],
        "workers": [r[1] for r in reports],
        "attempts": [r[2] for r in reports],
        "progress": [r[3] for r in reports],
        "messages": [r[4] for r in reports],
    }
    rows = conn.execute(q.job_write_progress, params).fetchall()
    return {row[0] for row in rows if not row[1]}


def reap_expired(
    conn: psycopg.Connection[Any], max_expiries: int, q: Queries = Q
) -> tuple[Counter[str], list[tuple[uuid.UUID, str, int]]]:
    """Return expired leases to pending, attempt refunded: counts by topic of the jobs
    returned, and (id, topic, expiries) of those whose expiries reached ``max_expiries``
    and are dead instead. Each expiry appends an entry to the job's error history (the
    old holder as worker, the refunded attempt's number, which the next claim repeats)."""
    rows = (
        conn.cursor(row_factory=dict_row)
        .execute(q.job_reap_expired, {"max_expiries": max_expiries})
        .fetchall()
    )
    returned = Counter(r["topic"] for r in rows if r["state"] == "pending")
    dead = [(r["id"], r["topic"], r["lease_expiries"]) for r in rows if r["state"] == "dead"]
    return returned, dead


def promote_orphans(conn: psycopg.Connection[Any], q: Queries = Q) -> int:
    """Move up the debounced jobs left waiting with no active job of their unique_key
    before them (job_promote_orphans); how many moved."""
    row = conn.cursor(row_factory=dict_row).execute(q.job_promote_orphans).fetchone()
    return int(row["promoted"]) if row is not None else 0


def delete_expired(
    conn: psycopg.Connection[Any],
    ttl: float,
    batch: int,
    budget: float = RETENTION_PASS_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    q: Queries = Q,
) -> tuple[Counter[str], bool]:
    """Retention: delete terminal rows older than ``ttl`` seconds, ``batch`` at a time,
    batch after batch until one comes back short or ``budget`` seconds have gone (at
    least one batch). Returns counts by topic and whether more may remain. A ttl of 0
    (or less) deletes nothing: it means "retention off", never "everything"."""
    deleted: Counter[str] = Counter()
    if ttl <= 0:
        return deleted, False
    start = clock()
    while True:
        with conn.transaction():
            rows = (
                conn.cursor(row_factory=dict_row)
                .execute(q.job_delete_expired, {"ttl": ttl, "batch": batch})
                .fetchall()
            )
        deleted.update(r["topic"] for r in rows)
        if len(rows) < batch:
            return deleted, False
        if clock() - start >= budget:
            return deleted, True


def settle_dead_worker(
    conn: psycopg.Connection[Any],
    worker: str,
    running: uuid.UUID | None,
    cause: str,
    policies: dict[str, Policy],
    default: Policy,
    suspects: Sequence[uuid.UUID] = (),
    max_expiries: int = 5,
    q: Queries = Q,
    kind: str = "worker_died",
    summary: str = "",
    traceback: str | None = None,
) -> tuple[list[tuple[uuid.UUID, str, str]], list[tuple[uuid.UUID, str]]]:
    """A worker died or was killed. The job it was running (if it still holds it) gets a
    failed attempt with ``cause``; every other job it held (claimed in a batch but not
    started, or finished but not yet written) goes back to pending with the attempt
    refunded — they did not fail. Everything is guarded by the holder, so a job reaped
    and claimed elsewhere meanwhile is untouched. The failed job's error history gets
    an entry naming ``worker`` (the dead child's identity), ``summary`` (or ``cause``) as
    its error, ``kind`` and ``traceback`` (the stack read before a kill, already cut).
    The ``suspects`` go back counting a lease expiry each (job_release_suspects); those
    made dead by it are listed with the failed.
    Returns (id, topic, new state) of the failed job and (id, topic) of the released."""
    failed = []
    cur = conn.cursor(row_factory=dict_row)
    if suspects:
        rows = cur.execute(
            q.job_release_suspects,
            {
                "ids": list(suspects),
                "worker": worker,
                "max_expiries": max_expiries,
                "cause": bounded(cause, HISTORY_ERROR_MAX),
            },
        ).fetchall()
        suspected = [(r["id"], r["topic"]) for r in rows if r["state"] == "pending"]
        failed += [(r["id"], r["topic"], "dead") for r in rows if r["state"] == "dead"]
        return failed, suspected + release_held(conn, [worker], q)
    if running is not None:
        held = cur.execute(q.job_get_held, {"id": running, "worker": worker}).fetchone()
        if held is not None:
            policy = policies.get(held["topic"], default)
            row = cur.execute(
                q.job_set_failed,
                {
                    "id": held["id"],
                    "worker": worker,
                    "refund": False,
                    "max_attempts": policy.max_attempts,
                    "delay": backoff(held["attempts"], policy.backoff_base, policy.backoff_max),
                    "error": bounded(cause),
                    "history_error": bounded(summary or cause, HISTORY_ERROR_MAX),
                    "kind": kind,
                    "traceback": traceback,
                },
            ).fetchone()
            if row is not None:
                failed.append((held["id"], held["topic"], str(row["state"])))
    return failed, release_held(conn, [worker], q)


def release_ids(
    conn: psycopg.Connection[Any], ids: Sequence[uuid.UUID], worker: str, q: Queries = Q
) -> list[uuid.UUID]:
    """Give back, attempt refunded, these jobs if ``worker`` still holds them."""
    if not ids:
        return []
    cur = conn.cursor(row_factory=dict_row)
    rows = cur.execute(q.job_release_ids, {"ids": list(ids), "worker": worker}).fetchall()
    return [r["id"] for r in rows]


def release_held(
    conn: psycopg.Connection[Any], workers: Sequence[str], q: Queries = Q
) -> list[tuple[uuid.UUID, str]]:
    """Give back, attempt refunded, every job these workers hold (drain budget exceeded)."""
    if not workers:
        return []
    cur = conn.cursor(row_factory=dict_row)
    return [(r["id"], r["topic"]) for r in cur.execute(q.job_release, {"workers": list(workers)})]
