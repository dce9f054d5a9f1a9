"""brooq with FastAPI: an endpoint enqueues through the Queue's async producer API.

    DATABASE_URL=postgresql://app@localhost/app uvicorn --factory app:create_app
    # from examples/fastapi

``queue.enqueue_async`` commits the job in a transaction of its own, on the Queue's async
pool (opened on the first call, in the server's event loop); ``queue.close_async`` at
shutdown closes it. A request that fails before the call enqueues nothing; to commit a
job with your own writes, enqueue on your own psycopg AsyncConnection inside its
transaction (``await brooq.enqueue_async(aconn, job)``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

import brooq


def create_app(queue: brooq.Queue | None = None) -> FastAPI:
    """The application, enqueuing on ``queue`` (default: a Queue on DATABASE_URL)."""
    queue = queue or brooq.Queue()

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

    return app


class Report(BaseModel):
    report_id: int
