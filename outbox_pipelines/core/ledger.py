"""The idempotency ledger of the Order API (seed 001): accept an order exactly once per (caller, key).

``accept_order`` runs inside the caller's transaction: the ledger row and the
``outbox_orders`` row commit together or not at all.
"""

import json
import re
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import psycopg
from psycopg.rows import dict_row

from outbox_pipelines.core import models as m
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


# Seed 001 §3.1: why an order failed, as the ledger (and GET /do/order/{key}) tells it.
BROKER_REJECTED = "BROKER_REJECTED"  # the broker refused the order (a 4xx): sending it again cannot help
BROKER_TIMEOUT = "BROKER_TIMEOUT"  # the broker did not answer in time, attempt after attempt (504)
BROKER_DOWN = "BROKER_DOWN"  # the broker could not be reached or failed (connection errors, 5xx) (503)
INTERNAL_ERROR = "INTERNAL_ERROR"  # the order failed on this side, not at the broker (500)

_HTTP_STATUS = re.compile(r"\bHTTP (\d{3})\b")


def failure_code(error_code: str | None, error: str | None = None, http_status: int | None = None,
                 failure: str | None = None) -> tuple[str, int]:
    """Seed 001's (error code, HTTP status) of a dead order, from what its last attempt saw.

    ``http_status`` is the broker's answer (None: no answer); ``failure`` says why there was
    none (HttpDestination's Attempt.failure: timeout, connection, protocol, refused). Without
    either (the attempt was made by another process), the outbox code and error text decide.
    """
    if http_status is None and failure is None and error:
        found = _HTTP_STATUS.search(error)
        http_status = int(found.group(1)) if found else None
    if http_status is not None and 400 <= http_status < 500 and http_status not in (408, 429):
        return BROKER_REJECTED, http_status  # 400, 401, 403, 404, 409, 422 ...: the broker said no
    if failure == "refused" or (http_status is None and failure is None and error_code in (m.BAD_REQUEST, m.UNAUTHORIZED)):
        # Never sent: the request could not be built or the HTTP client refused it (seed 001: BROKER_REJECTED 400).
        return BROKER_REJECTED, 401 if error_code == m.UNAUTHORIZED else 400
    if http_status in (408, 504) or failure == "timeout" or (
        http_status is None and failure is None and error_code == m.NETWORK_TIMEOUT and "no answer within" in (error or "")
    ):
        return BROKER_TIMEOUT, http_status or 504
    if http_status is not None and 500 <= http_status < 600:
        return BROKER_DOWN, http_status
    if failure == "connection" or (failure is None and error_code in (m.NETWORK_TIMEOUT, m.BROKER_5XX, m.RATE_LIMITED)):
        return BROKER_DOWN, http_status if http_status == 429 else 503
    if failure in ("protocol", "error") or http_status is not None or error_code == m.UNKNOWN:
        return BROKER_DOWN, 502  # answers that could not be used (garbage, a broken connection mid-answer, 3xx)
    return INTERNAL_ERROR, 500


class SettledOrder(NamedTuple):
    """One order's outcome for the ledger."""

    scope: str
    key: str
    status: str  # 'succeeded' | 'failed'
    result: dict[str, Any] | None = None  # the ExecResult (succeeded)
    result_digest: str | None = None
    reason: str | None = None  # failed: "<error code>: <outbox code>: <error text>"
    error: str | None = None  # failed: BROKER_REJECTED / BROKER_TIMEOUT / BROKER_DOWN / INTERNAL_ERROR
    http_status: int | None = None  # 200, or the HTTP status of the failure
    reason_code: str | None = None  # failed: the outbox's code (BAD_REQUEST, NETWORK_TIMEOUT, BROKER_5XX ...)


def record_outcomes(conn: psycopg.Connection, outcomes: list[SettledOrder] | list[tuple[Any, ...]]) -> None:
    """Record each settled order: succeeded with its ExecResult, or failed with seed 001's code and status."""
    if not outcomes:
        return
    orders = [o if isinstance(o, SettledOrder) else SettledOrder(*o) for o in outcomes]
    conn.execute(shared_query("idempo_ledger_settle"), {
        "scopes": [o.scope for o in orders],
        "keys": [o.key for o in orders],
        "statuses": [o.status for o in orders],
        "results": [json.dumps(o.result) if o.result is not None else None for o in orders],
        "result_digests": [o.result_digest for o in orders],
        "reasons": [m.cap_error(o.reason) for o in orders],
        "errors": [o.error if o.status == "failed" else None for o in orders],
        "http_statuses": [o.http_status for o in orders],
        "reason_codes": [o.reason_code for o in orders],
    })
