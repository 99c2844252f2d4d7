"""The order routes: POST /do/order (accept an order once) and GET /do/order/{key} (its ledger entry).

After the caller's and the body's checks: keys equal (422 IDEMPOTENCY_MISMATCH), a valid OrderRequest v1.1 (422
VALIDATION_ERROR), then ledger and outbox rows in one transaction: 201 first, 200 an identical repeat, 409 a
different body. Nothing is stored for a rejected request; both routes read the ledger in the caller's scope.
"""

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from outbox_pipelines.orders import metrics as order_metrics
from outbox_pipelines.orders.api.auth import read_or_create_secret
from outbox_pipelines.orders.api.body import read_json
from outbox_pipelines.orders.api.dbguard import Budget, DatabaseTrouble
from outbox_pipelines.orders.api.request_log import RequestFacts
from outbox_pipelines.orders.api.resources import OrderApi
from outbox_pipelines.orders.api.responses import Rejection
from outbox_pipelines.orders.ledger import Acceptance, KeyReused, accept_order, ledger_entry
from outbox_pipelines.orders.validation import KEY_PATTERN, validate_order

# What POST /do/order answers for what the ledger made of an order (seed 001): the stored answer with
# 201 the first time, with 200 for an identical repeat; 409 IDEMPOTENCY_CONFLICT otherwise.
ACCEPTANCE_STATUS = {"accepted": 201, "replay": 200}
CONFLICT_STATUS = 409
DIFFERENT_BODY = "body differs from the first request with this key"
KEY_REUSED = "this key was used for an earlier order (past the 48 h ledger window); use a new key"


async def submit(api: OrderApi, request: Request) -> Response:
    facts: RequestFacts = request.state.facts
    header_key = request.headers.get("idempotency-key")
    if header_key and KEY_PATTERN.fullmatch(header_key):
        facts.idempotency_key = header_key  # logged for rejections too; a malformed one never is
    caller = api.callers.admit(request)
    body = await read_json(request, api.settings.max_body_bytes)
    body_key = body.get("idempotency_key") if isinstance(body, dict) else None
    if not header_key:
        raise Rejection(
            422, "IDEMPOTENCY_MISMATCH", "the Idempotency-Key header is required and must equal body.idempotency_key"
        )
    if header_key != body_key:
        raise Rejection(422, "IDEMPOTENCY_MISMATCH", "the Idempotency-Key header must equal body.idempotency_key")
    violations = validate_order(body)
    if violations:
        raise Rejection(
            422,
            "VALIDATION_ERROR",
            f"{len(violations)} problem(s) with the order",
            violations=[v.as_dict() for v in violations],
        )
    budget = api.db.budget()  # counted from here: waiting for a worker thread takes from it too
    acceptance = await run_in_threadpool(_accept, api, caller, body, facts.trace_id, facts.traceparent, budget)
    return JSONResponse(acceptance.response, ACCEPTANCE_STATUS[acceptance.kind])


def _accept(
    api: OrderApi, caller: int | None, body: dict[str, Any], trace_id: str, traceparent: str | None, budget: Budget
) -> Acceptance:
    """The ledger's acceptance of the order; a conflict is raised as its 409."""
    key = body["idempotency_key"]
    try:
        _ensure_scopes(api, budget)
        with api.db.transaction(budget) as conn:
            scope = api.tokens.effective_scope(conn, caller, key)
            acceptance = accept_order(conn, scope, body, trace_id=trace_id, traceparent=traceparent)
    except KeyReused:  # the transaction rolled back: nothing stored
        raise conflict(key, KEY_REUSED) from None
    except DatabaseTrouble as trouble:  # the transaction rolled back (or never began)
        raise api.database_rejection(trouble, "retry with the same key (the same Idempotency-Key and body)") from None
    if acceptance.kind == "conflict":
        raise conflict(key, DIFFERENT_BODY)
    return acceptance


async def status(api: OrderApi, request: Request) -> Response:
    facts: RequestFacts = request.state.facts
    key = request.path_params["key"]
    if KEY_PATTERN.fullmatch(key):
        facts.idempotency_key = key
    caller = api.callers.admit(request)
    if not KEY_PATTERN.fullmatch(key):
        raise Rejection(404, "NOT_FOUND", "no order with this key")
    entry = await run_in_threadpool(_entry, api, caller, key, api.db.budget())
    if entry is None:
        raise Rejection(404, "NOT_FOUND", "no order with this key")
    return JSONResponse(
        {
            "idempotency_key": entry["idempotency_key"],
            "status": entry["status"],
            "http_status": entry["http_status"],
            "request_digest": entry["request_digest"],
            "accepted_at": entry["created_at"].isoformat(),
            "updated_at": entry["updated_at"].isoformat(),
            "expires_at": entry["expires_at"].isoformat(),
            "result": entry["result"],
            "result_digest": entry["result_digest"],
            "reason": entry["reason"],
        }
    )


def _entry(api: OrderApi, caller: int | None, key: str, budget: Budget) -> dict[str, Any] | None:
    try:
        _ensure_scopes(api, budget)
        with api.db.transaction(budget) as conn:
            return ledger_entry(conn, api.tokens.effective_scope(conn, caller, key), key)
    except DatabaseTrouble as trouble:
        raise api.database_rejection(trouble, "ask again") from None


def _ensure_scopes(api: OrderApi, budget: Budget) -> None:
    """The per-caller scopes need the server secret: read (or created) once, in a transaction of its own."""
    if api.tokens.ready:
        return
    with api.db.transaction(budget) as conn:
        secret = read_or_create_secret(conn)
    api.tokens.install(secret)


def conflict(key: str, message: str) -> Rejection:
    """409 IDEMPOTENCY_CONFLICT for ``key`` (counted): nothing was stored."""
    order_metrics.ORDER_CONFLICTS.inc()
    return Rejection(CONFLICT_STATUS, "IDEMPOTENCY_CONFLICT", message, idempotency_key=key)
