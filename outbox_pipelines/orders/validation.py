"""OrderRequest v1.1 (seed 001): every rule an order must meet before the ledger sees it.

``validate_order`` lists every violation, not just the first: one check per field,
run in the order of ``FIELD_CHECKS``.
"""

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

DEFAULT_INSTRUMENTS = ("USDJPY", "EURUSD", "EURJPY", "GBPUSD", "GBPJPY", "AUDUSD", "AUDJPY", "USDCHF")
SIDES = ("BUY", "SELL")
TIME_IN_FORCE = ("IOC", "FOK", "GTC")
LOT_STEP = Decimal("0.01")
MIN_LOT = Decimal("0.01")
MAX_LOT = Decimal("100")
MAX_PRICE = 1_000_000.0
KEY_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
ORDER_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
FIELDS = {
    "order_id",
    "instrument",
    "side",
    "qty",
    "price",
    "time_in_force",
    "tags",
    "idempotency_key",
    "requested_at",
    "risk_constraints",
}
REQUIRED = ("order_id", "instrument", "side", "qty", "idempotency_key", "requested_at")
RISK_FIELDS = {"max_dd", "max_consecutive_loss", "max_spread"}
MAX_TAGS, MAX_TAG_LENGTH = 16, 32
MAX_CLOCK_SKEW = timedelta(minutes=5)
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$")


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


# -- one check per field: called with a value that is present (not None) ------------------------------
def _check_order_id(order_id: Any, now: datetime) -> list[Violation]:
    if isinstance(order_id, str) and ORDER_ID_PATTERN.fullmatch(order_id):
        return []
    return [Violation("order_id", "must be 1-64 characters of letters, digits and . _ : -")]


def _check_idempotency_key(key: Any, now: datetime) -> list[Violation]:
    if isinstance(key, str) and KEY_PATTERN.fullmatch(key):
        return []
    return [Violation("idempotency_key", "must be 1-128 characters of letters, digits and . _ : - (a ULID or UUID)")]


def _check_instrument(instrument: Any, now: datetime) -> list[Violation]:
    allowed = allowed_instruments()
    return [] if instrument in allowed else [Violation("instrument", f"must be one of {', '.join(allowed)}")]


def _check_side(side: Any, now: datetime) -> list[Violation]:
    return [] if side in SIDES else [Violation("side", "must be BUY or SELL")]


def _check_qty(qty: Any, now: datetime) -> list[Violation]:
    if _finite(qty) is None:
        return [Violation("qty", "must be a number of lots")]
    try:
        lots = Decimal(str(qty))
    except InvalidOperation:
        lots = Decimal(-1)
    if lots < MIN_LOT:
        return [Violation("qty", f"must be at least the minimum lot {MIN_LOT}")]
    if lots > MAX_LOT:
        return [Violation("qty", f"must be at most {MAX_LOT} lots")]
    if lots % LOT_STEP != 0:
        return [Violation("qty", f"must be a multiple of the lot step {LOT_STEP}")]
    return []


def _check_price(price: Any, now: datetime) -> list[Violation]:
    value = _finite(price)
    if value is not None and 0 < value <= MAX_PRICE:
        return []
    return [Violation("price", "must be null for a market order, or a positive limit price")]


def _check_time_in_force(tif: Any, now: datetime) -> list[Violation]:
    return [] if tif in TIME_IN_FORCE else [Violation("time_in_force", "must be IOC, FOK or GTC (default IOC)")]


def _check_tags(tags: Any, now: datetime) -> list[Violation]:
    if (
        isinstance(tags, list)
        and len(tags) <= MAX_TAGS
        and all(isinstance(t, str) and 0 < len(t) <= MAX_TAG_LENGTH for t in tags)
    ):
        return []
    return [Violation("tags", f"must be a list of at most {MAX_TAGS} strings of 1-{MAX_TAG_LENGTH} characters")]


def _check_requested_at(requested: Any, now: datetime) -> list[Violation]:
    when = _parse_time(requested)
    if when is None:
        return [Violation("requested_at", "must be an RFC 3339 time with a zone, like 2025-08-24T00:00:00Z")]
    if when > now + MAX_CLOCK_SKEW:
        return [Violation("requested_at", "is in the future")]
    return []


def _check_risk(risk: Any, now: datetime) -> list[Violation]:
    if not isinstance(risk, dict):
        return [Violation("risk_constraints", "must be an object")]
    out = [Violation(f"risk_constraints.{k[:64]}", "unknown field") for k in sorted(set(risk) - RISK_FIELDS)]
    max_dd = risk.get("max_dd")
    if max_dd is not None and not 0 < (_finite(max_dd) or 0) <= 1:
        out.append(Violation("risk_constraints.max_dd", "must be a fraction in (0, 1]"))
    losses = risk.get("max_consecutive_loss")
    whole_losses = _whole(losses) if losses is not None else None
    if losses is not None and not (whole_losses is not None and 0 <= whole_losses <= 1000):
        out.append(Violation("risk_constraints.max_consecutive_loss", "must be a whole number from 0 to 1000"))
    spread = risk.get("max_spread")
    if spread is not None and not 0 < (_finite(spread) or 0) <= 1:
        out.append(Violation("risk_constraints.max_spread", "must be a positive number at most 1"))
    return out


FieldCheck = Callable[[Any, datetime], list[Violation]]
# In the order violations are listed.
FIELD_CHECKS: tuple[tuple[str, FieldCheck], ...] = (
    ("order_id", _check_order_id),
    ("idempotency_key", _check_idempotency_key),
    ("instrument", _check_instrument),
    ("side", _check_side),
    ("qty", _check_qty),
    ("price", _check_price),
    ("time_in_force", _check_time_in_force),
    ("tags", _check_tags),
    ("requested_at", _check_requested_at),
    ("risk_constraints", _check_risk),
)


def validate_order(body: Any, now: datetime | None = None) -> list[Violation]:
    """Every violation of OrderRequest v1.1, not just the first."""
    if not isinstance(body, dict):
        return [Violation("$", "the body must be a JSON object")]
    out = [Violation(name[:64], "unknown field") for name in sorted(set(body) - FIELDS)]
    out += [Violation(name, "is required") for name in REQUIRED if body.get(name) is None]
    if _bad_text(body):
        out.append(Violation("$", "strings must be valid Unicode without \\u0000"))
    now = now or datetime.now(UTC)
    for name, check in FIELD_CHECKS:
        value = body.get(name)
        if value is not None:
            out.extend(check(value, now))
    return out
