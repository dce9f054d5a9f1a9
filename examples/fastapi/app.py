"""brooq with FastAPI: an endpoint enqueues through the Queue's async producer API;
``GET /reports/<job>`` reads the job back. The handler, run by brooq-master, is in
jobs.py (the web process imports it too: one Queue, its handlers registered once).

    DATABASE_URL=postgresql://app@localhost/app uvicorn --factory app:create_app
    DATABASE_URL=postgresql://app@localhost/app brooq-master --app jobs:queue
    # both from examples/fastapi

``queue.enqueue_async`` commits the job in a transaction of its own, on the Queue's async
pool (opened on the first call, in the server's event loop); ``queue.close_async`` at
shutdown closes it. A request that fails before the call enqueues nothing; to commit a
job with your own writes, enqueue on your own psycopg AsyncConnection inside its
transaction (``await brooq.enqueue_async(aconn, job)``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

import brooq


def create_app(queue: brooq.Queue | None = None) -> FastAPI:
    """The application, enqueuing on ``queue`` (default: jobs.py's, on DATABASE_URL)."""
    if queue is None:
        from jobs import queue as jobs_queue

        queue = jobs_queue

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await queue.close_async()  # in the loop that opened the pool

    app = FastAPI(lifespan=lifespan)

    @app.post("/reports", status_code=202)
    async def render_report(report: Report) -> dict[str, str]:
        if report.report_id <= 0:  # refused before anything is enqueued
            raise HTTPException(status_code=422, detail="report_id must be positive")
        job_id, _ = await queue.enqueue_async(
            brooq.Job("report.render", {"report_id": report.report_id})
        )
        return {"job": str(job_id)}

    @app.get("/reports/{job_id}")
    async def report_status(job_id: str) -> dict[str, object]:
        try:  # one short read on the Queue's sync pool, off the event loop
            record = await asyncio.to_thread(queue.get, job_id)
        except brooq.InvalidJobId as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from None
        if record is None:
            raise HTTPException(status_code=404, detail="no such job")
        return {"state": record.state, "result": record.result}

    return app


class Report(BaseModel):
    report_id: int
