"""OrderRequest v1.1 (seed 001): validation, canonical form, and the broker mapping (seed 000 §4)."""

import math
import os
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation
from typing import Any

from outbox_pipelines.core.canonical import canonical_json, digest

DEFAULT_INSTRUMENTS = ("USDJPY", "EURUSD", "EURJPY", "GBPUSD", "GBPJPY", "AUDUSD", "AUDJPY", "USDCHF")
SIDES = ("BUY", "SELL")
TIME_IN_FORCE = ("IOC", "FOK", "GTC")
LOT_STEP = Decimal("0.01")
MIN_LOT = Decimal("0.01")
MAX_LOT = Decimal("100")
UNITS_PER_LOT = 100_000
MAX_PRICE = 1_000_000.0
KEY_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
ORDER_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
FIELDS = {"order_id", "instrument", "side", "qty", "price", "time_in_force", "tags", "idempotency_key",
          "requested_at", "risk_constraints"}
REQUIRED = ("order_id", "instrument", "side", "qty", "idempotency_key", "requested_at")
RISK_FIELDS = {"max_dd", "max_consecutive_loss", "max_spread"}
MAX_TAGS, MAX_TAG_LENGTH = 16, 32
MAX_CLOCK_SKEW = timedelta(minutes=5)
BROKER_TIMEOUT_S = {"IOC": 2.5, "FOK": 5.0, "GTC": 5.0}


@dataclass(frozen=True)
class Violation:
    field: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"field": self.field, "message": self.message}


def allowed_instruments() -> tuple[str, ...]:
    raw = os.environ.get("OUTBOX_INSTRUMENTS")
    return tuple(s.strip().upper() for s in raw.split(",") if s.strip()) if raw else DEFAULT_INSTRUMENTS


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value: Any) -> float | None:
    """The value as a finite float, or None (not a number, NaN/inf, or an int beyond float range)."""
    if not _is_number(value):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _whole(value: Any) -> int | None:
    """An integer, also when JSON wrote it as 3.0 (JSON Schema's 'integer' allows that)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$")


def _bad_text(value: Any) -> bool:
    """NUL anywhere, or a lone surrogate (not encodable as UTF-8), in any string or key."""
    if isinstance(value, str):
        if "\x00" in value:
            return True
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_bad_text(k) or _bad_text(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_bad_text(v) for v in value)
    return False


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or len(value) > 40 or not RFC3339.fullmatch(value):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def validate_order(body: Any, now: datetime | None = None) -> list[Violation]:
    """Every violation of OrderRequest v1.1, not just the first."""
    if not isinstance(body, dict):
        return [Violation("$", "the body must be a JSON object")]
    out: list[Violation] = []
    for name in sorted(set(body) - FIELDS):
        out.append(Violation(name[:64], "unknown field"))
    for name in REQUIRED:
        if body.get(name) is None:
            out.append(Violation(name, "is required"))
    if _bad_text(body):
        out.append(Violation("$", "strings must be valid Unicode without \\u0000"))
    order_id = body.get("order_id")
    if order_id is not None and (not isinstance(order_id, str) or not ORDER_ID_PATTERN.fullmatch(order_id)):
        out.append(Violation("order_id", "must be 1-64 characters of letters, digits and . _ : -"))
    key = body.get("idempotency_key")
    if key is not None and (not isinstance(key, str) or not KEY_PATTERN.fullmatch(key)):
        out.append(Violation("idempotency_key", "must be 1-128 characters of letters, digits and . _ : - (a ULID or UUID)"))
    instrument = body.get("instrument")
    if instrument is not None and instrument not in allowed_instruments():
        out.append(Violation("instrument", f"must be one of {', '.join(allowed_instruments())}"))
    side = body.get("side")
    if side is not None and side not in SIDES:
        out.append(Violation("side", "must be BUY or SELL"))
    qty = body.get("qty")
    if qty is not None:
        if _finite(qty) is None:
            out.append(Violation("qty", "must be a number of lots"))
        else:
            try:
                lots = Decimal(str(qty))
            except InvalidOperation:
                lots = Decimal(-1)
            if lots < MIN_LOT:
                out.append(Violation("qty", f"must be at least the minimum lot {MIN_LOT}"))
            elif lots > MAX_LOT:
                out.append(Violation("qty", f"must be at most {MAX_LOT} lots"))
            elif lots % LOT_STEP != 0:
                out.append(Violation("qty", f"must be a multiple of the lot step {LOT_STEP}"))
    price = body.get("price")
    price_value = _finite(price)
    if price is not None and (price_value is None or not 0 < price_value <= MAX_PRICE):
        out.append(Violation("price", "must be null for a market order, or a positive limit price"))
    tif = body.get("time_in_force")
    if tif is not None and tif not in TIME_IN_FORCE:
        out.append(Violation("time_in_force", "must be IOC, FOK or GTC (default IOC)"))
    tags = body.get("tags")
    if tags is not None and (
        not isinstance(tags, list) or len(tags) > MAX_TAGS
        or not all(isinstance(t, str) and 0 < len(t) <= MAX_TAG_LENGTH for t in tags)
    ):
        out.append(Violation("tags", f"must be a list of at most {MAX_TAGS} strings of 1-{MAX_TAG_LENGTH} characters"))
    requested = body.get("requested_at")
    if requested is not None:
        when = _parse_time(requested)
        if when is None:
            out.append(Violation("requested_at", "must be an RFC 3339 time with a zone, like 2025-08-24T00:00:00Z"))
        elif when > (now or datetime.now(timezone.utc)) + MAX_CLOCK_SKEW:
            out.append(Violation("requested_at", "is in the future"))
    risk = body.get("risk_constraints")
    if risk is not None:
        out.extend(_validate_risk(risk))
    return out


def _validate_risk(risk: Any) -> list[Violation]:
    if not isinstance(risk, dict):
        return [Violation("risk_constraints", "must be an object")]
    out = [Violation(f"risk_constraints.{k[:64]}", "unknown field") for k in sorted(set(risk) - RISK_FIELDS)]
    max_dd = risk.get("max_dd")
    if max_dd is not None and not 0 < (_finite(max_dd) or 0) <= 1:
        out.append(Violation("risk_constraints.max_dd", "must be a fraction in (0, 1]"))
    losses = risk.get("max_consecutive_loss")
    if losses is not None and not 0 <= (_whole(losses) if _whole(losses) is not None else -1) <= 1000:
        out.append(Violation("risk_constraints.max_consecutive_loss", "must be a whole number from 0 to 1000"))
    spread = risk.get("max_spread")
    if spread is not None and not 0 < (_finite(spread) or 0) <= 1:
        out.append(Violation("risk_constraints.max_spread", "must be a positive number at most 1"))
    return out


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
    """OrderRequest → the broker's request (seed 000 §4.1)."""
    units = int(Decimal(str(order["qty"])) * UNITS_PER_LOT)
    return {
        "idempotency_key": broker_key,
        "symbol": order["instrument"],
        "intent": order["side"],
        "qty": units,
        "limit_price": order.get("price"),
        "trace_id": trace_id or f"do-outbox-{broker_key}",
        "meta": {"source": "DoLayer", "order_id": order.get("order_id"),
                 "time_in_force": order.get("time_in_force", "IOC"), "tags": order.get("tags", [])},
    }


def broker_timeout_s(order: dict[str, Any]) -> float:
    return BROKER_TIMEOUT_S.get(order.get("time_in_force") or "IOC", 5.0)


EXEC_RESULT_FIELDS = ("broker_order_id", "accepted_at", "status", "fills", "idempotency_key")


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
