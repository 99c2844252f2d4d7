"""The Order API: POST /do/order, GET /do/order/{key}, /healthz, /metrics, /openapi.json.

Order of checks (nothing is stored for a rejected request): failed
authentications from this address (429, before the token costs anything), bearer
token (401), rate limit per client (429), content type (415), body size (413), JSON (400),
header/body key (422 IDEMPOTENCY_MISMATCH), OrderRequest v1.1 (422
VALIDATION_ERROR, every violation), then the ledger row and the outbox row in
one transaction: 201 first time, 200 identical repeat, 409 different body.

A database that is busy (a lock, a full pool: past OUTBOX_API_DB_TIMEOUT, 2 s)
answers 503 DATABASE_BUSY, one that cannot be reached 503 DATABASE_UNAVAILABLE,
both with Retry-After and nothing stored; /healthz answers within 1 s on a
connection of its own (see dbguard).

Every request to /do/order (and every failed one elsewhere) gives exactly one log
line on ``outbox_pipelines.orders.api``: method, route, status, reason_code (the error
code, OK for success), trace_id, idempotency_key, latency_ms — the same fields as
``extra`` for structured handlers — and nothing from the body. A client that goes
away mid-request is status 499 (nginx's convention) at INFO, never a 500.
POST /do/order runs in a ``do.order`` span (see tracing).

This module assembles the Starlette app from the rooms of the package: its settings (config), what
it holds (resources), who may call (callers), the body (body), the routes (routes_order, routes_ops),
the wrapper every route runs in (endpoint), the log line (request_log) and the error bodies
(responses). The names below were this module's before it was split and are still imported from here.
"""

import contextlib
from collections.abc import AsyncIterator
from functools import partial

from opentelemetry import trace
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import Route

from outbox_pipelines.orders.api import routes_ops, routes_order
from outbox_pipelines.orders.api.config import ApiSettings
from outbox_pipelines.orders.api.endpoint import CLIENT_CLOSED, ORDER_ROUTES, TRACE_ID_PATTERN, endpoint, routing_error
from outbox_pipelines.orders.api.request_log import RequestFacts, log, log_request
from outbox_pipelines.orders.api.resources import OrderApi
from outbox_pipelines.orders.api.responses import ORDER_DATABASE_REJECTIONS, Rejection
from outbox_pipelines.orders.api.routes_order import (
    ACCEPTANCE_STATUS,
    CONFLICT_STATUS,
    DIFFERENT_BODY,
    KEY_REUSED,
    conflict,
)

__all__ = [
    "ACCEPTANCE_STATUS",
    "CLIENT_CLOSED",
    "CONFLICT_STATUS",
    "DIFFERENT_BODY",
    "KEY_REUSED",
    "ORDER_DATABASE_REJECTIONS",
    "ORDER_ROUTES",
    "TRACE_ID_PATTERN",
    "ApiSettings",
    "OrderApi",
    "Rejection",
    "RequestFacts",
    "conflict",
    "create_app",
    "log",
    "log_request",
]


def create_app(settings: ApiSettings, *, tracer_provider: "trace.TracerProvider | None" = None) -> Starlette:
    """The Order API; spans go to ``tracer_provider`` (default: the global one, a no-op unless configured)."""
    api = OrderApi(settings, tracer_provider)
    routes = [
        Route(
            "/do/order",
            endpoint(api.tracer, partial(routes_order.submit, api), "/do/order", "do.order"),
            methods=["POST"],
        ),
        Route(
            "/do/order/{key}",
            endpoint(api.tracer, partial(routes_order.status, api), "/do/order/{key}"),
            methods=["GET"],
        ),
        Route("/healthz", endpoint(api.tracer, partial(routes_ops.health, api), "/healthz"), methods=["GET"]),
        Route("/metrics", endpoint(api.tracer, partial(routes_ops.metrics_endpoint, api), "/metrics"), methods=["GET"]),
        Route(
            "/openapi.json", endpoint(api.tracer, partial(routes_ops.openapi, api), "/openapi.json"), methods=["GET"]
        ),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        api.dispose()

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: routing_error})
    app.state.api = api
    return app
