"""brooq application of benchmarks/progress_cost.py: no-op handlers that report progress
0, 1 or 10 times per job (BENCH_PROGRESS_ASYNC=1: the same handlers, async)."""

from __future__ import annotations

import os

import brooq

queue = brooq.Queue()

if os.environ.get("BENCH_PROGRESS_ASYNC"):

    @queue.handler("bench.noop")
    async def noop_async(claim: brooq.Claim) -> None:
        return None

    @queue.handler("bench.progress1")
    async def progress1_async(claim: brooq.Claim) -> None:
        claim.progress(0.5, "half way")

    @queue.handler("bench.progress10")
    async def progress10_async(claim: brooq.Claim) -> None:
        for i in range(1, 11):
            claim.progress(i / 10, f"step {i} of 10")

else:

    @queue.handler("bench.noop")
    def noop(claim: brooq.Claim) -> None:
        return None

    @queue.handler("bench.progress1")
    def progress1(claim: brooq.Claim) -> None:
        claim.progress(0.5, "half way")

    @queue.handler("bench.progress10")
    def progress10(claim: brooq.Claim) -> None:
        for i in range(1, 11):
            claim.progress(i / 10, f"step {i} of 10")
