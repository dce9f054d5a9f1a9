"""An application that configures the OpenTelemetry SDK in its module, as an application
would: a BatchSpanProcessor (a thread of its own, which the SDK starts again in each
forked child) exporting to the file BROOQ_TRACE_FILE names, one JSON span per line. For
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


provider = TracerProvider(resource=Resource.create({"service.name": "traceapp-worker"}))
provider.add_span_processor(
    BatchSpanProcessor(FileExporter(os.environ["BROOQ_TRACE_FILE"]), schedule_delay_millis=100)
)
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("traceapp")

queue = brooq.Queue()


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
