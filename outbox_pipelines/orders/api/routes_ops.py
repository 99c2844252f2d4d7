"""The operator's routes: /healthz, /metrics and /openapi.json.

/healthz answers within 1 s whatever the request pool is doing (a probe on a connection of its own):
200, or 503 DATABASE_UNAVAILABLE with Retry-After. /metrics is the process's metrics and this app's
table gauges, behind the bearer token when OUTBOX_API_METRICS_REQUIRE_TOKEN (or the tokens) say so.
/openapi.json is the API's document with this app's limits.
"""

from prometheus_client import generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from outbox_pipelines.core.telemetry import metrics
from outbox_pipelines.orders.api.openapi import document
from outbox_pipelines.orders.api.resources import OrderApi
from outbox_pipelines.orders.api.responses import Rejection


async def health(api: OrderApi, request: Request) -> Response:
    """Within 1 s whatever the request pool is doing: a probe on a connection of its own."""
    probe = await api.health_probe.check()
    if probe.ok:
        return JSONResponse({"status": "ok"})
    message = (
        "the outbox database did not answer within 1 s"
        if probe.database == "timeout"
        else "the outbox database cannot be reached"
    )
    wait = api.settings.retry_after_s
    degraded = Rejection(
        503,
        "DATABASE_UNAVAILABLE",
        message,
        headers={"Retry-After": str(wait)},
        reason=f"healthz_{probe.database}",
        retry_after=wait,
    )
    degraded.extra.update(status="degraded", database=probe.database)
    raise degraded


async def metrics_endpoint(api: OrderApi, request: Request) -> Response:
    if api.settings.metrics_protected:
        api.callers.authenticate(request)
    payload = await run_in_threadpool(lambda: metrics.exposition() + generate_latest(api.state_metrics))
    return Response(payload, media_type="text/plain; version=0.0.4; charset=utf-8")


async def openapi(api: OrderApi, request: Request) -> Response:
    return JSONResponse(
        document(api.settings.rate_per_minute, api.settings.max_body_bytes, api.settings.auth_failures_per_minute)
    )
