"""The relay's ``send {destination}`` span (docs/how-to/traces.md, "Spans"): one per destination call, linked to
each message's creation context, the child of it for a one-message batch; the context reaches the destination
unchanged, and only a message without one gets the send span's. Tracing off: not one header is read."""

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from outbox_pipelines.core import models as m
from outbox_pipelines.core.models import ClaimedMessage, Outcome
from outbox_pipelines.core.relay import spans
from outbox_pipelines.core.relay.dispatch import DispatchPlan, deliver_planned
from outbox_pipelines.core.telemetry import tracing
from outbox_pipelines.testing import RecordingDestination

CREATED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
OTHER_TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def claimed(event_id: str, *, topic: str = "order.created", headers: dict[str, Any] | None = None) -> ClaimedMessage:
    return ClaimedMessage(
        id=1, event_id=event_id, tenant_id=None, topic=topic, payload={}, payload_sha="sha256:00",
        headers=headers if headers is not None else {}, attempts=2, created_at=datetime.now(UTC),
    )  # fmt: skip


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """An SDK provider for the relay's spans, without touching the process's global one (set once)."""
    found = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(found))
    monkeypatch.setattr(tracing, "enabled", lambda: True)
    monkeypatch.setattr(tracing, "tracer", lambda provider_=None: provider.get_tracer(tracing.TRACER_NAME))
    yield found
    provider.shutdown()


def deliver(destination: Any, messages: list[ClaimedMessage]) -> list[Outcome]:
    plan = DispatchPlan(outcomes=[None] * len(messages), to_send=list(range(len(messages))))
    return deliver_planned(destination, "outbox_orders", messages, plan)


def test_one_message_send_is_the_child_of_its_creation_and_forwards_it_unchanged(exporter):
    destination = RecordingDestination()
    headers = {"traceparent": CREATED, "tracestate": "vendor=abc,other=1", "trace_id": "t-1"}
    deliver(destination, [claimed("ev-1", headers=headers)])
    [span] = exporter.get_finished_spans()
    assert span.name == "send order.created"
    assert span.kind == trace.SpanKind.CLIENT
    assert span.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert span.parent is not None and span.parent.span_id == 0xB7AD6B7169203331
    [link] = span.links
    assert link.context.span_id == 0xB7AD6B7169203331
    assert dict(link.attributes or {}) == {"messaging.message.id": "ev-1", "outbox.attempt": 2}
    assert dict(span.attributes or {}) == {
        "messaging.system": "outbox",
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.destination.name": "order.created",
        "messaging.message.id": "ev-1",
        "outbox.table": "outbox_orders",
        "outbox.attempt": 2,
        "outbox.ordering_key.present": False,
        "outbox.outcome": "sent",
    }
    assert span.status.status_code == trace.StatusCode.UNSET
    [sent] = destination.delivered
    assert sent.headers == headers  # the creation context, not the send span's


def test_a_batch_links_every_creation_and_gives_its_own_context_only_to_messages_without_one(exporter):
    destination = RecordingDestination()
    first = claimed("ev-1", headers={"traceparent": CREATED})
    second = claimed("ev-2", headers={"traceparent": OTHER_TRACE})
    bare = claimed("ev-3")
    deliver(destination, [first, second, bare])
    [span] = exporter.get_finished_spans()
    assert span.name == "send order.created"
    assert span.kind == trace.SpanKind.PRODUCER  # its context became ev-3's creation context
    assert span.parent is None  # a batch: no single parent
    assert [(link.context.span_id, link.attributes["messaging.message.id"]) for link in span.links] == [
        (0xB7AD6B7169203331, "ev-1"),
        (0x00F067AA0BA902B7, "ev-2"),
    ]
    attributes = dict(span.attributes or {})
    assert attributes["messaging.batch.message_count"] == 3
    assert "messaging.message.id" not in attributes and "outbox.attempt" not in attributes
    one, two, three = destination.delivered
    assert one.headers == {"traceparent": CREATED} and two.headers == {"traceparent": OTHER_TRACE}
    ctx = span.context
    assert three.headers == {"traceparent": f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"}
    assert bare.headers == {}  # the claimed message itself is not changed


def test_a_batch_of_several_destinations_is_named_send_alone(exporter):
    deliver(RecordingDestination(), [claimed("a", topic="order.created"), claimed("b", topic="order.paid")])
    [span] = exporter.get_finished_spans()
    assert span.name == "send"
    assert "messaging.destination.name" not in (span.attributes or {})


def test_a_failed_message_sets_error_type_and_a_partly_failed_batch_an_event_each(exporter):
    deliver(RecordingDestination(lambda msg: Outcome.dead(m.BAD_REQUEST, "no")), [claimed("ev-1")])
    refused = {"ev-2": Outcome.retry(m.NETWORK_TIMEOUT), "ev-3": Outcome.dead("free text, not a code!")}
    deliver(RecordingDestination(lambda msg: refused.get(msg.event_id, Outcome.sent())), [
        claimed("ev-1"), claimed("ev-2"), claimed("ev-3"),
    ])  # fmt: skip
    deliver(RecordingDestination(lambda msg: refused[msg.event_id]), [claimed("ev-2"), claimed("ev-3")])
    single, partly, none_sent = exporter.get_finished_spans()
    assert single.attributes["error.type"] == "BAD_REQUEST" and single.attributes["outbox.outcome"] == "dead"
    assert single.status.status_code == trace.StatusCode.ERROR
    assert "error.type" not in partly.attributes and partly.status.status_code == trace.StatusCode.UNSET
    assert [dict(event.attributes or {}) for event in partly.events] == [
        {"messaging.message.id": "ev-2", "error.type": "NETWORK_TIMEOUT", "outbox.outcome": "retry"},
        {"messaging.message.id": "ev-3", "error.type": "_OTHER", "outbox.outcome": "dead"},
    ]
    assert none_sent.attributes["error.type"] == "_OTHER"  # two codes: no single one to name
    assert none_sent.status.status_code == trace.StatusCode.ERROR


def test_a_destination_that_raises_ends_its_span_as_unknown(exporter):
    class Raising(RecordingDestination):
        def deliver(self, messages: Any) -> list[Outcome]:
            raise RuntimeError("boom")

    [outcome] = deliver(Raising(), [claimed("ev-1", headers={"traceparent": CREATED})])
    assert outcome.code == m.UNKNOWN
    [span] = exporter.get_finished_spans()
    assert span.attributes["error.type"] == "UNKNOWN"


def test_tracing_off_reads_no_header_and_hands_the_claimed_messages_over(monkeypatch):
    assert not tracing.enabled()  # the tests install no global provider
    monkeypatch.setattr(spans, "SendSpan", None)  # a span would be a TypeError
    messages = [claimed("ev-1", headers={"traceparent": CREATED})]
    destination = RecordingDestination()
    deliver(destination, messages)
    assert destination.delivered[0] is messages[0]


def test_enabled_is_remembered_once_a_provider_is_installed(monkeypatch):
    asked: list[int] = []

    def provider() -> Any:
        asked.append(1)
        return TracerProvider()

    monkeypatch.setattr(tracing, "_installed", False)
    monkeypatch.setattr(trace, "get_tracer_provider", provider)
    assert tracing.enabled() and tracing.enabled()
    assert len(asked) == 1


@pytest.mark.parametrize(
    "headers",
    [
        {"traceparent": CREATED},
        {"traceparent": CREATED, "tracestate": "rojo=1,congo=2"},
        {"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"},  # an invalid trace id
        {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01"},
        {"traceparent": "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-later"},  # a later version
        {"traceparent": "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        {"traceparent": CREATED + "-more"},
        {"traceparent": CREATED.upper()},
        {"traceparent": 7},
        {"tracestate": "rojo=1"},
        {},
        ["traceparent"],  # a row's headers written by SQL may be any JSON
    ],
)
def test_the_quick_parse_of_a_creation_context_reads_what_the_w3c_propagator_reads(headers):
    extracted = trace.get_current_span(tracing.context_of(headers)).get_span_context()
    found = tracing.span_context_of(headers)
    if not extracted.is_valid:
        assert found is None
    else:
        assert found is not None
        assert (found.trace_id, found.span_id, found.trace_flags, found.is_remote) == (
            extracted.trace_id, extracted.span_id, extracted.trace_flags, extracted.is_remote,
        )  # fmt: skip
        assert found.trace_state.to_header() == extracted.trace_state.to_header()


def test_headers_that_are_not_an_object_get_the_send_spans_context_without_failing_the_batch(exporter):
    destination = RecordingDestination()
    [outcome] = deliver(destination, [claimed("ev-1", headers=["written", "by", "SQL"])])  # type: ignore[arg-type]
    assert outcome.kind == m.OutcomeKind.SENT
    [span] = exporter.get_finished_spans()
    assert span.kind == trace.SpanKind.PRODUCER and not span.links
    assert destination.delivered[0].headers["traceparent"].split("-")[2] == f"{span.context.span_id:016x}"


def test_a_process_that_never_imported_opentelemetry_is_not_made_to_unless_a_provider_is_named():
    """A relay without tracing skips OpenTelemetry's import (~11 ms of each `relay --once`); a provider named by
    OTEL_PYTHON_TRACER_PROVIDER, which the API loads itself, still turns its spans on."""
    probe = (
        "import sys\n"
        "from outbox_pipelines.core.telemetry import tracing\n"
        "on = tracing.enabled()\n"
        "with tracing.span('outbox.claim', {'outbox.table': 't'}) as span:\n"
        "    span.set_attribute('outbox.claimed', 1)\n"
        "print(on, 'opentelemetry.trace' in sys.modules, type(span).__name__)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    off = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert off.stdout.split() == ["False", "False", "_NoSpan"]
    named = {**env, "OTEL_PYTHON_TRACER_PROVIDER": "sdk_tracer_provider"}
    on = subprocess.run([sys.executable, "-c", probe], env=named, capture_output=True, text=True, check=True)
    assert on.stdout.split() == ["True", "True", "_Span"]
