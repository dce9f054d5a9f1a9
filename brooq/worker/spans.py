"""A consumer span per attempt ("process <topic>", kind CONSUMER), when the child's
application configured an OpenTelemetry tracer provider (brooq.tracing).

Owns reading the claimed jobs' trace context (job.traceparent, one statement per claim
round trip, in a traced child only: `Spans.fetch`), the span of one attempt, parented to
the producer's span and current while the handler runs (`Spans.attempt`: sync and async
alike, the span is attached in the thread or task that calls the handler), and what it
records when the attempt ends (`Spans.end`: the outcome, the exception of a failure).
Must never be built in a child without a tracer (the loops then check one attribute per
job), and never fail an attempt: a trace context that cannot be read starts a new trace.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from brooq import tracing
from brooq.job import Claim, HandlerSignal
from brooq.sql import Queries
from brooq.worker.connection import ChildConnection


class Spans:
    def __init__(self, tracer: Any, q: Queries, db: ChildConnection) -> None:
        self.tracer = tracer
        self.q = q
        self.db = db
        self.parents: dict[uuid.UUID, str] = {}  # claimed, not started: their traceparent

    def fetch(self, claims: Sequence[Claim[Any]]) -> None:
        """The trace context of the claimed jobs that were enqueued under a span."""
        if not claims:
            return
        try:
            conn = self.db.get()
            with self.db.scoped(conn):
                rows = conn.execute(
                    self.q.job_traceparents, {"ids": [c.id for c in claims]}
                ).fetchall()
        except psycopg.Error:
            return  # their spans start new traces; the claim round trip says the rest
        self.parents.update((job_id, traceparent) for job_id, traceparent in rows)

    @contextmanager
    def attempt(self, claim: Claim[Any]) -> Iterator[Any]:
        """The attempt's span, current inside the block; ended by ``end``."""
        from opentelemetry import trace

        span = self.tracer.start_span(
            f"process {claim.topic}",
            context=tracing.parent(self.parents.pop(claim.id, None)),
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": tracing.SYSTEM,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": claim.topic,
                "messaging.message.id": str(claim.id),
                "brooq.queue": claim.queue,
                "brooq.attempt": claim.attempt,
            },
        )
        with trace.use_span(span, record_exception=False, set_status_on_exception=False):
            yield span

    @staticmethod
    def end(span: Any, error: BaseException | None, outcome: str, message: str | None) -> None:
        """The attempt's outcome on its span (done, failed, canceled, abandon), and its
        exception when the handler failed (a handler signal is a choice, not an error)."""
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("brooq.outcome", outcome)
        if error is not None and not isinstance(error, HandlerSignal):
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, message))
        span.end()
