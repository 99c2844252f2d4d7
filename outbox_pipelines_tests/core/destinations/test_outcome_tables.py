"""Each destination's outcome table (the rows docs/reference/outcomes.md and docs/destinations.md show) is
what its classifiers do: an example answer of every row, fed to the classifier, makes that row's outcome
and code; the classifier modules make no outcome but from a row; every outcome the destination's other
modules make directly is one the table lists; and "(circuit)" marks exactly the rows the circuit counts.

Without servers: the answers are the clients' own exception and frame objects, built here."""

import asyncio
import re
import socket
import ssl
from pathlib import Path
from types import SimpleNamespace

import aiormq
import httpx
import nats.errors
import nats.js.errors
import pytest
from confluent_kafka import KafkaError
from nats.aio.msg import Msg

from outbox_pipelines.core.destinations.http import failures as hf
from outbox_pipelines.core.destinations.http import outcomes as ho
from outbox_pipelines.core.destinations.kafka import outcomes as ko
from outbox_pipelines.core.destinations.nats import outcomes as no
from outbox_pipelines.core.destinations.outcome_tables import TABLES, rows
from outbox_pipelines.core.destinations.rabbitmq import outcomes as ro
from outbox_pipelines.core.redaction import Scrubber
from outbox_pipelines.core.relay.destination_health import DESTINATION_FAILURES

DESTINATIONS = Path(ho.__file__).parent.parent
JSON = {"content-type": "application/json"}


def _http(status, body=b"", headers=None):
    return lambda: ho.classify_response(status, headers or {}, body)


def _http_failure(exc):
    return lambda: hf.exception_outcome(exc, 5.0)[0]


def _caused(exc, cause):
    """``exc`` raised from ``cause``, as a client wraps the operating system's error."""
    exc.__cause__ = cause
    return exc


_NATS = no.NatsOutcomes("nats://127.0.0.1:4222", Scrubber("nats://127.0.0.1:4222"), 5.0)


class _JetStreamSays:
    """A connection whose JetStream API answers find_stream_name_by_subject with ``answer`` (raised if an error)."""

    def __init__(self, answer):
        self.answer = answer

    def jsm(self, timeout):
        return self

    async def find_stream_name_by_subject(self, subject):
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def _no_responders(answer):
    return lambda: asyncio.run(_NATS.no_responders(_JetStreamSays(answer), "orders.created"))


def _returned(reconnected_s: float | None = None):
    frame = SimpleNamespace(reply_code=312, reply_text="NO_ROUTE", exchange="crm.events", routing_key="orders")
    exc = aiormq.exceptions.PublishError.__new__(aiormq.exceptions.PublishError)
    exc.frame = frame
    return ro.returned(exc, reconnected_s)


def _kafka(code, *, broken=None, retriable=False):
    err = KafkaError(code, "the broker says so", retriable=retriable)
    return lambda: ko.error_outcome(err, str, refused_at_produce=False, broken=broken, client_error=None)


# One example answer per row: what the classifier is given, as the destination would give it.
EXAMPLES = {
    ho.SENT: _http(201, b'{"id": "B-1"}', JSON),
    ho.NOT_THE_JSON_IT_DECLARES: _http(200, b"<html>proxy</html>", JSON),
    ho.ALREADY_PROCESSED: _http(409, b'{"status": "already_processed"}', JSON),
    ho.CONFLICT: _http(409, b'{"error": "duplicate rejected: different order"}', JSON),
    ho.REQUEST_TIMEOUT: _http(408),
    ho.TOO_MANY_REQUESTS: _http(429, headers={"retry-after": "3"}),
    ho.SERVER_ERROR: _http(503),
    ho.UNAUTHORIZED: _http(403),
    ho.CLIENT_ERROR: _http(422, b'{"error": "invalid"}', JSON),
    ho.UNEXPECTED_STATUS: _http(302),
    hf.NO_ANSWER_IN_TIME: _http_failure(httpx.ReadTimeout("timed out")),
    hf.CONNECTION_REFUSED: _http_failure(
        _caused(httpx.ConnectError("refused"), ConnectionRefusedError(111, "refused"))
    ),
    hf.NAME_NOT_RESOLVED: _http_failure(_caused(httpx.ConnectError("no name"), socket.gaierror(-2, "not known"))),
    hf.TLS_FAILED: _http_failure(_caused(httpx.ConnectError("tls"), ssl.SSLCertVerificationError(1, "self-signed"))),
    hf.CONNECTION_FAILED: _http_failure(_caused(httpx.ReadError("reset"), ConnectionResetError(104, "reset"))),
    hf.CLIENT_REFUSED: _http_failure(httpx.LocalProtocolError("Illegal header value")),
    hf.UNUSABLE_ANSWER: _http_failure(httpx.RemoteProtocolError("Server disconnected without sending a response.")),
    hf.OTHER_ERROR: _http_failure(RuntimeError("unforeseen")),
    no.PUBACK: lambda: _NATS.reply(Msg(None, data=b'{"stream": "ORDERS", "seq": 7}')),
    no.NO_STREAM: _no_responders(nats.js.errors.NotFoundError()),
    no.NOT_ANSWERING: _no_responders("ORDERS"),
    no.MESSAGE_REFUSED: lambda: _NATS.exception(nats.errors.MaxPayloadError()),
    no.DENIED: lambda: _NATS.connect_failed(nats.errors.AuthorizationError(), [], "nats://127.0.0.1:4222"),
    no.NO_ANSWER: lambda: _NATS.exception(nats.errors.TimeoutError()),
    no.REFUSED: lambda: _NATS.connect_failed(nats.errors.NoServersError(), [ConnectionRefusedError(111, "x")], "n"),
    no.NAME_NOT_RESOLVED: lambda: _NATS.connect_failed(socket.gaierror(-2, "not known"), [], "nats://nowhere:4222"),
    no.TLS_FAILED: lambda: _NATS.connect_failed(ssl.SSLCertVerificationError(1, "self-signed"), [], "tls://x:4222"),
    no.CONNECTION_LOST: lambda: _NATS.exception(nats.errors.ConnectionClosedError()),
    no.JETSTREAM_ERROR: lambda: _NATS.api_error({"code": 503, "err_code": 10077, "description": "maximum messages"}),
    no.NOT_JETSTREAMS: lambda: _NATS.reply(Msg(None, data=b"not json")),
    ro.ACK: lambda: ro.SENT,
    ro.RETURN: _returned,
    ro.RETURN_WHILE_RECOVERING: lambda: _returned(reconnected_s=2.0),
    ro.NACK: lambda: ro.NACKED,
    ro.BAD_MESSAGE: lambda: ro.too_large(70_000, 65_536),
    ro.DENIED: lambda: ro.connect_outcome(aiormq.exceptions.AuthenticationError("ACCESS_REFUSED"), "crm", 5.0),
    ro.NO_ANSWER: lambda: ro.connect_outcome(TimeoutError(), "crm", 5.0),
    ro.REFUSED: lambda: ro.connect_outcome(ConnectionRefusedError(111, "refused"), "crm", 5.0),
    ro.NAME_NOT_RESOLVED: lambda: ro.connect_outcome(socket.gaierror(-2, "not known"), "crm", 5.0),
    ro.TLS_FAILED: lambda: ro.connect_outcome(ssl.SSLCertVerificationError(1, "self-signed"), "crm", 5.0),
    ro.UNREACHABLE: lambda: ro.exception_outcome(ConnectionResetError(104, "reset"), 5.0),
    ro.OTHER: lambda: ro.exception_outcome(RuntimeError("unforeseen"), 5.0),
    ko.DELIVERED: lambda: ko.sent("orders/0@42"),
    ko.BAD_RECORD: _kafka(KafkaError.MSG_SIZE_TOO_LARGE),
    ko.NO_TOPIC: _kafka(KafkaError.UNKNOWN_TOPIC_OR_PART),
    ko.REFUSED: _kafka(KafkaError.TOPIC_AUTHORIZATION_FAILED),
    ko.TLS_FAILED: _kafka(KafkaError._SSL),
    ko.NAME_NOT_RESOLVED: _kafka(KafkaError._RESOLVE),
    ko.CONNECTION_REFUSED: lambda: ko.error_outcome(
        KafkaError(KafkaError._MSG_TIMED_OUT),
        str,
        refused_at_produce=False,
        broken=None,
        client_error=KafkaError(KafkaError._TRANSPORT, "Connect to ipv4#127.0.0.1:1 failed: Connection refused"),
    ),
    ko.UNREACHABLE: _kafka(KafkaError._MSG_TIMED_OUT),
    ko.BROKER_FAILED: _kafka(KafkaError.NOT_ENOUGH_REPLICAS, retriable=True),
    ko.PRODUCER_FAILED: _kafka(KafkaError._MSG_TIMED_OUT, broken="fenced"),
    ko.UNFORESEEN: _kafka(KafkaError.UNKNOWN),
}
ALL_ROWS = [(destination, row) for destination in TABLES for row in rows(destination)]


@pytest.mark.parametrize(("destination", "row"), ALL_ROWS, ids=[f"{d}:{r.answer[:40]}" for d, r in ALL_ROWS])
def test_every_rows_example_answer_makes_that_rows_outcome(destination, row):
    assert row in EXAMPLES, f"{destination}: no example answer for the row {row.answer!r}: add one to EXAMPLES"
    outcome = EXAMPLES[row]()
    assert (outcome.kind, outcome.code) == (row.kind, row.code), f"{destination}: {row.answer!r} -> {outcome}"


def test_every_example_is_of_a_row_a_table_shows():
    assert set(EXAMPLES) <= {row for _, row in ALL_ROWS}


# The modules that classify: every outcome they make is a row's (row.outcome(...)), never built by hand.
CLASSIFIERS = ["http/outcomes.py", "http/failures.py", "nats/outcomes.py", "rabbitmq/outcomes.py", "kafka/outcomes.py"]


@pytest.mark.parametrize("module", CLASSIFIERS)
def test_a_classifier_makes_outcomes_only_from_its_rows(module):
    source = (DESTINATIONS / module).read_text()
    assert not re.findall(r"Outcome\.(?:sent|retry|dead)\(", source), f"{module} builds an outcome by hand"


# A destination's other modules still make some outcomes themselves (checks before sending): each must be
# one its table lists.
MADE_BY_HAND = re.compile(r"Outcome\.(retry|dead)\(\s*m\.([A-Z0-9_]+)")


@pytest.mark.parametrize("destination", sorted(TABLES))
def test_every_outcome_a_destination_makes_by_hand_is_in_its_table(destination):
    listed = {(row.kind, row.code) for row in rows(destination)}
    # A transport's folder (kafka/), or a module of its own (handlers.py, paper.py).
    modules = sorted((DESTINATIONS / destination).glob("*.py")) + sorted(DESTINATIONS.glob(f"{destination}*.py"))
    assert modules
    made = {(kind, code, module.name) for module in modules for kind, code in MADE_BY_HAND.findall(module.read_text())}
    missing = sorted(item for item in made if item[:2] not in listed)
    assert not missing, f"outcomes the {destination} table does not list (kind, code, module): {missing}"


@pytest.mark.parametrize(("destination", "row"), ALL_ROWS, ids=[f"{d}:{r.answer[:40]}" for d, r in ALL_ROWS])
def test_circuit_marks_exactly_the_rows_the_circuit_counts(destination, row):
    """destination_health counts every outcome but sent whose code is a destination failure."""
    counts = row.kind != "sent" and row.code in DESTINATION_FAILURES
    assert ("(circuit)" in row.then) == counts, f"{destination}: {row.answer!r} ({row.kind} {row.code})"
