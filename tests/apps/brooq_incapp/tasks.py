"""Handlers in a module of their own: a typed payload whose fields JSON has no type for
(datetime, Decimal, UUID), and what the handler received, as type names and text."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import brooq
from brooq_incapp.app import queue


@dataclass
class OrderPaid:
    order: uuid.UUID
    amount: Decimal
    paid_at: datetime


@queue.handler("shop.order.paid", payload=OrderPaid)
def order_paid(claim: brooq.Claim[OrderPaid]) -> dict[str, Any]:
    p = claim.payload
    return {
        "types": [type(p.order).__name__, type(p.amount).__name__, type(p.paid_at).__name__],
        "amount_plus_cent": p.amount + Decimal("0.01"),  # Decimal arithmetic, stored as text
        "utc_offset": str(p.paid_at.utcoffset()),
        "order": p.order,
    }


@queue.handler("shop.email.send")
def email_send(claim: brooq.Claim) -> str:
    return "sent"
