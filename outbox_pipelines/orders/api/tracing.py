"""OpenTelemetry for the Order API: the ``do.order`` span, and its W3C traceparent.

The shared pieces live in ``outbox_pipelines.core.telemetry.tracing``; the traceparent of ``do.order`` goes into the
accepted order's outbox headers, so the relay's send span is its child. The tracer comes from the provider given
(tests pass one) or the global one.
"""

from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context

from outbox_pipelines.core.telemetry import tracing as core_tracing
from outbox_pipelines.core.telemetry.tracing import traceparent

__all__ = ["DEFAULT_SERVICE_NAME", "configure_from_env", "incoming_context", "trace_id_hex", "traceparent", "tracer"]

TRACER_NAME = "outbox_pipelines.orders.api"
DEFAULT_SERVICE_NAME = "outbox-order-api"


def tracer(provider: "trace.TracerProvider | None" = None) -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME, tracer_provider=provider)


def incoming_context(headers: Mapping[str, str]) -> Context:
    """The caller's trace context from its ``traceparent`` / ``tracestate`` headers (empty if none or malformed)."""
    return core_tracing.context_of(headers)


def trace_id_hex(span: trace.Span) -> str | None:
    ctx = span.get_span_context()
    return f"{ctx.trace_id:032x}" if ctx.is_valid else None


def configure_from_env(env: Mapping[str, str] | None = None, *, install: bool = True) -> Any:
    """OTLP export for the API when the OTEL_* variables ask for it (core.tracing.configure_from_env)."""
    return core_tracing.configure_from_env(DEFAULT_SERVICE_NAME, env, install=install)
