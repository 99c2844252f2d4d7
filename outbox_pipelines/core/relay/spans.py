"""Tracing of deliveries: one span per message sent, continuing the trace that wrote the message."""

from collections.abc import Sequence
from dataclasses import replace

from opentelemetry import trace

from outbox_pipelines.core.models import ClaimedMessage, Outcome, OutcomeKind
from outbox_pipelines.core.telemetry import metrics, tracing


class SendSpans:
    """One span per message sent, each a child of the span that wrote the message (its stored
    ``traceparent``); the messages handed to the destination carry the send span's traceparent."""

    def __init__(self, table_name: str, messages: list[ClaimedMessage]) -> None:
        tracer = tracing.tracer()
        self.spans = []
        self.messages = []
        for message in messages:
            span = tracer.start_span(
                f"outbox.send {message.topic}",
                context=tracing.context_of(message.headers),
                kind=trace.SpanKind.PRODUCER,
                attributes={
                    "messaging.system": "outbox",
                    "messaging.destination.name": table_name,
                    "outbox.table": table_name,
                    "outbox.topic": message.topic,
                    "outbox.event_id": message.event_id,
                    "outbox.attempt": message.attempts,
                    "outbox.tenant": metrics.tenant_label(table_name, message.tenant_id),
                },
            )
            self.spans.append(span)
            parent = tracing.traceparent(span)
            self.messages.append(
                replace(message, headers={**message.headers, tracing.TRACEPARENT: parent}) if parent else message
            )

    def end(self, outcomes: Sequence[Outcome]) -> None:
        # Ends only the spans of the outcomes there are (a destination that breaks its contract may answer fewer).
        for span, outcome in zip(self.spans, outcomes, strict=False):
            span.set_attribute("outbox.outcome", outcome.kind)
            if outcome.code:
                span.set_attribute("outbox.code", outcome.code)
            if outcome.kind != OutcomeKind.SENT:
                span.set_status(trace.Status(trace.StatusCode.ERROR, outcome.code or outcome.kind))
            span.end()
