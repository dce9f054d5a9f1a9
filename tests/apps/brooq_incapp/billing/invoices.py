from __future__ import annotations

import brooq
from brooq_incapp.app import queue


@queue.handler("shop.invoice.send", queue="billing")
def invoice_send(claim: brooq.Claim) -> str:
    return "invoiced"
