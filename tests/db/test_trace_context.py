"""The trace context a job stores (job.traceparent): nothing without a tracer provider,
whatever the enqueue path; the producer's traceparent on every insert path when traced
(the _traced statements, driven here without a global provider)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg

import brooq
from brooq import tracing
from brooq.producer.insert import _insert_many, _insert_one
from brooq.producer.insert import drive as _drive
from brooq.sql import Q

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _stored(db: psycopg.Connection[Any]) -> list[str | None]:
    return [r[0] for r in db.execute("SELECT traceparent FROM job_all ORDER BY id")]


def test_without_a_tracer_provider_a_job_stores_nothing(
    queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    assert tracing.tracer() is None  # the API's proxy provider: nothing configured
    queue.enqueue(brooq.Job("t", {}))
    queue.enqueue(brooq.Job("t", {}, tags=["a"]))
    queue.enqueue_many([brooq.Job("t", {}), brooq.Job("t", {}, idempotency_key="k")])
    with psycopg.connect(queue.dsn) as conn:
        brooq.enqueue(conn, brooq.Job("t", {}))
    assert _stored(db) == [None] * 5


def test_a_traced_insert_stores_the_producers_context_on_every_path(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        one = [
            brooq.Job("t", {}),
            brooq.Job("t", {}, idempotency_key="k1"),
            brooq.Job("t", {}, unique_key="u1", tags=["x"]),
        ]
        ids = [_drive(conn, _insert_one(job, {}, Q, PARENT))[0] for job in one]
        again = _drive(conn, _insert_one(brooq.Job("t", {}, idempotency_key="k1"), {}, Q, PARENT))
        assert again == (ids[1], False)  # the key's job: found, not inserted twice
        batches = [
            [brooq.Job("t", {}), brooq.Job("t", {}, available_at=later)],
            [brooq.Job("t", {}, idempotency_key="k2"), brooq.Job("t", {}, idempotency_key="k1")],
        ]
        for batch in batches:
            _drive(conn, _insert_many(batch, {}, Q, PARENT))
    assert _stored(db) == [PARENT] * 6  # k1 twice in all: one row
