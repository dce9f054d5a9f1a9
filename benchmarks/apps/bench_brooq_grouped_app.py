"""brooq application of the grouped workload:
`brooq-master --app bench_brooq_grouped_app:queue`.

An application of its own, as the limited workload's: a master with a group-limited
topic claims it through another statement (brooq_claim_coordinated), and the other
workloads must measure the plain one. Each job's key names its group (``g<n>-<i>``).
"""

from __future__ import annotations

import time

import brooq

from benchwork import record_span

GROUP_LIMIT = 1
JOB_SECONDS = 0.020

queue = brooq.Queue()


@queue.handler("tenant.work", group_limit=GROUP_LIMIT)
def work(claim: brooq.Claim) -> None:
    started = time.time_ns()
    time.sleep(JOB_SECONDS)
    record_span(claim.payload["k"], started, time.time_ns())
