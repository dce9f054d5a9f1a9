"""brooq application of the async variants:
`brooq-master --app bench_brooq_async_app:queue --workers 2 [--concurrency C]`.

An application of its own, every handler `async def`, so every child is an async child
(brooq/worker/aio.py) running up to `--concurrency` jobs at once. The topics are those of
bench_brooq_app, so the jobs enqueued are the same; that application stays sync-only, and
its masters claim as a sync-only master does.

The handlers do what the peers' async handlers do (apps/bench_pgqueuer_app.py,
apps/bench_procrastinate_app.py): `await asyncio.sleep(IO_SECONDS)`, or a GET of the local
HTTP server through benchwork.http_get_async. That client is the peers' too: neither httpx
nor aiohttp is in the benchmark's virtualenv (requirements-peers.txt), and it opens one
connection per request with `Connection: close`, so it holds nothing across jobs (and
nothing is created before the master forks). The pickup handler writes its start as the
sync one does (benchwork.record: one insert with synchronous_commit off, blocking the loop
for that insert, as pgqueuer's async pickup entrypoint does).
"""

from __future__ import annotations

import asyncio
import time

import brooq

from benchwork import IO_SECONDS, http_get_async, http_url, record, record_span

queue = brooq.Queue()


@queue.handler("bench.noop")
async def noop(claim: brooq.Claim) -> None:
    """The no-op drain's job, awaited (benchmarks/ab_drain.py --async)."""


@queue.handler("bench.pickup")
async def pickup(claim: brooq.Claim) -> None:
    record(claim.payload["k"], "start", time.time())


@queue.handler("bench.io")
async def io(claim: brooq.Claim) -> None:
    started = time.time_ns()
    await asyncio.sleep(IO_SECONDS)
    record_span(claim.payload["k"], started, time.time_ns())


@queue.handler("bench.io_http")
async def io_http(claim: brooq.Claim) -> None:
    started = time.time_ns()
    await http_get_async(http_url())
    record_span(claim.payload["k"], started, time.time_ns())
