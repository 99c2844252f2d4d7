"""The stored order and what the broker sees of it: digests, request, ExecResult."""

from decimal import Decimal
from typing import Any

from outbox_pipelines.core.canonical import canonical_json, digest

UNITS_PER_LOT = 100_000
BROKER_TIMEOUT_S = {"IOC": 2.5, "FOK": 5.0, "GTC": 5.0}
EXEC_RESULT_FIELDS = ("broker_order_id", "accepted_at", "status", "fills", "idempotency_key")


def broker_key(scope: str, key: str) -> str:
    """The key the broker sees (the order's event id): the client's key, qualified by its caller when tokens
    scope keys."""
    return f"{scope}:{key}" if scope else key


def normalize_order(body: dict[str, Any]) -> dict[str, Any]:
    """The stored form: defaults filled in (time_in_force IOC, price null, tags [])."""
    order = dict(body)
    order.setdefault("time_in_force", "IOC")
    order.setdefault("price", None)
    order.setdefault("tags", [])
    return order


def request_digest(order: dict[str, Any]) -> str:
    return digest(canonical_json(normalize_order(order)))


def broker_request(order: dict[str, Any], broker_key: str, trace_id: str | None) -> dict[str, Any]:
    """OrderRequest → the broker's request."""
    units = int(Decimal(str(order["qty"])) * UNITS_PER_LOT)
    return {
        "idempotency_key": broker_key,
        "symbol": order["instrument"],
        "intent": order["side"],
        "qty": units,
        "limit_price": order.get("price"),
        "trace_id": trace_id or f"do-outbox-{broker_key}",
        "meta": {
            "source": "DoLayer",
            "order_id": order.get("order_id"),
            "time_in_force": order.get("time_in_force", "IOC"),
            "tags": order.get("tags", []),
        },
    }


def broker_timeout_s(order: dict[str, Any]) -> float:
    return BROKER_TIMEOUT_S.get(order.get("time_in_force") or "IOC", 5.0)


def exec_result(broker_answer: Any, broker_key: str) -> dict[str, Any]:
    """The canonical ExecResult from a broker answer (a 2xx body, or a 409 'already processed' body)."""
    answer = broker_answer if isinstance(broker_answer, dict) else {}
    return {
        "broker_order_id": answer.get("broker_order_id"),
        "accepted_at": answer.get("accepted_at"),
        "status": answer.get("status") if answer.get("status") not in (None, "already_processed") else "accepted",
        "fills": answer.get("fills") if isinstance(answer.get("fills"), list) else [],
        "idempotency_key": answer.get("idempotency_key") or broker_key,
    }


def result_digest(result: dict[str, Any]) -> str:
    return digest(canonical_json({k: result.get(k) for k in EXEC_RESULT_FIELDS}))
