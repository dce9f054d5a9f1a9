"""OpenTelemetry traces through a real brooq-master: a producer that configured the SDK
enqueues under a span of its own; the application configures the SDK in its module; each
attempt's consumer span is in the producer's trace, a child of its publish span, with the
messaging attributes, and the spans the handler makes nest under it (sync and async)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.harness import StartMaster, wait_for

APP = "brooq_traceapp:queue"

# The producer: its own process (a tracer provider is set once per process), the SDK
# with an in-memory exporter, three jobs enqueued under a span of the caller's.
PRODUCER = """
import json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import brooq

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
queue = brooq.Queue(sys.argv[1])
with trace.get_tracer("shop").start_as_current_span("checkout"):
    ids = [str(queue.enqueue(brooq.Job(t, {}))[0]) for t in ("t.sync", "t.async", "t.fail")]
    queue.enqueue_many([brooq.Job("t.sync", {}), brooq.Job("t.sync", {})])
queue.close()
spans = [json.loads(s.to_json()) for s in exporter.get_finished_spans()]
print(json.dumps({"ids": ids, "spans": spans}))
"""


def _spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("setup", ["import", "child"])
def test_a_jobs_consumer_span_is_in_the_trace_that_enqueued_it(
    start_master: StartMaster, dsn: str, db: psycopg.Connection[Any], tmp_path: Path, setup: str
) -> None:
    """``import``: the SDK configured in the app module, in the master before the fork;
    ``child``: in each child, by an @queue.on_child_start hook."""
    out = subprocess.run(
        [sys.executable, "-c", PRODUCER, dsn], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    produced = json.loads(out.stdout)
    ids = dict(zip(("t.sync", "t.async", "t.fail"), produced["ids"], strict=True))
    by_name = {}
    for span in produced["spans"]:
        by_name.setdefault(span["name"], []).append(span)
    (checkout,) = by_name["checkout"]
    publishes = {s["attributes"].get("messaging.message.id"): s for s in by_name["publish t.sync"]}
    publishes.update({ids["t.async"]: by_name["publish t.async"][0]})
    publishes.update({ids["t.fail"]: by_name["publish t.fail"][0]})
    for topic, job_id in ids.items():
        publish = publishes[job_id]
        assert publish["kind"] == "SpanKind.PRODUCER"
        assert publish["parent_id"] == checkout["context"]["span_id"]
        assert publish["attributes"] == {
            "messaging.system": "brooq",
            "messaging.operation.type": "send",
            "messaging.operation.name": "publish",
            "messaging.destination.name": topic,
            "brooq.queue": "default",
            "messaging.message.id": job_id,
            "brooq.created": True,
        }
    (batch,) = [s for s in by_name["publish t.sync"] if len(s["attributes"]) == 5]
    assert batch["attributes"]["messaging.batch.message_count"] == 2
    # The trace context is stored with the job: W3C traceparent of the publish span.
    stored = dict(db.execute("SELECT id::text, traceparent FROM job_all").fetchall())
    for job_id in ids.values():
        context = publishes[job_id]["context"]
        version, trace_id, span_id, flags = stored[job_id].split("-")
        assert (version, trace_id, span_id) == (
            "00",
            context["trace_id"][2:],
            context["span_id"][2:],
        )
        assert int(flags, 16) & 1  # sampled

    trace_file = tmp_path / "spans.jsonl"
    env = {"BROOQ_TRACE_FILE": str(trace_file), "BROOQ_TRACE_SETUP": setup}
    m = start_master(workers=2, app=APP, env=env)
    done = "SELECT count(*) FROM job_all WHERE state IN ('done', 'dead')"
    wait_for(lambda: db.execute(done).fetchone() == (5,), what="every job ended")

    def consumer_spans() -> dict[str, dict[str, Any]]:
        found = {}
        for span in _spans(trace_file):
            if span["kind"] == "SpanKind.CONSUMER":
                found[span["attributes"]["messaging.message.id"]] = span
        return found

    consumers = wait_for(
        lambda: (c := consumer_spans()) and set(ids.values()) <= set(c) and c,
        what="the consumer spans exported",
    )
    for topic, job_id in ids.items():
        span = consumers[job_id]
        publish = publishes[job_id]
        assert span["name"] == f"process {topic}"
        assert span["context"]["trace_id"] == checkout["context"]["trace_id"]
        assert span["parent_id"] == publish["context"]["span_id"]
        assert span["attributes"] == {
            "messaging.system": "brooq",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": topic,
            "messaging.message.id": job_id,
            "brooq.queue": "default",
            "brooq.attempt": 1,
            "brooq.outcome": "failed" if topic == "t.fail" else "done",
        }
        assert span["resource"]["attributes"]["service.name"] == "traceapp-worker"
    failed = consumers[ids["t.fail"]]
    assert failed["status"]["status_code"] == "ERROR"
    assert failed["status"]["description"] == "ValueError: card declined"
    (event,) = failed["events"]
    assert event["name"] == "exception"
    assert event["attributes"]["exception.type"] == "ValueError"
    assert event["attributes"]["exception.message"] == "card declined"
    assert consumers[ids["t.sync"]]["status"]["status_code"] == "UNSET"
    # Calls made inside the handler nest under the job's span, sync and async.
    inner = [s for s in _spans(trace_file) if s["kind"] == "SpanKind.INTERNAL"]
    for name, topic in (("charge card", "t.sync"), ("fetch page", "t.async")):
        job_span = consumers[ids[topic]]["context"]["span_id"]
        (nested,) = [s for s in inner if s["name"] == name and s["parent_id"] == job_span]
        assert nested["context"]["trace_id"] == checkout["context"]["trace_id"]
    # The batch's jobs: each its own consumer span, children of the batch's publish span.
    batch_ids = {r[0] for r in db.execute("SELECT id::text FROM job_all")} - set(ids.values())
    for job_id in batch_ids:
        wait_for(lambda j=job_id: j in consumer_spans(), what="the batch's spans")
        assert consumer_spans()[job_id]["parent_id"] == batch["context"]["span_id"]
    m.stop()
    log = m.log()
    assert "event=child_crashed" not in log and "Exception while exporting" not in log, log
