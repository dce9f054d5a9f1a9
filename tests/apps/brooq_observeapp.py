"""An application whose handlers report progress and keep their logs, for
tests/process/test_observe.py. A progress handler reports, then waits for the file its
payload names (the test creates it once it has seen the report)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
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


# o.steps and o.steps_async: each step waits for a file of the payload's directory, so
# that a test sees each report arrive (go<attempt>, next, release). With "fail_first", the
# first attempt reports once and fails when "fail" appears. After its last report the
# handler returns at once; a thread it leaves reports once more when "late" appears
# (after the outcome), then writes "late_sent".


def _file(claim: brooq.Claim, name: str) -> bool:
    return os.path.exists(os.path.join(claim.payload["dir"], name))


def _report_late(claim: brooq.Claim) -> None:
    while not _file(claim, "late"):
        time.sleep(0.02)
    claim.progress(0.1, "late")
    with open(os.path.join(claim.payload["dir"], "late_sent"), "w"):
        pass


@queue.handler("o.steps", max_attempts=2, backoff_base=0.01, backoff_max=0.01)
def steps_sync(claim: brooq.Claim) -> None:
    def wait(name: str) -> None:
        while not _file(claim, name):
            time.sleep(0.02)

    if claim.attempt == 1 and claim.payload.get("fail_first"):
        claim.progress(0.4, "first try")
        wait("fail")
        raise RuntimeError("the first try fails")
    wait(f"go{claim.attempt}")
    claim.progress(0.25, "reading")
    wait("next")
    claim.progress(0.6, "second step")
    wait("release")
    claim.progress(1.0, "finished")
    threading.Thread(target=_report_late, args=(claim,), daemon=True).start()


@queue.handler("o.steps_async", max_attempts=2, backoff_base=0.01, backoff_max=0.01)
async def steps_async(claim: brooq.Claim) -> None:
    async def wait(name: str) -> None:
        while not _file(claim, name):
            await asyncio.sleep(0.02)

    if claim.attempt == 1 and claim.payload.get("fail_first"):
        claim.progress(0.4, "first try")
        await wait("fail")
        raise RuntimeError("the first try fails")
    await wait(f"go{claim.attempt}")
    claim.progress(0.25, "reading")
    await wait("next")
    claim.progress(0.6, "second step")
    await wait("release")
    claim.progress(1.0, "finished")
    threading.Thread(target=_report_late, args=(claim,), daemon=True).start()


@queue.handler("o.logs", keep_logs=True, max_attempts=2, backoff_base=0.01, backoff_max=0.01)
def logs_sync(claim: brooq.Claim) -> None:
    log.info("charging card %s, attempt %d", claim.payload["card"], claim.attempt)
    log.warning("the gateway answered 502")
    raise RuntimeError("gateway down")


@queue.handler("o.logs_async", keep_logs=True)
async def logs_async(claim: brooq.Claim) -> None:
    log.info("fetching %s", claim.payload["url"])
    await asyncio.sleep(0)
    log.info("stored %d bytes", 1234)


@queue.handler("o.logs_many", keep_logs=2048)
def logs_many(claim: brooq.Claim) -> None:
    for i in range(200):
        log.info("line %03d of a chatty handler", i)


@queue.handler("o.plain")
def plain(claim: brooq.Claim) -> None:
    log.info("not kept")
