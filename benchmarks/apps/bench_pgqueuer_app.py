"""pgqueuer application of the benchmark: `pgq run bench_pgqueuer_app:main ...`.

One asyncpg connection per QueueManager, as pgqueuer's performance guide advises.
Entrypoints are async; blocking work goes through asyncio.to_thread, as pgqueuer
requires for blocking code.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.models import Job

from benchwork import (
    IO_SECONDS,
    hang_forever,
    http_get_async,
    http_url,
    record,
    record_cpu,
    record_span,
    spin,
)


def _payload(job: Job) -> dict:
    return json.loads(job.payload or b"{}")


def _cpu(k: str, n: int) -> None:
    t0, c0 = time.time(), time.thread_time()
    spin(n)
    c1, t1 = time.thread_time(), time.time()
    record_cpu(k, t0, t1, c1 - c0)


def _hung(k: str) -> None:
    record(k, "start", time.time())
    hang_forever()


@asynccontextmanager
async def main() -> AsyncIterator[PgQueuer]:
    connection = await asyncpg.connect(os.environ["BENCH_DSN"])
    pgq = PgQueuer.from_asyncpg_connection(connection)

    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        pass

    @pgq.entrypoint("cpu")
    async def cpu(job: Job) -> None:
        p = _payload(job)
        await asyncio.to_thread(_cpu, p["k"], p["n"])

    @pgq.entrypoint("pickup")
    async def pickup(job: Job) -> None:
        record(_payload(job)["k"], "start", time.time())

    @pgq.entrypoint("probe")
    async def probe(job: Job) -> None:
        record(_payload(job)["k"], "start", time.time())

    @pgq.entrypoint("hung")
    async def hung(job: Job) -> None:
        await asyncio.to_thread(_hung, _payload(job)["k"])

    # The I/O-bound workloads: async entrypoints, waiting on the event loop.
    @pgq.entrypoint("io")
    async def io(job: Job) -> None:
        started = time.time_ns()
        await asyncio.sleep(IO_SECONDS)
        record_span(_payload(job)["k"], started, time.time_ns())

    @pgq.entrypoint("io_http")
    async def io_http(job: Job) -> None:
        started = time.time_ns()
        await http_get_async(http_url())
        record_span(_payload(job)["k"], started, time.time_ns())

    try:
        yield pgq
    finally:
        await connection.close()
