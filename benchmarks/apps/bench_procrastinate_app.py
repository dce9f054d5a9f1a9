"""procrastinate application of the benchmark:
`procrastinate --app bench_procrastinate_app.app worker ...`.

Tasks that only wait or do nothing are async (procrastinate runs them on the event loop
and `--concurrency` applies to them); CPU-bound and blocking tasks are sync, which
procrastinate runs in a thread, and are run with concurrency 1 as its documentation says.
"""

from __future__ import annotations

import asyncio
import os
import time

import procrastinate

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

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ["BENCH_DSN"]))


@app.task(name="noop", queue="bench")
async def noop(i: int) -> None:
    pass


@app.task(name="cpu", queue="bench")
def cpu(k: str, n: int) -> None:
    t0, c0 = time.time(), time.thread_time()
    spin(n)
    c1, t1 = time.thread_time(), time.time()
    record_cpu(k, t0, t1, c1 - c0)


@app.task(name="pickup", queue="bench")
async def pickup(k: str) -> None:
    record(k, "start", time.time())


@app.task(name="probe", queue="bench")
def probe(k: str) -> None:
    record(k, "start", time.time())


@app.task(name="hung", queue="bench")
def hung(k: str) -> None:
    record(k, "start", time.time())
    hang_forever()


# The I/O-bound workloads: async tasks, run --concurrency at a time per worker.
@app.task(name="io", queue="bench")
async def io(k: str) -> None:
    started = time.time_ns()
    await asyncio.sleep(IO_SECONDS)
    record_span(k, started, time.time_ns())


@app.task(name="io_http", queue="bench")
async def io_http(k: str) -> None:
    started = time.time_ns()
    await http_get_async(http_url())
    record_span(k, started, time.time_ns())
