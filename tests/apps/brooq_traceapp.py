"""An application that configures the OpenTelemetry SDK: a BatchSpanProcessor (a thread
of its own) exporting to the file BROOQ_TRACE_FILE names, one JSON span per line. At
import, in the master before the fork (the SDK starts its thread again in each child),
or with BROOQ_TRACE_SETUP=child in each child, through @queue.on_child_start. For
tests/process/test_tracing.py."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import brooq


class FileExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as out:
            for span in spans:
                out.write(span.to_json(indent=None) + "\n")
                out.flush()
        return SpanExportResult.SUCCESS


def setup_tracing() -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "traceapp-worker"}))
    exporter = FileExporter(os.environ["BROOQ_TRACE_FILE"])
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=100))
    trace.set_tracer_provider(provider)


queue = brooq.Queue()
tracer = trace.get_tracer("traceapp")  # a proxy until a provider is set: then the SDK's
if os.environ.get("BROOQ_TRACE_SETUP") == "child":
    queue.on_child_start(setup_tracing)
else:
    setup_tracing()


@queue.handler("t.sync")
def sync_job(claim: brooq.Claim) -> None:
    with tracer.start_as_current_span("charge card"):  # nests under the job's span
        pass


@queue.handler("t.async")
async def async_job(claim: brooq.Claim) -> None:
    with tracer.start_as_current_span("fetch page"):
        await asyncio.sleep(0)


@queue.handler("t.fail", max_attempts=1)
def failing_job(claim: brooq.Claim) -> None:
    raise ValueError("card declined")
