"""The brooq app module: brooq-master --app shop.jobs:queue (with DJANGO_SETTINGS_MODULE
set and examples/django on the path). Handlers may use the ORM: django.setup() runs once
per worker process, when the master imports this module."""

from __future__ import annotations

import logging
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
django.setup()

from typing import Any  # noqa: E402

from django.db import close_old_connections  # noqa: E402

import brooq  # noqa: E402
from shop.models import Order  # noqa: E402

log = logging.getLogger("shop.jobs")
queue = brooq.Queue()  # DATABASE_URL, the database Django uses


@queue.middleware
def django_connections(claim: brooq.Claim[Any], call_next: brooq.HandlerFn) -> Any:
    """What Django does around a request: drop a connection that is broken or older than
    CONN_MAX_AGE, so a long-lived worker never runs a job on a dead one."""
    close_old_connections()
    try:
        return call_next(claim)
    finally:
        close_old_connections()


@queue.handler("shop.order_placed", max_attempts=5)
def order_placed(claim: brooq.Claim[dict[str, int]]) -> dict[str, int]:
    order = Order.objects.get(id=claim.payload["order"])
    log.info("confirming order %s (%s x %s)", order.id, order.quantity, order.sku)
    return {"order": order.id, "quantity": order.quantity}
