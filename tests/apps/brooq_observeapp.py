"""An application whose handlers report progress and keep their logs, for
tests/process/test_observe.py. A progress handler reports, then waits for the file its
payload names (the test creates it once it has seen the report)."""

from __future__ import annotations

import asyncio
import logging
import os
import time

import brooq

queue = brooq.Queue()
log = logging.getLogger("observeapp")


def _released(claim: brooq.Claim) -> bool:
    return os.path.exists(claim.payload["release"])


@queue.handler("o.progress")
def progress_sync(claim: brooq.Claim) -> None:
    claim.progress(0.25, "reading")
    claim.progress(0.4, "resizing 3 of 8")
    while not _released(claim):
        time.sleep(0.02)
    claim.progress(1.0, "done")


@queue.handler("o.progress_async")
async def progress_async(claim: brooq.Claim) -> None:
    claim.progress(0.75, "uploading")
    while not _released(claim):
        await asyncio.sleep(0.02)
