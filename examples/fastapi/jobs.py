"""The worker half of the FastAPI example: the Queue and its handler, run by
brooq-master (the web half, app.py, only enqueues).

    DATABASE_URL=postgresql://app@localhost/app brooq-master --app jobs:queue --workers 2
    # from examples/fastapi
"""

from __future__ import annotations

import hashlib

import brooq

queue = brooq.Queue()


@queue.handler("report.render", max_attempts=3)
def render_report(claim: brooq.Claim) -> dict[str, str]:
    """A CPU-bound render; what it returns is the job's result (queue.get(id).result)."""
    data = str(claim.payload["report_id"]).encode()
    for _ in range(10_000):
        data = hashlib.sha256(data).digest()
    return {"report": f"report-{claim.payload['report_id']}", "digest": data.hex()[:12]}
