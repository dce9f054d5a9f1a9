"""The finished jobs' partitions: made ahead, dropped whole past retention.

Finished jobs live in job_history, range-partitioned on their end (migration 0020,
docs/explanation/history.md). Each retention period the master makes the partitions
that the next HISTORY_AHEAD_SPANS spans (at least a day) need, each starting after now
(never one an insert may be routing a row to as it is attached), so an outcome never
finds its partition missing (if it did, the default partition takes the row). Past
retention_ttl a partition is released (its jobs' idempotency keys a batch per
transaction over as many short passes as they need, then its edges, steps and event
waits: transactions that outcomes do not wait for) and then detached and dropped under
a short lock_timeout: the ACCESS EXCLUSIVE lock on job_history lasts a catalog change, and a
drop that cannot have it soon gives up and is tried again next pass. The default
partition's old rows go a batch at a time.

Owns: ``prepare``, ``drop_expired`` and ``expire_default``, each on the maintenance
connection in its own transactions. Must never: hold a lock on job_history for longer
than DROP_LOCK_TIMEOUT, or drop a partition with a row that ended within retention_ttl.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

from brooq.sql import Q, Queries

log = logging.getLogger("brooq.master")

# Partitions are made for at least this many spans ahead, and at least a day.
HISTORY_AHEAD_SPANS = 3
HISTORY_AHEAD_MIN = 86400.0
# At most this many partitions are made or dropped per pass (a first start on hourly
# partitions makes a day's and more over a few passes).
PARTITIONS_PER_PASS = 24
# How long a drop waits for ACCESS EXCLUSIVE on job_history before it gives up.
DROP_LOCK_TIMEOUT = "200ms"
# A partition's idempotency keys are released this many per transaction (a row of
# brooq_job_key each: docs/explanation/history.md has the cost), for at most
# KEYS_PASS_SECONDS per pass; the retention duty comes back KEYS_PAUSE later while some
# are left, so that a day of keyed jobs goes in short transactions with the server free
# in between.
KEYS_BATCH = 2000
NO_ID = UUID(int=0)  # sorts before every id
KEYS_PASS_SECONDS = 0.05
KEYS_PAUSE = 0.05
# The default partition's old rows: deleted for at most this long per pass.
DEFAULT_PASS_SECONDS = 0.05


@dataclass
class Releasing:
    """Where a partition's key release stands between passes."""

    after: UUID = NO_ID  # the last keyed job whose key was released, in id order
    released: int = 0
    done: bool = False


class Dropped(NamedTuple):
    name: str
    rows: int  # the catalog's estimate of the partition's rows
    kept: int  # rows still read by a job not yet ended, kept in the default partition
    released: int  # idempotency keys released


def ahead(span: float) -> float:
    """How far ahead of now partitions must exist."""
    return max(HISTORY_AHEAD_SPANS * span, HISTORY_AHEAD_MIN)


def prepare(conn: psycopg.Connection[Any], span: float, q: Queries = Q) -> int:
    """Make the partitions the next ``ahead(span)`` seconds need; how many were made."""
    with conn.transaction():
        row = (
            conn.cursor(row_factory=dict_row)
            .execute(
                q.history_prepare,
                {"step": span, "ahead": ahead(span), "max": PARTITIONS_PER_PASS},
            )
            .fetchone()
        )
    made = int(row["made"]) if row else 0
    if made:
        log.info("event=history_partitions_made count=%d span=%gs", made, span)
    return made


def drop_expired(
    conn: psycopg.Connection[Any],
    ttl: float,
    q: Queries = Q,
    releasing: dict[str, Releasing] | None = None,
    budget: float = KEYS_PASS_SECONDS,
    clock: Callable[[], float] = time.monotonic,
) -> list[Dropped]:
    """Release and drop the partitions whose every job ended more than ``ttl`` ago.

    A partition's idempotency keys go first, KEYS_BATCH per transaction, for at most
    ``budget`` seconds per call (at least one batch in all): a partition whose keys are not all
    released yet is left in ``releasing`` (the caller's, kept between calls: where to go
    on) and dropped by a later call. A drop that cannot have its lock within
    DROP_LOCK_TIMEOUT is left to the next pass."""
    if ttl <= 0:
        return []
    if releasing is None:
        releasing = {}
    start = clock()
    cur = conn.cursor(row_factory=dict_row)
    expired = cur.execute(q.history_expired, {"ttl": ttl}).fetchall()[:PARTITIONS_PER_PASS]
    for gone in set(releasing) - {str(part["name"]) for part in expired}:
        del releasing[gone]  # dropped meanwhile (by another master)
    dropped: list[Dropped] = []
    batches = 0  # this call's
    for part in expired:
        name = str(part["name"])
        state = releasing.setdefault(name, Releasing())
        while not state.done:
            if batches and clock() - start >= budget:
                return dropped  # the rest on the next call
            with conn.transaction():
                row = cur.execute(
                    q.history_release_keys,
                    {"name": name, "after": state.after, "batch": KEYS_BATCH},
                ).fetchone()
            assert row is not None
            batches += 1
            state.released += int(row["released"])
            if row["last_id"] is not None:
                state.after = row["last_id"]
            state.done = int(row["seen"]) < KEYS_BATCH
        with conn.transaction():
            cur.execute(q.history_release_links, {"name": name})
        try:
            with conn.transaction():
                cur.execute(q.history_lock_timeout, {"timeout": DROP_LOCK_TIMEOUT})
                kept = cur.execute(q.history_drop, {"name": name}).fetchone()
        except psycopg.errors.LockNotAvailable:
            log.info("event=history_drop_deferred partition=%s reason=lock_timeout", name)
            break
        del releasing[name]
        done = Dropped(name, int(part["rows"]), int(kept["kept"]) if kept else 0, state.released)
        log.info(
            "event=history_partition_dropped partition=%s rows=%d kept=%d keys=%d",
            done.name,
            done.rows,
            done.kept,
            done.released,
        )
        dropped.append(done)
    return dropped


def expire_default(
    conn: psycopg.Connection[Any],
    ttl: float,
    batch: int,
    q: Queries = Q,
    budget: float = DEFAULT_PASS_SECONDS,
    clock: Callable[[], float] = time.monotonic,
) -> Counter[str]:
    """The default partition's rows that ended more than ``ttl`` ago, ``batch`` at a
    time until a batch comes back short or ``budget`` seconds have gone (at least one
    batch): counts by topic. Rows land there for the spans no partition covered (a
    master down past the partitions made ahead)."""
    gone: Counter[str] = Counter()
    if ttl <= 0:
        return gone
    start = clock()
    while True:
        with conn.transaction():
            rows = (
                conn.cursor(row_factory=dict_row)
                .execute(q.history_expire_default, {"ttl": ttl, "batch": batch})
                .fetchall()
            )
        gone.update(str(r["topic"]) for r in rows)
        if len(rows) < batch or clock() - start >= budget:
            return gone
