"""brooq application of the limited workload:
`brooq-master --app bench_brooq_limited_app:queue`.

An application of its own: a master with a `global_limit` topic claims through another
statement than one without (docs/decisions.md), and the other workloads must
measure the plain one.
"""

from __future__ import annotations

import time

import brooq

from benchwork import record_span

LIMIT = 4
JOB_SECONDS = 0.020

queue = brooq.Queue()


@queue.handler("api.limited", global_limit=LIMIT)
def limited(claim: brooq.Claim) -> None:
    started = time.time_ns()
    time.sleep(JOB_SECONDS)
    record_span(claim.payload["k"], started, time.time_ns())
