"""The one log line of a request, on ``outbox_pipelines.orders.api``, and what it says.

method, route (never the raw path), status, reason_code (the error code, OK for success),
trace_id, idempotency_key, latency_ms and the reason of a refusal: in the message and as ``extra``
for structured handlers, and nothing from the body or the token. A 503 is a WARNING, any other 5xx
an ERROR (with its traceback), everything else INFO.
"""

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("outbox_pipelines.orders.api")


@dataclass
class RequestFacts:
    """What the one log line (and the span) of a request says; filled in as the request goes."""

    route: str
    trace_id: str = ""
    idempotency_key: str = ""
    traceparent: str | None = None


def log_request(
    method: str,
    route: str,
    status: int,
    reason_code: str,
    facts: RequestFacts | None,
    elapsed_ms: float,
    *,
    reason: str = "",
    exc_info: Any = None,
) -> None:
    """The one line of a request: its route (never the raw path), status, code and timing; no body, no token."""
    trace_id = facts.trace_id if facts else ""
    key = facts.idempotency_key if facts else ""
    fields = {
        "http_method": method,
        "route": route,
        "status": status,
        "reason_code": reason_code,
        "trace_id": trace_id,
        "idempotency_key": key,
        "latency_ms": round(elapsed_ms, 1),
        "reason": reason,
    }
    level = logging.ERROR if status >= 500 and status != 503 else logging.WARNING if status == 503 else logging.INFO
    message = "%s %s status=%s reason_code=%s trace_id=%s idempotency_key=%s latency_ms=%.1f" + (
        " reason=%s" if reason else ""
    )
    args: tuple[Any, ...] = (method, route, status, reason_code, trace_id or "-", key or "-", elapsed_ms)
    log.log(level, message, *(args + ((reason,) if reason else ())), extra=fields, exc_info=exc_info)
