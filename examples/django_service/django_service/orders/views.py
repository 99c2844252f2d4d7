"""POST /orders (a synchronous view) and POST /async/orders (an async view): the order's row and its outbox
message, committed together or not at all."""

import json
from typing import Any

from asgiref.sync import sync_to_async
from django.db import IntegrityError, connection, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from django_service.orders.models import Order
from outbox_pipelines import Message, Outbox

OUTBOX = Outbox("orders_outbox")


def place_order(reference: str, customer: str, amount_cent: int) -> tuple[Order, str]:
    """The business transaction: the order and its message, on Django's own connection."""
    with transaction.atomic():
        order = Order.objects.create(reference=reference, customer=customer, amount_cent=amount_cent)
        event_id = f"order-{order.pk}"
        payload = {"order_id": order.pk, "reference": reference, "customer": customer, "amount_cent": amount_cent}
        # In the same transaction, on Django's connection:
        OUTBOX.enqueue(connection, Message(topic="order.created", payload=payload, event_id=event_id))
    # Leaving the block committed both (the deferred reference check ran at that COMMIT), or neither.
    return order, event_id


def order_fields(request: HttpRequest) -> dict[str, Any] | JsonResponse:
    """The body's fields, or the 400 that says what is wrong with it."""
    try:
        body = json.loads(request.body)
    except ValueError:
        return JsonResponse({"detail": "the body must be JSON"}, status=400)
    ok = (
        isinstance(body, dict)
        and isinstance(body.get("reference"), str)
        and 0 < len(body["reference"]) <= 64
        and isinstance(body.get("customer"), str)
        and 0 < len(body["customer"]) <= 200
        # Any integer: the table's CHECK (amount_cent > 0) is what refuses a non-positive amount.
        and type(body.get("amount_cent")) is int
    )
    if not ok:
        return JsonResponse(
            {"detail": "expected {'reference': str (1-64), 'customer': str (1-200), 'amount_cent': int}"}, status=400
        )
    return {key: body[key] for key in ("reference", "customer", "amount_cent")}


def created(order: Order, event_id: str) -> JsonResponse:
    return JsonResponse({"id": order.pk, "reference": order.reference, "event_id": event_id}, status=201)


def refused(exc: IntegrityError, reference: str) -> JsonResponse:
    """What the database refused, as the client should hear it: the transaction wrote nothing."""
    diag = getattr(exc.__cause__, "diag", None)  # psycopg's error, under Django's
    constraint = getattr(diag, "constraint_name", None)
    if constraint == "orders_reference_unique":
        return JsonResponse(
            {"detail": f"an order with reference {reference!r} exists; nothing was written"}, status=409
        )
    if constraint == "orders_amount_positive":
        return JsonResponse({"detail": "amount_cent must be greater than 0; nothing was written"}, status=422)
    return JsonResponse({"detail": "the database refused the order; nothing was written"}, status=409)


@csrf_exempt
@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    fields = order_fields(request)
    if isinstance(fields, JsonResponse):
        return fields
    try:
        return created(*place_order(**fields))
    except IntegrityError as exc:
        return refused(exc, fields["reference"])


@csrf_exempt
@require_POST
async def create_order_async(request: HttpRequest) -> JsonResponse:
    """The async view: Django's connection is synchronous, so the transaction runs in sync_to_async's thread
    (thread_sensitive, the default: the thread Django's synchronous code uses), never on the event loop."""
    fields = order_fields(request)
    if isinstance(fields, JsonResponse):
        return fields
    try:
        return created(*await sync_to_async(place_order)(**fields))
    except IntegrityError as exc:
        return refused(exc, fields["reference"])
