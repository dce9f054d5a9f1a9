"""The demo application of `make run`: handlers that show what brooq does.

Renders are bulk work in the "bulk" queue; the master works `--queues default=3,bulk=1`,
so the default queue leads three claim rounds of four. Flaky calls share a fragile
upstream: `global_limit=1` keeps them to one at a time across every master. A heartbeat
runs every 3 s, once per tick however many masters run (queue.periodic). Quotes have a
typed payload (a dataclass) and return a result the demo waits for (queue.wait); one
middleware wraps every sync job and logs the slow ones, its async twin the async ones.
Fetches are I/O-bound: an `async def` handler, run many at once in the async child
(`--concurrency`), while renders keep the sync children's cores busy and report their
progress. Each round's report waits for its four renders (a workflow's fan-in). A video is
a durable handler: five steps, each recorded with claim.step, so the attempt after a kill
replays the recorded ones and runs only the rest (run_demo.py kills its child to show it)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import random
import time
from dataclasses import dataclass
from typing import Any

import brooq

log = logging.getLogger("demo")
queue = brooq.Queue()


@queue.middleware
def warn_when_slow(claim: brooq.Claim[Any], call_next: brooq.HandlerFn) -> Any:
    """Around every job (the first registered is the outermost)."""
    started = time.monotonic()
    try:
        return call_next(claim)
    finally:
        took = time.monotonic() - started
        if took > 1.0:
            log.warning("slow job %s (%s): %.1fs", claim.id, claim.topic, took)


@queue.middleware
async def warn_when_slow_async(claim: brooq.Claim[Any], call_next: brooq.HandlerFn) -> Any:
    """The same around every async job: a middleware wraps the handlers of its kind."""
    started = time.monotonic()
    try:
        return await call_next(claim)
    finally:
        took = time.monotonic() - started
        if took > 1.0:
            log.warning("slow job %s (%s): %.1fs", claim.id, claim.topic, took)


@queue.handler("demo.fetch", attempt_timeout="5s")
async def fetch(claim: brooq.Claim) -> dict[str, Any]:
    """I/O-bound: waits as an HTTP call would; dozens run at once in one child."""
    await asyncio.sleep(random.uniform(0.1, 0.5))
    return {"url": claim.payload["url"], "status": 200}


@dataclass
class Quote:
    sku: str
    quantity: int
    unit_price: float


@queue.handler("demo.quote", payload=Quote)
def quote(claim: brooq.Claim[Quote]) -> dict[str, Any]:
    """A typed payload in, a result out: stored with `done`, read by queue.wait()."""
    q = claim.payload
    return {"sku": q.sku, "total": round(q.quantity * q.unit_price, 2)}


# Once per 3 s tick across every master: the tick's key is periodic:heartbeat:<tick>.
queue.periodic("heartbeat", every="3s", job=brooq.Job("demo.notify", {"heartbeat": True}))


@queue.handler("demo.render", queue="bulk", max_execution_timeout="30s")
def render(claim: brooq.Claim) -> dict[str, Any]:
    """CPU-heavy: pure-Python hashing, so each child keeps a core busy. Its progress shows
    in `brooq top` and on the status page (written at the master's next lease renewal)."""
    data = str(claim.payload).encode()
    rounds = int(claim.payload.get("rounds", 20_000))
    for i in range(rounds):
        data = hashlib.sha256(data).digest()
        if i % 5_000 == 0:
            claim.progress(i / rounds, "hashing")  # a memory write, no round trip
    digest = data.hex()[:12]
    claim.chain(brooq.Job("demo.notify", {"rendered": claim.payload["n"], "digest": digest}))
    return {"digest": digest}


@queue.handler("demo.report")
def report(claim: brooq.Claim) -> dict[str, Any]:
    """A fan-in: created `waiting` with the round's renders (Job(after=...)), released
    by the last of them to finish; their results come in claim.upstream."""
    return {"round": claim.payload["round"], "digests": [u.result for u in claim.upstream]}


@queue.handler("demo.flaky", max_attempts=5, backoff_base="200ms", backoff_max="2s", global_limit=1)
def flaky(claim: brooq.Claim) -> None:
    """Fails on its first attempts, then succeeds: retries with backoff."""
    if claim.attempt < 3 and random.random() < 0.7:
        raise ConnectionError(f"upstream not ready (attempt {claim.attempt})")


@queue.handler("demo.notify")
def notify(claim: brooq.Claim) -> None:
    """The follow-up chained by demo.render, enqueued only when the render is done."""


# The video's parts and how long each takes (a sleep stands for the real work).
VIDEO_STEPS = (
    ("fetch", 0.4),
    ("frames", 0.4),
    ("encode", 1.2),
    ("thumbnail", 0.3),
    ("publish", 0.3),
)


def video_step(number: int, name: str, seconds: float, attempt: int) -> dict[str, Any]:
    """One part of the video. It runs only when the step has no record yet; what it
    returns is recorded, and an attempt after a kill gets it back instead of running it."""
    time.sleep(seconds)
    print(
        f"[video] step {number} of {len(VIDEO_STEPS)} ({name}) ran in child pid {os.getpid()}",
        flush=True,
    )
    return {"step": name, "attempt": attempt, "pid": os.getpid()}


@queue.handler("demo.video", max_attempts=3, backoff_base="100ms", backoff_max="100ms")
def video(claim: brooq.Claim) -> list[dict[str, Any]]:
    """Durable: every attempt runs this function from its first line, and claim.step
    returns a recorded step's result without calling it again. A kill costs only the step
    that was running."""
    done = []
    for number, (name, seconds) in enumerate(VIDEO_STEPS, 1):
        step = claim.step(name, video_step, number, name, seconds, claim.attempt)
        if step["attempt"] != claim.attempt:  # an earlier attempt ran it
            print(
                f"[video] step {number} of {len(VIDEO_STEPS)} ({name}) replayed from its record "
                f"(attempt {claim.attempt}; it ran in attempt {step['attempt']})",
                flush=True,
            )
        done.append(step)
    return done
