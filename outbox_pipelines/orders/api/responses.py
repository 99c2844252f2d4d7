"""The Order API's error answers: one JSON shape for every refusal, and the 503s of the database.

Every error body is ``{"error": CODE, "message": ..., **extra}``. A ``Rejection`` is a refusal raised
anywhere in a request and answered by the route wrapper (see endpoint); its ``reason`` is for the
log line only, never in the body. A busy or unreachable database is a 503 with Retry-After, counted
by code and reason.
"""

from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter
from starlette.responses import JSONResponse

from outbox_pipelines.core.telemetry import metrics
from outbox_pipelines.orders.api.dbguard import DatabaseTrouble

ORDER_DATABASE_REJECTIONS = Counter(
    "order_database_rejections_total",
    "Order API requests answered 503 because of the database, by reason",
    ["code", "reason"],
    registry=metrics.REGISTRY,
)


def error_response(
    status: int,
    code: str,
    message: str,
    headers: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> JSONResponse:
    """The one shape of an error body, whoever answers it."""
    return JSONResponse({"error": code, "message": message, **(extra or {})}, status, headers=headers)


class Rejection(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        headers: dict[str, str] | None = None,
        reason: str = "",
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers, self.extra = status, code, message, headers or {}, extra
        self.reason = reason  # for the log line only, never in the body

    def response(self) -> JSONResponse:
        return error_response(self.status, self.code, self.message, self.headers, self.extra)


def database_rejection(trouble: DatabaseTrouble, what: str, wait: int) -> Rejection:
    """503 for a busy or unreachable database: Retry-After (``wait`` seconds), and a retry with the
    same key is safe; ``what`` says what to retry."""
    ORDER_DATABASE_REJECTIONS.labels(trouble.code, trouble.reason).inc()
    if trouble.busy:
        message = (
            f"the outbox database is busy ({trouble.reason.replace('_', ' ')}): nothing was stored; "
            f"{what} after Retry-After seconds"
        )
    else:
        message = f"the outbox database cannot be reached; {what} after Retry-After seconds"
    return Rejection(
        503, trouble.code, message, headers={"Retry-After": str(wait)}, reason=trouble.reason, retry_after=wait
    )
