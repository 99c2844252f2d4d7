"""Every destination forwards a message's creation context in its native header form, lower-case
``traceparent`` then ``tracestate`` (a malformed tracestate is dropped), and names its system, destination and
server for the send span (docs/how-to/traces.md) without a credential."""

from datetime import UTC, datetime
from typing import Any

import pytest

from outbox_pipelines.core.destinations.base import Destination, server_of
from outbox_pipelines.core.destinations.http.destination import HttpDestination, default_request
from outbox_pipelines.core.destinations.kafka.destination import KafkaDestination, record_headers
from outbox_pipelines.core.destinations.nats.jetstream import NatsJetStreamDestination
from outbox_pipelines.core.destinations.nats.wire import Wire
from outbox_pipelines.core.destinations.rabbitmq.destination import RabbitMQDestination
from outbox_pipelines.core.destinations.trace_context import trace_headers, valid_tracestate
from outbox_pipelines.core.models import ClaimedMessage, Outcome

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
STATE = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"


def claimed(headers: dict[str, Any]) -> ClaimedMessage:
    return ClaimedMessage(
        id=1, event_id="ev-1", tenant_id=None, topic="order.created", payload={"n": 1}, payload_sha="sha256:00",
        headers=headers, attempts=1, created_at=datetime.now(UTC),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("value", "forwarded"),
    [
        (STATE, STATE),
        (" rojo=1 , ,congo=2 ", "rojo=1,congo=2"),  # optional spaces and empty members, as the spec allows
        ("tenant@vendor=x", "tenant@vendor=x"),
        ("Rojo=1", None),  # keys are lower-case
        ("rojo", None),
        ("rojo=a,b", None),
        ("rojo=1=2", None),
        ("rojo=" + "x" * 600, None),  # over 512 characters
        (",".join(f"k{i}=v" for i in range(33)), None),  # over 32 members
        ("rojo=ok\r\nx-injected: 1", None),
        (42, None),
        ("", None),
    ],
)
def test_tracestate_is_forwarded_only_when_well_formed(value, forwarded):
    assert valid_tracestate(value) == forwarded


def test_tracestate_travels_only_beside_a_well_formed_traceparent():
    assert trace_headers(claimed({"traceparent": PARENT, "tracestate": STATE})) == {
        "traceparent": PARENT,
        "tracestate": STATE,
    }
    assert trace_headers(claimed({"traceparent": PARENT, "tracestate": "Bad"})) == {"traceparent": PARENT}
    assert trace_headers(claimed({"traceparent": "00-nope", "tracestate": STATE})) == {}
    assert trace_headers(claimed({"tracestate": STATE})) == {}


def test_each_destination_kind_carries_the_context_in_its_own_headers():
    message = claimed({"traceparent": PARENT, "tracestate": STATE})
    http = default_request(message).headers
    assert (http["traceparent"], http["tracestate"]) == (PARENT, STATE)
    kafka = record_headers(message)
    names = [name for name, _ in kafka]
    # traceparent before tracestate, both before anything an instrumentation of the client would append
    assert names.index("traceparent") + 1 == names.index("tracestate") == len(names) - 1
    assert dict(kafka)["traceparent"] == PARENT and dict(kafka)["tracestate"] == STATE
    prepared = Wire("inbox.").prepare(message)
    assert isinstance(prepared, tuple)
    assert (prepared[2]["traceparent"], prepared[2]["tracestate"]) == (PARENT, STATE)


def test_rabbitmq_puts_the_context_in_the_application_headers():
    destination = RabbitMQDestination("amqp://user:secret@127.0.0.1:1/vhost", exchange="events", topic_prefix="t.")
    try:
        publish = destination._prepare(0, claimed({"traceparent": PARENT, "tracestate": STATE}))
        assert not isinstance(publish, Outcome)
        headers = publish.properties.headers
        assert (headers["traceparent"], headers["tracestate"]) == (PARENT, STATE)
        assert destination.messaging_system == "rabbitmq"
        assert destination.destination_name(claimed({})) == "events:t.order.created"
        assert destination.server == ("127.0.0.1", 1)
    finally:
        destination.close()


def test_each_destination_names_its_system_destination_and_server_without_a_credential():
    message = claimed({})
    http = HttpDestination("https://user:secret@hooks.example.com/in?token=x")
    kafka = KafkaDestination("127.0.0.1:1,127.0.0.1:2", topic_prefix="inbox.", timeout_s=0.2)
    nats = NatsJetStreamDestination("nats://user:secret@127.0.0.1:1", topic_prefix="inbox.")
    try:
        found = [(d.messaging_system, d.destination_name(message), d.server) for d in (http, kafka, nats)]
    finally:
        for destination in (http, kafka, nats):
            destination.close()
    assert found == [
        ("http", "order.created", ("hooks.example.com", 443)),
        ("kafka", "inbox.order.created", ("127.0.0.1", 1)),
        ("nats", "inbox.order.created", ("127.0.0.1", 1)),
    ]
    assert (Destination.messaging_system, Destination().destination_name(message), Destination.server) == (
        "outbox",
        "order.created",
        None,
    )
    assert server_of("http://[::1]/x", 80) == ("::1", 80)
    assert server_of("not a url at all:x") is None
