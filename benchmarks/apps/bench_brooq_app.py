"""brooq application of the benchmark: `brooq-master --app bench_brooq_app:queue`."""

from __future__ import annotations

import os
import time

import brooq

from benchwork import (
    IO_SECONDS,
    hang_forever,
    http_get,
    http_url,
    record,
    record_cpu,
    record_span,
    record_start,
    spin,
)

queue = brooq.Queue()

if os.environ.get("BENCH_MIDDLEWARE"):  # the cost of one no-op middleware

    @queue.middleware
    def passthrough(claim: brooq.Claim, call_next: brooq.declare.handlers.HandlerFn) -> object:
        return call_next(claim)


# BENCH_RESULT=1: each no-op returns a small result (the _results claim statements).
_RESULT = {"ok": True} if os.environ.get("BENCH_RESULT") else None


@queue.handler("bench.noop")
def noop(claim: brooq.Claim) -> object:
    return _RESULT


@queue.handler("bench.cpu")
def cpu(claim: brooq.Claim) -> None:
    t0, c0 = time.time(), time.thread_time()
    spin(claim.payload["n"])
    c1, t1 = time.thread_time(), time.time()
    record_cpu(claim.payload["k"], t0, t1, c1 - c0)


@queue.handler("bench.pickup")
def pickup(claim: brooq.Claim) -> None:
    record(claim.payload["k"], "start", time.time())


# The held-snapshot workload (benchmarks/snapshot.py): a no-op that notes its start.
@queue.handler("bench.steady")
def steady(claim: brooq.Claim) -> None:
    started = time.time()
    record_start(str(claim.id), started)


# The hung-handler workload: a 2 s limit, and one attempt, so the job ends dead.
@queue.handler("bench.hung", max_attempts=1, attempt_timeout="2s", max_execution_timeout="2s")
def hung(claim: brooq.Claim) -> None:
    record(claim.payload["k"], "start", time.time())
    hang_forever()


# The priority workload: ~1 ms jobs recording when they start (no queue, no limit: this
# handler changes nothing for the other workloads' claims).
@queue.handler("bench.prio")
def prio(claim: brooq.Claim) -> None:
    started = time.time_ns()
    time.sleep(0.001)
    record_span(claim.payload["k"], started, time.time_ns())


# The I/O-bound workloads: sync handlers, blocking the child for the wait
# (run.py's variants "2", "8", "32"). The async variants ("async", "async200") load
# apps/bench_brooq_async_app.py instead: `async def` handlers of the same two topics, so
# that the jobs enqueued stay the same and this application's claims stay those of a
# sync-only master (see benchmarks/README.md).
@queue.handler("bench.io")
def io(claim: brooq.Claim) -> None:
    started = time.time_ns()
    time.sleep(IO_SECONDS)
    record_span(claim.payload["k"], started, time.time_ns())


@queue.handler("bench.io_http")
def io_http(claim: brooq.Claim) -> None:
    started = time.time_ns()
    http_get(http_url())
    record_span(claim.payload["k"], started, time.time_ns())
