"""Seed 000 §5 and §8.1 over real sockets, through the relay.

§5: 4xx is not retried, except 408 and 429; a 409 is sent only when it says "already
processed". A request the HTTP client refuses to send is dead at once as BAD_REQUEST.
§8.1: the settle audit carries the error text of a retry or a death and the broker order
id of a delivery (``outbox_audit.detail``).
"""

from datetime import UTC, datetime

import httpx
import pytest

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.destinations import HttpDestination
from outbox_pipelines.core.destinations.http.destination import TRANSPORTS, HttpRequest, _exception_outcome
from outbox_pipelines.core.models import ClaimedMessage
from outbox_pipelines.core.relay import Relay
from outbox_pipelines.core.retry import RetryPolicy
from outbox_pipelines.orders.broker import OrderBroker
from outbox_pipelines.orders.broker_sim import BrokerSim, Faults
from outbox_pipelines_tests.conftest import table_settings
from outbox_pipelines_tests.helpers import accept_order, order_payload
from outbox_pipelines_tests.rows import make_due

ORDERS = "outbox_orders"
JSON = {"Content-Type": "application/json"}
RETRY = RetryPolicy(base_s=60.0, max_s=600.0, max_attempts=5, jitter=0.0)


@pytest.fixture(params=TRANSPORTS)
def transport(request) -> str:
    return request.param


def enqueue(conn, *keys: str, payload: dict | None = None) -> None:
    outbox = Outbox(ORDERS)
    for key in keys:
        outbox.enqueue(
            conn,
            Message(topic="order.created", payload=payload or {"order_id": key, "qty": 1}, event_id=key),
            outside_transaction=True,
        )


def relay_once(db_url: str, destination, url: str):
    settings = table_settings(ORDERS, destination="http", url=url, retry=RETRY)
    try:
        return Relay(db_url, settings, destination, worker_id="seed-000").run(once=True, max_seconds=30)
    finally:
        destination.close()


def the_row(conn, key: str) -> dict:
    return conn.execute(
        f"SELECT status, attempts, last_error_code, last_error, result_ref FROM {ORDERS} WHERE event_id = %s", (key,)
    ).fetchone()


def settle_audit(conn, key: str) -> list[dict]:
    return conn.execute(
        "SELECT code, to_status, error_code, detail FROM outbox_audit "
        "WHERE outbox_table = %s AND event_id = %s AND code <> 'outbox_claim' ORDER BY id",
        (ORDERS, key),
    ).fetchall()


def claimed(key: str, **fields) -> ClaimedMessage:
    values = dict(
        id=1,
        event_id=key,
        tenant_id=None,
        topic="order.created",
        payload={"qty": 1},
        payload_sha="sha256:" + "0" * 64,
        headers={},
        attempts=1,
        created_at=datetime.now(UTC),
    )
    values.update(fields)
    return ClaimedMessage(**values)


# -- §5: final 4xx answers are dead after one attempt -------------------------------------------------

FINAL_4XX = [
    (400, b'{"error": "invalid qty"}'),
    (404, b"no such endpoint"),
    (405, b"method not allowed"),
    (409, b'{"error": "IDEMPOTENCY_CONFLICT", "message": "body differs"}'),
    (410, b"gone"),
    (413, b"payload too large"),
    (415, b"unsupported media type"),
    (422, b'{"error": "instrument not tradable"}'),
]


@pytest.mark.parametrize(("status", "body"), FINAL_4XX, ids=[str(s) for s, _ in FINAL_4XX])
def test_a_final_4xx_is_dead_after_one_attempt_with_its_reason(conn, db_url, http_sink, status, body):
    enqueue(conn, "k-4xx", "k-ok")
    http_sink.script = lambda key, attempt, request_body: (status, JSON, body) if key == "k-4xx" else None
    report = relay_once(db_url, HttpDestination(http_sink.url, timeout_s=2), http_sink.url)
    assert (report.sent, report.dead, report.retried) == (1, 1, 0)
    make_due(conn, ORDERS)
    assert relay_once(db_url, HttpDestination(http_sink.url, timeout_s=2), http_sink.url).claimed == 0

    row = the_row(conn, "k-4xx")
    assert (row["status"], row["attempts"], row["last_error_code"]) == ("dead", 1, "BAD_REQUEST")
    assert f"HTTP {status}" in row["last_error"] and body.decode()[:10] in row["last_error"]
    assert http_sink.counts["k-4xx"] == 1
    [audit] = settle_audit(conn, "k-4xx")
    assert (audit["code"], audit["to_status"], audit["error_code"]) == ("outbox_flush_dead", "dead", "BAD_REQUEST")
    assert audit["detail"] == row["last_error"]


def test_401_and_403_are_dead_unauthorized(conn, db_url, http_sink):
    enqueue(conn, "k-401", "k-403")
    http_sink.script = lambda key, attempt, body: (int(key[-3:]), {}, b"")
    report = relay_once(db_url, HttpDestination(http_sink.url, timeout_s=2), http_sink.url)
    assert report.dead_by_code == {"UNAUTHORIZED": 2}
    assert the_row(conn, "k-401")["attempts"] == the_row(conn, "k-403")["attempts"] == 1


def test_408_is_retried_then_sent(conn, db_url, http_sink):
    enqueue(conn, "k-408")
    http_sink.script = lambda key, attempt, body: (408, {}, b"took too long") if attempt == 1 else None
    assert relay_once(db_url, HttpDestination(http_sink.url, timeout_s=2), http_sink.url).retried == 1
    row = the_row(conn, "k-408")
    assert (row["status"], row["last_error_code"]) == ("pending", "NETWORK_TIMEOUT")
    make_due(conn, ORDERS)
    assert relay_once(db_url, HttpDestination(http_sink.url, timeout_s=2), http_sink.url).sent == 1
    assert (the_row(conn, "k-408")["status"], http_sink.counts["k-408"]) == ("sent", 2)


def test_429_is_throttled_not_dead(conn, db_url, http_sink):
    enqueue(conn, "k-429")
    http_sink.script = lambda key, attempt, body: (429, {"Retry-After": "7"}, b"slow down")
    report = relay_once(db_url, HttpDestination(http_sink.url, timeout_s=2), http_sink.url)
    assert (report.dead, report.rate_limited) == (0, 1)
    row = the_row(conn, "k-429")
    assert (row["status"], row["attempts"], row["last_error_code"]) == ("pending", 0, "RATE_LIMITED")


# -- the HTTP client refuses to send: dead at once ----------------------------------------------------


@pytest.mark.parametrize("value", ["a\r\nX-Injected: 1", "line\nbreak", "vtab\x0bchar", "bell\x07"])
def test_a_header_the_client_refuses_is_dead_bad_request_at_once(conn, db_url, http_sink, transport, value):
    """A header built from the message with CR/LF or another control character: dead after one attempt,
    nothing on the wire."""
    enqueue(conn, "k-crlf", payload={"note": value})
    enqueue(conn, "k-fine", payload={"note": "plain"})
    build = lambda m: HttpRequest(body=m.payload, headers={"X-Note": m.payload["note"]})  # noqa: E731
    destination = HttpDestination(http_sink.url, timeout_s=2, transport=transport, build_request=build)
    report = relay_once(db_url, destination, http_sink.url)
    assert (report.sent, report.dead, report.retried) == (1, 1, 0)
    row = the_row(conn, "k-crlf")
    assert (row["status"], row["attempts"], row["last_error_code"]) == ("dead", 1, "BAD_REQUEST")
    assert "control character" in row["last_error"]
    assert http_sink.keys() == ["k-fine"]
    assert not any("X-Injected" in r.headers for r in http_sink.received)


@pytest.mark.parametrize("field", ["topic", "tenant_id", "trace_id"])
def test_control_characters_in_the_default_headers_are_dead_on_every_transport(http_sink, transport, field):
    fields = {"headers": {"trace_id": "t\r\n1"}} if field == "trace_id" else {field: "x\r\nX-Injected: 1"}
    message = claimed("k-hdr", **fields)
    destination = HttpDestination(http_sink.url, timeout_s=2, transport=transport)
    try:
        [outcome] = destination.deliver([message])
    finally:
        destination.close()
    assert (outcome.kind, outcome.code) == ("dead", "BAD_REQUEST"), outcome
    assert "control character" in outcome.error
    assert http_sink.received == []


def test_control_characters_in_an_event_id_are_sent_percent_encoded_never_as_a_header(http_sink, transport):
    """The id's header (Idempotency-Key) is percent-encoded where it is not printable ASCII: nothing injected."""
    destination = HttpDestination(http_sink.url, timeout_s=2, transport=transport)
    try:
        [outcome] = destination.deliver([claimed("k\r\nX-Injected: 1")])
    finally:
        destination.close()
    assert outcome.kind == "sent", outcome
    [request] = http_sink.received
    assert not any(name.lower() == "x-injected" for name in request.headers)
    assert request.key == "k%0D%0AX-Injected: 1"  # the Idempotency-Key the receiver saw


def test_a_header_a_transport_cannot_encode_is_never_retried(http_sink, transport):
    """httpx refuses non-ASCII header values (aiohttp sends them as UTF-8): dead at once or sent, never a retry."""
    destination = HttpDestination(http_sink.url, timeout_s=2, transport=transport)
    try:
        [outcome] = destination.deliver([claimed("k-utf8", tenant_id="café-東京")])
    finally:
        destination.close()
    assert (outcome.kind, outcome.code) in {("sent", None), ("dead", "BAD_REQUEST")}, outcome
    if outcome.kind == "dead":
        assert "refused to send" in outcome.error and http_sink.received == []


@pytest.mark.parametrize(
    "exc",
    [
        httpx.LocalProtocolError("Illegal header value b'a\\r\\nb'"),
        httpx.InvalidURL("Invalid non-printable ASCII character in URL"),
        httpx.UnsupportedProtocol("Request URL is missing an 'http://' or 'https://' protocol."),
        ValueError("Forbidden control character detected in headers. Potential header injection attack."),
        UnicodeEncodeError("ascii", "café", 3, 4, "ordinal not in range(128)"),
        ExceptionGroup("unhandled errors in a TaskGroup", [ValueError("port must be 0-65535")]),
    ],
)
def test_client_side_refusals_are_dead_bad_request(exc):
    outcome, failure = _exception_outcome(exc, 2.0)
    assert (outcome.kind, outcome.code, failure) == ("dead", "BAD_REQUEST", "refused")
    assert "refused to send" in outcome.error


@pytest.mark.parametrize(
    ("exc", "code", "failure"),
    [
        (httpx.ReadTimeout("slow"), "NETWORK_TIMEOUT", "timeout"),
        (httpx.ConnectError("reset"), "CONNECTION_LOST", "connection"),
        (httpx.RemoteProtocolError("Server disconnected"), "UNKNOWN", "protocol"),
        (RuntimeError("something else"), "UNKNOWN", "error"),
    ],
)
def test_network_failures_stay_retries(exc, code, failure):
    outcome, seen = _exception_outcome(exc, 2.0)
    assert (outcome.kind, outcome.code, seen) == ("retry", code, failure)


# -- §8.1: the settle audit carries the error text and the broker order id ---------------------------


def test_settle_audit_rows_carry_the_broker_order_id_or_the_error_text(conn, db_url):
    sim = BrokerSim(Faults(flaky_keys={"k-flaky": 1}, bad_keys={"k-bad"})).start_in_thread()
    try:
        with conn.transaction():
            for i, key in enumerate(("k-sent", "k-flaky", "k-bad", "k-dup"), start=1):
                accept_order(conn, "", order_payload(i, key))
        # k-dup was executed before (its answer lost): the broker answers 409 "already processed".
        with httpx.Client(trust_env=False) as direct:
            executed = direct.post(sim.url, json={"idempotency_key": "k-dup"}, headers={"Idempotency-Key": "k-dup"})
            assert executed.status_code == 201
        settings = table_settings(ORDERS, url=sim.url)
        for _ in range(2):
            broker = OrderBroker(sim.url)
            try:
                Relay(db_url, settings, broker, worker_id="audit").run(once=True, max_seconds=30)
            finally:
                broker.close()
            make_due(conn, ORDERS)
    finally:
        sim.stop()

    executed = {key: result["broker_order_id"] for key, result in sim.executed.items()}
    [sent] = settle_audit(conn, "k-sent")
    assert (sent["code"], sent["detail"]) == ("outbox_flush_success", f"ref={executed['k-sent']}")
    assert executed["k-sent"].startswith("brk-")
    [dup] = settle_audit(conn, "k-dup")
    assert (dup["error_code"], dup["detail"]) == ("CONFLICT_PROCESSED", f"ref={executed['k-dup']}")

    retried, delivered = settle_audit(conn, "k-flaky")
    assert (retried["code"], retried["error_code"]) == ("outbox_flush_retry", "BROKER_5XX")
    assert retried["detail"].startswith("HTTP 503: ")
    assert delivered["detail"] == f"ref={executed['k-flaky']}"

    [dead] = settle_audit(conn, "k-bad")
    assert (dead["code"], dead["error_code"]) == ("outbox_flush_dead", "BAD_REQUEST")
    assert dead["detail"].startswith("HTTP 400") and dead["detail"] == the_row(conn, "k-bad")["last_error"]


def test_the_audit_detail_is_capped_at_2000_characters(conn, db_url, http_sink):
    enqueue(conn, "k-huge")
    http_sink.script = lambda key, attempt, body: (503, {}, b"x" * 100_000)
    destination = HttpDestination(http_sink.url, timeout_s=2)
    relay_once(db_url, destination, http_sink.url)
    [audit] = settle_audit(conn, "k-huge")
    assert audit["code"] == "outbox_flush_retry"
    assert audit["detail"].startswith("HTTP 503") and len(audit["detail"]) <= 2000
