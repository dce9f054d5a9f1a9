"""OpenTelemetry traces (the ``brooq[otel]`` extra), following the messaging semantic
conventions: a producer span per enqueue, a consumer span per attempt.

Owns the one decision every process makes once: is there a tracer to use? Only when
``opentelemetry`` is importable and the application set a real tracer provider (not the
API's default proxy, which drops everything). Made at the first enqueue of a producer, in
a worker child once its application is imported (brooq.worker.spans), and again after a
fork (a child configures its own provider: docs/how-to/tracing.md) or on ``refresh()``.
Without a tracer, an enqueue pays that one check, and a job stores no trace context.

Also owns the producer's span (``publish``: "publish <topic>", kind PRODUCER) and the
W3C ``traceparent`` it hands the insert to store with the job (job.traceparent), the
consumer's parent context read back from it, and the flush of a child's spans before
it exits (``flush``: a child leaves through os._exit, which runs no atexit hook).
Must never import opentelemetry before the decision, nor fail an enqueue or a job
because of tracing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SYSTEM = "brooq"  # messaging.system
_UNDECIDED: Any = object()
_tracer: Any = _UNDECIDED


def tracer() -> Any:
    """The tracer to use, or None (decided once per process; ``refresh`` decides again)."""
    found = _tracer
    if found is _UNDECIDED:
        found = refresh()
    return found


def refresh() -> Any:
    """Decide again whether a tracer provider is configured (after configuring the SDK
    late in a process that has already enqueued, say); the tracer or None."""
    global _tracer
    try:
        from opentelemetry import trace
    except ImportError:
        _tracer = None
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        _tracer = None
    else:
        _tracer = provider.get_tracer("brooq")
    return _tracer


def _forget() -> None:
    global _tracer
    _tracer = _UNDECIDED


os.register_at_fork(after_in_child=_forget)


@contextmanager
def publish(found: Any, topics: list[str], queue: str | None = None) -> Iterator[Any]:
    """A producer span around an insert of jobs of ``topics``: yields (span, traceparent),
    the span current meanwhile; the caller sets the ids it learns."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    names = sorted(set(topics))
    name = f"publish {names[0]}" if len(names) == 1 else "publish"
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
    }
    if len(names) == 1:
        attributes["messaging.destination.name"] = names[0]
    if len(topics) > 1:
        attributes["messaging.batch.message_count"] = len(topics)
    if queue is not None:
        attributes["brooq.queue"] = queue
    with found.start_as_current_span(
        name, kind=trace.SpanKind.PRODUCER, attributes=attributes
    ) as span:
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
        yield span, carrier.get("traceparent")


def published(span: Any, results: list[tuple[Any, bool]]) -> None:
    """What an insert answered, on its producer span: the job id of a single enqueue
    (messaging.message.id), and whether it was created (False: its key was taken)."""
    if len(results) == 1:
        job_id, created = results[0]
        span.set_attribute("messaging.message.id", str(job_id))
        span.set_attribute("brooq.created", bool(created))


def parent(traceparent: str | None) -> Any:
    """The context a consumer span starts in: the producer's, read from the job's
    traceparent (None: a new trace)."""
    if not traceparent:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


def flush(timeout_millis: int = 5000) -> None:
    """Export what this process's provider still holds (a child, before os._exit)."""
    if _tracer is _UNDECIDED or _tracer is None:
        return
    from opentelemetry import trace

    force = getattr(trace.get_tracer_provider(), "force_flush", None)
    if force is not None:
        with contextlib.suppress(Exception):  # the exporter's trouble, never the child's
            force(timeout_millis)
