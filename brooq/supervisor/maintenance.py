"""The master's periodic work on the database, each a run_once(conn, ...) returning counts,
so tests call them without timers. All of them are single guarded statements, safe when
several masters run against one database."""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

import psycopg

from brooq.handlers import Policy
from brooq.sql import Q
from brooq.worker.execute import bounded
from brooq.worker.retry import backoff

log = logging.getLogger("brooq.master")

RETENTION_MAX_BATCHES = 100


def renew_leases(
    conn: psycopg.Connection[Any], held: Sequence[tuple[uuid.UUID, str]], lease: float
) -> set[uuid.UUID]:
    """Extend every (job, holder) lease in one statement; the ids still held."""
    if not held:
        return set()
    rows = conn.execute(
        Q.job_renew_leases,
        {"ids": [h[0] for h in held], "workers": [h[1] for h in held], "lease": lease},
    ).fetchall()
    return {r[0] for r in rows}


def reap_expired(
    conn: psycopg.Connection[Any], max_expiries: int
) -> tuple[Counter[str], list[tuple[uuid.UUID, str, int]]]:
    """Return expired leases to pending, attempt refunded: counts by topic of the jobs
    returned, and (id, topic, expiries) of those whose expiries reached ``max_expiries``
    and are dead instead."""
    rows = conn.execute(Q.job_reap_expired, {"max_expiries": max_expiries}).fetchall()
    returned = Counter(topic for _, topic, state, _ in rows if state == "pending")
    dead = [(job_id, topic, n) for job_id, topic, state, n in rows if state == "dead"]
    return returned, dead


def delete_expired(
    conn: psycopg.Connection[Any], ttl: float, batch: int
) -> tuple[Counter[str], bool]:
    """Retention: delete terminal rows older than ``ttl`` seconds, ``batch`` at a time, at
    most RETENTION_MAX_BATCHES batches. Returns counts by topic and whether more remain.
    A ttl of 0 (or less) deletes nothing: it means "retention off", never "everything"."""
    deleted: Counter[str] = Counter()
    if ttl <= 0:
        return deleted, False
    for _ in range(RETENTION_MAX_BATCHES):
        with conn.transaction():
            rows = conn.execute(Q.job_delete_expired, {"ttl": ttl, "batch": batch}).fetchall()
        deleted.update(topic for (topic,) in rows)
        if len(rows) < batch:
            return deleted, False
    return deleted, True


def settle_dead_worker(
    conn: psycopg.Connection[Any],
    worker: str,
    running: uuid.UUID | None,
    cause: str,
    policies: dict[str, Policy],
    default: Policy,
) -> tuple[list[tuple[uuid.UUID, str, str]], list[tuple[uuid.UUID, str]]]:
    """A worker died or was killed. The job it was running (if it still holds it) gets a
    failed attempt with ``cause``; every other job it held (claimed in a batch but not
    started, or finished but not yet written) goes back to pending with the attempt
    refunded — they did not fail. Everything is guarded by the holder, so a job reaped
    and claimed elsewhere meanwhile is untouched.
    Returns (id, topic, new state) of the failed job and (id, topic) of the released."""
    failed = []
    if running is not None:
        held = conn.execute(Q.job_get_held, {"id": running, "worker": worker}).fetchone()
        if held is not None:
            job_id, topic, attempts = held
            policy = policies.get(topic, default)
            row = conn.execute(
                Q.job_set_failed,
                {
                    "id": job_id,
                    "worker": worker,
                    "refund": False,
                    "max_attempts": policy.max_attempts,
                    "delay": backoff(attempts, policy.backoff_base, policy.backoff_max),
                    "error": bounded(cause),
                },
            ).fetchone()
            if row is not None:
                failed.append((job_id, topic, str(row[0])))
    return failed, release_held(conn, [worker])


def release_ids(
    conn: psycopg.Connection[Any], ids: Sequence[uuid.UUID], worker: str
) -> list[uuid.UUID]:
    """Give back, attempt refunded, these jobs if ``worker`` still holds them."""
    if not ids:
        return []
    rows = conn.execute(Q.job_release_ids, {"ids": list(ids), "worker": worker}).fetchall()
    return [r[0] for r in rows]


def release_held(
    conn: psycopg.Connection[Any], workers: Sequence[str]
) -> list[tuple[uuid.UUID, str]]:
    """Give back, attempt refunded, every job these workers hold (drain budget exceeded)."""
    if not workers:
        return []
    return [(r[0], r[1]) for r in conn.execute(Q.job_release, {"workers": list(workers)})]
