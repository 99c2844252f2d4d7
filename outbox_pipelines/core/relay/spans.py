"""Tracing of deliveries: one ``send {destination}`` span per destination call, linked to each message's
creation context and the child of it for a one-message batch. The context is forwarded unchanged; only a
message without one gets the send span's. Names and attributes: docs/how-to/traces.md, "Spans".
"""

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.util.types import AttributeValue

from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.models import ClaimedMessage, Outcome, OutcomeKind
from outbox_pipelines.core.telemetry import tracing

# error.type must stay low-cardinality: an outcome's code is (ErrorCode, a handler's PermanentError code);
# anything else is "_OTHER", as the conventions ask.
_CODE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
OTHER = "_OTHER"
FAILED_EVENT = "outbox.message.failed"


def error_type(outcome: Outcome | None) -> str:
    code = outcome.code if outcome is not None else None
    return code if code and _CODE.match(code) else OTHER


class SendSpan:
    """The span of one ``destination.deliver`` call; ``messages`` are those to hand to the destination."""

    def __init__(
        self, destination: Destination, table_name: str, messages: list[ClaimedMessage], tracer: Any = None
    ) -> None:
        links: list[trace.Link] = []
        contextless: list[int] = []
        parent: Context | None = None
        for index, message in enumerate(messages):
            created = tracing.span_context_of(message.headers)
            if created is None:
                contextless.append(index)
                continue
            links.append(
                trace.Link(created, {"messaging.message.id": message.event_id, "outbox.attempt": message.attempts})
            )
            if len(messages) == 1:  # one message: the send is the child of its creation
                parent = trace.set_span_in_context(trace.NonRecordingSpan(created))
        names = {destination.destination_name(message) for message in messages}
        name = names.pop() if len(names) == 1 else None
        attributes: dict[str, AttributeValue] = {
            "messaging.system": destination.messaging_system,
            "messaging.operation.name": "send",
            "messaging.operation.type": "send",
            "outbox.table": table_name,
        }
        if name is not None:
            attributes["messaging.destination.name"] = name
        if len(messages) == 1:
            [message] = messages
            attributes["messaging.message.id"] = message.event_id
            attributes["outbox.attempt"] = message.attempts
            attributes["outbox.ordering_key.present"] = message.ordering_key is not None
        else:
            attributes["messaging.batch.message_count"] = len(messages)
        if destination.server is not None:
            host, port = destination.server
            attributes["server.address"] = host
            if port is not None:
                attributes["server.port"] = port
        # PRODUCER when its context becomes a message's creation context; else a CLIENT linked to theirs.
        kind = trace.SpanKind.PRODUCER if contextless else trace.SpanKind.CLIENT
        self.span = (tracer or tracing.tracer()).start_span(
            f"send {name}" if name else "send",
            context=parent,
            kind=kind,
            attributes=attributes,
            links=links,
        )
        self.messages = messages
        if contextless:
            carrier = tracing.carrier_of(self.span)
            if carrier:
                self.messages = list(messages)
                for index in contextless:
                    message = messages[index]
                    # Copies: a message's headers are shared with the batch the relay settles.
                    headers = message.headers if isinstance(message.headers, dict) else {}
                    self.messages[index] = replace(message, headers={**headers, **carrier})

    def end(self, outcomes: Sequence[Outcome]) -> None:
        """Failures as ``error.type`` (one message, or a batch none of which was sent) and one event each."""
        span = self.span
        count = len(self.messages)
        # A destination that breaks its contract may answer fewer outcomes: the rest were not sent.
        answered: list[Outcome | None] = [*outcomes[:count], *[None] * (count - len(outcomes))]
        failed = [
            (m, o) for m, o in zip(self.messages, answered, strict=True) if o is None or o.kind != OutcomeKind.SENT
        ]
        if count == 1:
            outcome = answered[0]
            span.set_attribute("outbox.outcome", (outcome.kind if outcome is not None else OutcomeKind.RETRY).value)
        elif failed:
            for message, outcome in failed:
                span.add_event(
                    FAILED_EVENT,
                    {
                        "messaging.message.id": message.event_id,
                        "error.type": error_type(outcome),
                        "outbox.outcome": (outcome.kind if outcome is not None else OutcomeKind.RETRY).value,
                    },
                )
        if failed and len(failed) == count:
            types = {error_type(outcome) for _, outcome in failed}
            kind = types.pop() if len(types) == 1 else OTHER
            span.set_attribute("error.type", kind)
            span.set_status(trace.Status(trace.StatusCode.ERROR, kind))
        span.end()
