"""A message's creation context: the ``create {topic}`` span (PRODUCER) an enqueue starts as the child of the
application's current span, its W3C ``traceparent`` and ``tracestate`` stored in the message's headers for the
relay to link to and forward. Without a current span, one context variable read and nothing else.
docs/explanation/enqueue.md, "Trace context"."""

import os
from collections.abc import Container, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from opentelemetry import context, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.telemetry.tracing import TRACEPARENT, carrier_of, tracer

CREATE_ENV = "OUTBOX_TRACE_CREATE"
# The messaging conventions' custom value when the application does not say which broker the table feeds.
DEFAULT_MESSAGING_SYSTEM = "outbox"
# The headers are carrier_of's: TraceContextTextMapPropagator's, never the global propagator's, which would
# store the application's baggage in the table too.


def create_spans_enabled(env: Mapping[str, str] | None = None) -> bool:
    """OUTBOX_TRACE_CREATE: ``on`` (the default) or ``off`` (the parent's context is stored, no create span)."""
    raw = (os.environ if env is None else env).get(CREATE_ENV, "").strip().lower()
    if raw in ("", "on", "true", "1", "yes"):
        return True
    if raw in ("off", "false", "0", "no"):
        return False
    raise ConfigError(f"{CREATE_ENV}={raw!r}: use on or off")


@dataclass(frozen=True)
class Producer:
    """What one ``Outbox`` puts on its create spans, and the tracer that starts them (``tracer(provider)``:
    without a provider, a proxy that follows the SDK installed later)."""

    table: str
    messaging_system: str
    create_spans: bool
    tracer: trace.Tracer


def producer(
    table: str, messaging_system: str | None = None, provider: "trace.TracerProvider | None" = None
) -> Producer:
    """An outbox table's Producer, OUTBOX_TRACE_CREATE read now (ConfigError when it is neither on nor off)."""
    return Producer(table, messaging_system or DEFAULT_MESSAGING_SYSTEM, create_spans_enabled(), tracer(provider))


class Creation:
    """The creation contexts of one enqueue call: ``headers`` gives a message's headers with its context (a
    create span started for it), ``written`` says which event ids the insert wrote, and leaving the ``with``
    block ends every span (``error.type`` and an error status when the call raised)."""

    __slots__ = ("_producer", "_context", "_parent", "_recording", "_carriers", "_spans", "_parent_carrier")

    def __init__(self, producer: Producer, parent: trace.Span) -> None:
        self._producer = producer
        self._context = context.get_current()
        self._parent = parent
        self._recording = producer.create_spans and parent.is_recording()
        self._carriers: dict[str, dict[str, str]] = {}
        self._spans: list[tuple[str, trace.Span]] = []
        self._parent_carrier: dict[str, str] | None = None

    def headers(self, headers: dict[str, Any], topic: str, event_id: str, ordering_key: str | None) -> dict[str, Any]:
        """``headers`` with the message's creation context; untouched when they carry a ``traceparent`` of their
        own (a custom creation context: no create span). One span per event id, however often it is asked."""
        if TRACEPARENT in headers:
            return headers
        carrier = self._carriers.get(event_id)
        if carrier is None:
            carrier = self._carriers[event_id] = self._carrier(topic, event_id, ordering_key)
        return {**headers, **carrier} if carrier else headers

    def _carrier(self, topic: str, event_id: str, ordering_key: str | None) -> dict[str, str]:
        if not self._recording:
            # Sampled out, or create spans off: the parent's context as it is (its sampling decision travels).
            if self._parent_carrier is None:
                self._parent_carrier = carrier_of(self._parent)
            return self._parent_carrier
        producer = self._producer
        span = producer.tracer.start_span(
            f"create {topic}",
            self._context,
            SpanKind.PRODUCER,
            attributes={
                "messaging.system": producer.messaging_system,
                "messaging.operation.name": "create",
                "messaging.operation.type": "create",
                "messaging.destination.name": topic,
                "messaging.message.id": event_id,
                "outbox.table": producer.table,
                "outbox.ordering_key.present": ordering_key is not None,
            },
        )
        self._spans.append((event_id, span))
        return carrier_of(span)

    def written(self, event_ids: Container[str]) -> None:
        """The insert wrote these event ids; every other one was stored already (``outbox.duplicate``)."""
        for event_id, span in self._spans:
            span.set_attribute("outbox.duplicate", event_id not in event_ids)

    def __enter__(self) -> "Creation":
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        for _, span in self._spans:
            if error is not None:
                span.set_attribute("error.type", type(error).__qualname__)
                span.set_status(Status(StatusCode.ERROR, type(error).__qualname__))
            span.end()


def creation(producer: Producer) -> Creation | None:
    """The creation contexts of one enqueue call, or None when the application has no valid current span (no
    SDK installed, or none started): then the message is stored as given."""
    parent = trace.get_current_span()
    if not parent.get_span_context().is_valid:
        return None
    return Creation(producer, parent)
