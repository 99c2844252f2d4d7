"""OpenTelemetry for the outbox: spans that follow a message from the request that wrote it to its consumer.

A message's creation context (W3C ``traceparent`` / ``tracestate``) travels in its headers; the relay's
``send`` span links to it and forwards it unchanged (docs/how-to/traces.md). Export follows the ``OTEL_*``
variables; unset, nothing is installed and the relay makes no span and reads no header.
"""

import functools
import logging
import os
import re
import sys
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    from opentelemetry.util.types import AttributeValue

# OpenTelemetry's API is imported on first use (~11 ms a process, -X importtime): a relay with tracing off never
# needs it, and a provider can only have been installed by a process that imported it.
log = logging.getLogger("outbox_pipelines.tracing")

TRACER_NAME = "outbox_pipelines"
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_VERSION_00 = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


@functools.cache
def _propagator() -> "TraceContextTextMapPropagator":
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


def tracer(provider: "trace.TracerProvider | None" = None) -> "trace.Tracer":
    from opentelemetry import trace

    return trace.get_tracer(TRACER_NAME, tracer_provider=provider)


_installed = False


def enabled() -> bool:
    """Whether an SDK provider is installed (else every span is a no-op). Remembered once True: a global
    provider is set once and never replaced, and the look-up costs an ``os.environ`` read until then. A process
    that never imported OpenTelemetry's API has none (unless OTEL_PYTHON_TRACER_PROVIDER names one for the API
    to load), and is not made to import it to learn that."""
    global _installed
    if _installed:
        return True
    if "opentelemetry.trace" not in sys.modules and not os.environ.get("OTEL_PYTHON_TRACER_PROVIDER"):
        return False
    from opentelemetry import trace

    _installed = not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    return _installed


class _NoSpan:
    """The span of a process without tracing: what ``span`` gives, at no cost."""

    def __enter__(self) -> "_NoSpan":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set_attribute(self, key: str, value: object) -> None:
        pass


_NO_SPAN = _NoSpan()


def span(name: str, attributes: "Mapping[str, AttributeValue]") -> AbstractContextManager[Any]:
    """A current span ``name`` with ``attributes`` (a context manager giving the span), or a no-op one that
    imports nothing when no provider is installed (``enabled``)."""
    if not enabled():
        return _NO_SPAN
    return tracer().start_as_current_span(name, attributes=attributes)


def context_of(headers: Mapping[str, Any] | None) -> "Context":
    """The trace context carried by ``traceparent`` / ``tracestate`` in headers (empty if none or malformed)."""
    from opentelemetry.context import Context

    if not headers or not isinstance(headers, Mapping):
        return Context()
    carrier = {name: str(headers[name]) for name in (TRACEPARENT, TRACESTATE) if headers.get(name)}
    return _propagator().extract(carrier) if carrier else Context()


def span_context_of(headers: Mapping[str, Any] | None) -> "trace.SpanContext | None":
    """The valid span context carried by headers, else None: W3C's parsing, a fifth of the propagator's time
    for the common ``00-`` traceparent (6 µs), which still reads any other version."""
    if not isinstance(headers, Mapping):  # None, or a row's jsonb written by SQL as any other JSON
        return None
    value = headers.get(TRACEPARENT)
    if not isinstance(value, str):
        return None
    from opentelemetry import trace
    from opentelemetry.trace.span import TraceState

    parsed = _VERSION_00.fullmatch(value)
    if parsed is None:
        found = trace.get_current_span(context_of(headers)).get_span_context()
        return found if found.is_valid else None
    trace_id, span_id, flags = int(parsed[1], 16), int(parsed[2], 16), int(parsed[3], 16)
    if not (trace_id and span_id):
        return None
    state = headers.get(TRACESTATE)
    trace_state = TraceState.from_header([state]) if isinstance(state, str) and state else None
    return trace.SpanContext(trace_id, span_id, True, trace.TraceFlags(flags), trace_state)


def carrier_of(span: "trace.Span") -> dict[str, str]:
    """``span``'s context as W3C headers: ``traceparent``, and ``tracestate`` when it has one ({} for a no-op)."""
    from opentelemetry import trace

    carrier: dict[str, str] = {}
    _propagator().inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def traceparent(span: "trace.Span") -> str | None:
    """The W3C traceparent of ``span`` (None for a no-op span)."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def configure_from_env(service_name: str, env: Mapping[str, str] | None = None, *, install: bool = True) -> Any:
    """Install an SDK TracerProvider exporting OTLP over HTTP when the OTEL_* variables ask for export.

    Returns the provider (shut it down at exit to flush), or None when tracing stays a no-op (or a
    provider is installed already). ``install=False`` builds it without making it the global one.
    """
    env = os.environ if env is None else env
    if _truthy(env.get("OTEL_SDK_DISABLED")) or (install and enabled()):
        return None
    if not (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return None
    if (env.get("OTEL_TRACES_EXPORTER") or "otlp").strip().lower() == "none":
        return None
    # Imported only when spans are exported: the SDK costs ~0.06 s and the exporter ~0.09 s at import
    # (-X importtime), and the exporter is an optional package.
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        log.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but opentelemetry-exporter-otlp-proto-http is not "
            "installed: no spans are exported"
        )
        return None
    attributes = {"service.name": env.get("OTEL_SERVICE_NAME") or service_name}
    provider = TracerProvider(resource=Resource.create(attributes))  # merges OTEL_RESOURCE_ATTRIBUTES
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if install:
        from opentelemetry import trace

        trace.set_tracer_provider(provider)
    return provider
