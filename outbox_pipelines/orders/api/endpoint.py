"""Every route of the Order API wrapped the same way, and routing errors answered in kind.

A wrapped route gets its trace id and server span; every outcome is an answer (a refusal its error body, a client
gone 499 logged at INFO, a bug 500 with its traceback logged); the order routes answer X-Trace-Id and count their
requests by status. One log line per request: request_log.
"""

import contextlib
import re
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from opentelemetry import trace
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from outbox_pipelines.orders import metrics as order_metrics
from outbox_pipelines.orders.api import tracing
from outbox_pipelines.orders.api.request_log import RequestFacts, log_request
from outbox_pipelines.orders.api.responses import Rejection, error_response

Handler = Callable[[Request], Awaitable[Response]]

TRACE_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
CLIENT_CLOSED = 499  # nginx's "client closed request": never sent, only logged and counted
ORDER_ROUTES = ("/do/order", "/do/order/{key}")


def _request_trace_id(request: Request, span: trace.Span | None) -> str:
    """The client's X-Trace-Id when it is a plain token, else the span's trace id, else a fresh one."""
    sent = request.headers.get("x-trace-id")
    if sent and TRACE_ID_PATTERN.fullmatch(sent):
        return sent
    return (tracing.trace_id_hex(span) if span is not None else None) or f"do-{uuid.uuid4().hex[:16]}"


def _server_span(tracer: trace.Tracer, span_name: str | None, request: Request) -> Any:
    """The request's server span (continuing the caller's trace), or no span for a route without one."""
    if not span_name:
        return contextlib.nullcontext(None)
    return tracer.start_as_current_span(
        span_name,
        context=tracing.incoming_context(request.headers),
        kind=trace.SpanKind.SERVER,
        record_exception=False,
        set_status_on_exception=False,
    )


async def _answer(handler: Handler, request: Request) -> tuple[Response, str, Rejection | None, Any]:
    """The handler's response and reason code, the rejection it raised, and a bug's exc_info: every
    outcome of a request is an answer."""
    try:
        response: Response = await handler(request)
        return response, "OK", None, None
    except Rejection as rejected:
        return rejected.response(), rejected.code, rejected, None
    except ClientDisconnect:
        # The client went away mid-body: nothing was read whole, nothing stored, nobody to answer.
        return Response(status_code=CLIENT_CLOSED), "CLIENT_DISCONNECTED", None, None
    except Exception:  # any bug is a 500 with its one log line (and traceback)
        exc_info = sys.exc_info()
        response = error_response(500, "INTERNAL_ERROR", "unexpected error; retry with the same key")
        return response, "INTERNAL_ERROR", None, exc_info


def _describe_span(
    span: trace.Span, method: str, route: str, status: int, reason_code: str, facts: RequestFacts
) -> None:
    span.set_attribute("http.request.method", method)
    span.set_attribute("http.route", route)
    span.set_attribute("http.response.status_code", status)
    span.set_attribute("order.reason_code", reason_code)
    span.set_attribute("order.trace_id", facts.trace_id)
    if facts.idempotency_key:
        span.set_attribute("order.idempotency_key", facts.idempotency_key)
    if status >= 500 and status != CLIENT_CLOSED:
        span.set_status(trace.Status(trace.StatusCode.ERROR, reason_code))


def endpoint(tracer: trace.Tracer, handler: Handler, route: str, span_name: str | None = None) -> Handler:
    """``handler`` as a route: its trace id and span, the order routes' metric, one log line."""
    order_route = route in ORDER_ROUTES

    async def wrapped(request: Request) -> Response:
        started = time.perf_counter()
        facts = RequestFacts(route=route)
        request.state.facts = facts
        with _server_span(tracer, span_name, request) as span:
            if span is not None:
                facts.traceparent = tracing.traceparent(span)
            facts.trace_id = _request_trace_id(request, span)
            response, reason_code, rejection, exc_info = await _answer(handler, request)
            status = response.status_code
            if span is not None:
                _describe_span(span, request.method, route, status, reason_code, facts)
        if order_route:
            response.headers["X-Trace-Id"] = facts.trace_id
            order_metrics.ORDER_REQUESTS.labels(str(status)).inc()
        if order_route or status >= 400:  # healthz, metrics and openapi: only their failures
            log_request(
                request.method,
                route,
                status,
                reason_code,
                facts,
                (time.perf_counter() - started) * 1000,
                reason=rejection.reason if rejection is not None else "",
                exc_info=exc_info,
            )
        return response

    return wrapped


async def routing_error(request: Request, exc: Exception) -> Response:
    """Routing errors (no such path, wrong method) answer in the same JSON shape as every other error,
    and get their one log line (the route is unknown: the raw path is not logged)."""
    assert isinstance(exc, HTTPException)
    code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(exc.status_code, "HTTP_ERROR")
    log_request(request.method, "-", exc.status_code, code, None, 0.0)
    return error_response(exc.status_code, code, exc.detail, exc.headers)
