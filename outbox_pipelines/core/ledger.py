"""The idempotency ledger of the Order API (seed 001): accept an order exactly once per (caller, key).

``accept_order`` runs inside the caller's transaction: the ledger row and the
``outbox_orders`` row commit together or not at all.
"""

import json
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg.rows import dict_row

from outbox_pipelines.core.models import Message
from outbox_pipelines.core.orders import normalize_order, request_digest
from outbox_pipelines.core.queries import shared_query
from outbox_pipelines.core.store import Outbox

LEDGER_TTL_S = 48 * 3600.0
ORDERS_TABLE = "outbox_orders"


def broker_key(scope: str, key: str) -> str:
    """The key the broker sees: the client's key, qualified by its caller when tokens scope keys."""
    return f"{scope}:{key}" if scope else key


class KeyReused(Exception):
    """An idempotency key whose ledger row expired is used again; the caller must roll back."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key
        self.body = {"error": "IDEMPOTENCY_CONFLICT", "idempotency_key": key,
                     "message": "this key was used for an earlier order (past the 48 h ledger window); use a new key"}


@dataclass(frozen=True)
class Acceptance:
    kind: Literal["accepted", "replay", "conflict"]
    http_status: int
    body: dict[str, Any]


def _get(conn: psycopg.Connection, scope: str, key: str) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(shared_query("idempo_ledger_get"), {"scope": scope, "key": key})
        return cur.fetchone()


def accept_order(
    conn: psycopg.Connection, scope: str, order: dict[str, Any], *, trace_id: str | None = None,
    table: str = ORDERS_TABLE, ttl_s: float = LEDGER_TTL_S,
) -> Acceptance:
    """201 the first time, 200 with the stored answer for an identical repeat, 409 for a different body."""
    order = normalize_order(order)
    key = order["idempotency_key"]
    digest = request_digest(order)
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(shared_query("idempo_ledger_reserve"),
                    {"key": key, "scope": scope, "request_digest": digest, "order_id": order.get("order_id"), "ttl_s": ttl_s})
        reserved = cur.fetchone()
    if reserved is None:
        existing = _get(conn, scope, key)
        assert existing is not None  # ON CONFLICT waited for the other transaction, which committed
        if existing["request_digest"] != digest:
            return Acceptance("conflict", 409, {"error": "IDEMPOTENCY_CONFLICT", "message": "body differs from the first request with this key",
                                                "idempotency_key": key})
        return Acceptance("replay", 200, existing["response"])
    headers = {"ledger_scope": scope, "ledger_key": key}
    if trace_id:
        headers["trace_id"] = trace_id
    queued = Outbox(table).enqueue(
        conn, Message(topic="order.submitted", payload=order, event_id=broker_key(scope, key), headers=headers)
    )
    if queued.duplicate:
        # The ledger forgot this key (past its 48 h) but the outbox still holds its order: the key was
        # used before. Accepting it again would relay nothing; refuse and roll back the reservation.
        raise KeyReused(key)
    return Acceptance("accepted", 201, reserved["response"])


def ledger_entry(conn: psycopg.Connection, scope: str, key: str) -> dict[str, Any] | None:
    return _get(conn, scope, key)


def record_outcomes(conn: psycopg.Connection, outcomes: list[tuple[str, str, str, dict[str, Any] | None, str | None, str | None]]) -> None:
    """(scope, key, 'succeeded'|'failed', exec_result, result_digest, reason) for each order settled."""
    if not outcomes:
        return
    conn.execute(shared_query("idempo_ledger_settle"), {
        "scopes": [o[0] for o in outcomes],
        "keys": [o[1] for o in outcomes],
        "statuses": [o[2] for o in outcomes],
        "results": [json.dumps(o[3]) if o[3] is not None else None for o in outcomes],
        "result_digests": [o[4] for o in outcomes],
        "reasons": [o[5] for o in outcomes],
    })
