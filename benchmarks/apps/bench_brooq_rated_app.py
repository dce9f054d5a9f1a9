"""brooq application of the rated workload:
`brooq-master --app bench_brooq_rated_app:queue`.

An application of its own, as the limited workload's: a master with a rate-limited topic
claims it through another statement (brooq_claim_coordinated), and the other workloads
must measure the plain one.
"""

from __future__ import annotations

import time

import brooq

from benchwork import record_span

RATE = 200  # starts per second
JOB_SECONDS = 0.001

queue = brooq.Queue()


@queue.handler("api.rated", rate_limit=f"{RATE}/s")
def rated(claim: brooq.Claim) -> None:
    started = time.time_ns()
    time.sleep(JOB_SECONDS)
    record_span(claim.payload["k"], started, time.time_ns())
