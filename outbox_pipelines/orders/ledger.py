"""The idempotency ledger of the Order API (seed 001): accept an order exactly once per (caller, key).

``accept_order`` runs inside the caller's transaction: the ledger row and the ``outbox_orders`` row commit together.
The ledger row records that message's event id, so the relay's outcome finds it (``record_outcomes``). What the API
answers is the API's business: the ledger says what happened.
"""

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple

import psycopg
from psycopg.rows import dict_row

from outbox_pipelines.core import models as m
from outbox_pipelines.core.enqueue import Outbox
from outbox_pipelines.core.models import Message
from outbox_pipelines.core.storage.queries import shared_query
from outbox_pipelines.orders import ORDERS_TABLE
from outbox_pipelines.orders.model import broker_key, normalize_order, request_digest

LEDGER_TTL_S = 48 * 3600.0


class KeyReused(Exception):
    """An idempotency key whose ledger row expired is used again; the caller must roll back."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


@dataclass(frozen=True)
class Acceptance:
    """What the ledger made of an order: accepted now, a replay of the first request, or a conflict with it."""

    kind: Literal["accepted", "replay", "conflict"]
    key: str
    # accepted: the ack just stored; replay: the stored answer (the ack, the ExecResult or the failure).
    response: dict[str, Any] | None = None


def _get(conn: psycopg.Connection, scope: str, key: str) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(shared_query("idempo_ledger_get"), {"scope": scope, "key": key})
        return cur.fetchone()


def accept_order(
    conn: psycopg.Connection,
    scope: str,
    order: dict[str, Any],
    *,
    trace_id: str | None = None,
    traceparent: str | None = None,
    table_name: str = ORDERS_TABLE,
    ttl_s: float = LEDGER_TTL_S,
    now: datetime | None = None,
) -> Acceptance:
    """Accepted the first time, a replay for an identical repeat, a conflict for a different body.

    Raises KeyReused when the key's order is still in the outbox though its ledger row is gone.
    ``now`` (tests that move database time) stamps the ledger row; None: the database's clock.
    """
    order = normalize_order(order)
    key = order["idempotency_key"]
    digest = request_digest(order)
    event_id = broker_key(scope, key)
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            shared_query("idempo_ledger_reserve"),
            {
                "key": key,
                "scope": scope,
                "request_digest": digest,
                "order_id": order.get("order_id"),
                "event_id": event_id,
                "ttl_s": ttl_s,
                "now": now,
            },
        )
        reserved = cur.fetchone()
    if reserved is None:
        existing = _get(conn, scope, key)
        if existing is None:
            # Another (scope, key) already holds this event id: the broker has seen the key.
            raise KeyReused(key)
        # ON CONFLICT waited for the other transaction, which committed.
        if existing["request_digest"] != digest:
            return Acceptance("conflict", key)
        return Acceptance("replay", key, existing["response"])
    headers: dict[str, Any] = {}
    if trace_id:
        headers["trace_id"] = trace_id
    if traceparent:
        headers["traceparent"] = traceparent
    queued = Outbox(table_name).enqueue(
        conn, Message(topic="order.submitted", payload=order, event_id=event_id, headers=headers)
    )
    if queued.duplicate:
        # The ledger forgot this key (past its 48 h) but the outbox still holds its order: the key was
        # used before. Accepting it again would relay nothing; refuse and roll back the reservation.
        raise KeyReused(key)
    return Acceptance("accepted", key, reserved["response"])


def ledger_entry(conn: psycopg.Connection, scope: str, key: str) -> dict[str, Any] | None:
    return _get(conn, scope, key)


class SettledOrder(NamedTuple):
    """One order's outcome for the ledger, found by the event id of its outbox message."""

    event_id: str
    status: str  # 'succeeded' | 'failed'
    result: dict[str, Any] | None = None  # the ExecResult (succeeded)
    result_digest: str | None = None
    reason: str | None = None  # failed: failures.caller_reason: "<error code>: <outbox code>: HTTP <status>, ..."
    error: str | None = None  # failed: BROKER_REJECTED / BROKER_TIMEOUT / BROKER_DOWN / INTERNAL_ERROR
    http_status: int | None = None  # failed: the HTTP status of the failure (failures.failure_code)
    reason_code: str | None = None  # failed: the outbox's code (BAD_REQUEST, NETWORK_TIMEOUT, BROKER_5XX ...)


def record_outcomes(conn: psycopg.Connection, outcomes: list[SettledOrder], *, now: datetime | None = None) -> None:
    """Record each settled order: succeeded with its ExecResult, or failed with seed 001's code and status.

    A message with no ledger row (an order enqueued without the Order API) changes nothing.
    """
    if not outcomes:
        return
    conn.execute(
        shared_query("idempo_ledger_settle"),
        {
            "event_ids": [o.event_id for o in outcomes],
            "statuses": [o.status for o in outcomes],
            "results": [json.dumps(o.result) if o.result is not None else None for o in outcomes],
            "result_digests": [o.result_digest for o in outcomes],
            "reasons": [m.cap_error(o.reason) for o in outcomes],
            "errors": [o.error if o.status == "failed" else None for o in outcomes],
            "http_statuses": [o.http_status for o in outcomes],
            "reason_codes": [o.reason_code for o in outcomes],
            "now": now,
        },
    )


def delete_expired(conn: psycopg.Connection, limit: int, now: datetime | None = None) -> int:
    """One batch of ledger rows past their expiry, deleted; how many went (the cleaner's work on the ledger,
    run once per cleaner run through the wing: orders/wing.py)."""
    return conn.execute(shared_query("idempo_ledger_clean_expired"), {"limit": limit, "now": now}).rowcount
