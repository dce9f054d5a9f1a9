from __future__ import annotations

import brooq
from brooq_incapp.app import queue


@queue.handler("shop.refund.issue", queue="billing")
def refund_issue(claim: brooq.Claim) -> str:
    return "refunded"
