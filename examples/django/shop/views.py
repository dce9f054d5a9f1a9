"""The order and its confirmation job commit together, in one ``atomic`` block, or not at
all: brooq.enqueue runs its INSERT on Django's own psycopg 3 connection."""

from __future__ import annotations

import json

from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

import brooq
from shop.models import Order


class OutOfStock(Exception):
    pass


@csrf_exempt
@require_POST
def place_order(request: HttpRequest) -> HttpResponse:
    body = json.loads(request.body)
    try:
        with transaction.atomic():
            order = Order.objects.create(sku=body["sku"], quantity=body["quantity"])
            brooq.enqueue(connection, brooq.Job("shop.order_placed", {"order": order.id}))
            if body["sku"] == "sold-out":  # an error after both writes: neither is kept
                raise OutOfStock(body["sku"])
    except OutOfStock:
        return JsonResponse({"error": "out of stock"}, status=409)
    return JsonResponse({"order": order.id}, status=201)
