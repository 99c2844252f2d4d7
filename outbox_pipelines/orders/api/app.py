"""The Order API: POST /do/order, GET /do/order/{key}, /healthz, /metrics, /openapi.json.

Assembles the Starlette app from the package's modules (config, resources, callers, body, routes_order,
routes_ops, endpoint, request_log, responses). Nothing is stored for a rejected request; one log line per
request, nothing from the body. The order of checks and the answers: docs/explanation/orders.md, "The Order API".
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
