"""The HTTP destination over real sockets on 127.0.0.1, alone and through the relay."""

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import pytest

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.destinations import HttpDestination
from outbox_pipelines.core.destinations.http.destination import TRANSPORTS, HttpRequest
from outbox_pipelines.core.models import ERROR_TEXT_LIMIT, ClaimedMessage
from outbox_pipelines.core.relay import Relay
from outbox_pipelines.core.retry import RetryPolicy
from outbox_pipelines_tests.conftest import table_settings
from outbox_pipelines_tests.processes import free_port
from outbox_pipelines_tests.rows import make_due

ORDERS = "outbox_orders"
JSON = {"Content-Type": "application/json"}


# -- helpers ------------------------------------------------------------------------------------


def claimed(event_id: str = "ev-1", payload: object = None, attempts: int = 1, **fields: object) -> ClaimedMessage:
    """A message as the relay hands it to a destination."""
    values = dict(
        id=1,
        event_id=event_id,
        tenant_id=None,
        topic="order.created",
        payload={"order_id": event_id, "qty": 1} if payload is None else payload,
        payload_sha="sha256:" + "0" * 64,
        headers={},
        attempts=attempts,
        created_at=datetime.now(UTC),
    )
    values.update(fields)
    return ClaimedMessage(**values)


@contextmanager
def http_destination(url: str, transport: str = "aiohttp", **kwargs: object) -> Iterator[HttpDestination]:
    destination = HttpDestination(url, transport=transport, **kwargs)
    try:
        yield destination
    finally:
        destination.close()


def deliver_one(url: str, transport: str, message: ClaimedMessage | None = None, **kwargs: object):
    with http_destination(url, transport, **kwargs) as destination:
        [outcome] = destination.deliver([message or claimed()])
    return outcome


def header(received, name: str) -> str | None:
    """A request header as the sink saw it (header names are case-insensitive)."""
    values = [v for k, v in received.headers.items() if k.lower() == name.lower()]
    assert len(values) <= 1, f"{name} sent {len(values)} times: {values}"
    return values[0] if values else None


class RawServer:
    """A TCP server on 127.0.0.1 that reads one request, writes ``reply`` (any bytes) and closes."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                # Read the whole request first: closing with unread bytes would send a reset
                # (a network error) instead of the answer under test.
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
                length = [
                    int(line.split(b":")[1])
                    for line in head.lower().split(b"\r\n")
                    if line.startswith(b"content-length:")
                ]
                await asyncio.wait_for(reader.readexactly(length[0] if length else 0), 2)
                writer.write(self.reply)
                await writer.drain()
            finally:
                writer.close()

        async def start() -> None:
            self._server = await asyncio.start_server(handle, "127.0.0.1", 0)
            self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/"
            ready.set()

        def run() -> None:
            self._loop.run_until_complete(start())
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="raw-server", daemon=True)
        self._thread.start()
        assert ready.wait(5)

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()


@pytest.fixture
def raw_server() -> Iterator[Callable[[bytes], "RawServer"]]:
    servers: list[RawServer] = []

    def start(reply: bytes) -> RawServer:
        servers.append(RawServer(reply))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture(params=TRANSPORTS)
def transport(request) -> str:
    return request.param


# -- the request --------------------------------------------------------------------------------


def test_every_attempt_carries_the_event_id_as_idempotency_key(http_sink, transport):
    with http_destination(http_sink.url, transport) as destination:
        first = destination.deliver([claimed("order-7", attempts=1)])
        again = destination.deliver([claimed("order-7", attempts=2)])
    assert [o.kind for o in first + again] == ["sent", "sent"]
    assert http_sink.keys() == ["order-7", "order-7"]
    assert [header(r, "X-Outbox-Attempt") for r in http_sink.received] == ["1", "2"]


def test_each_message_of_a_batch_carries_its_own_key(http_sink, transport):
    messages = [claimed(f"ev-{n}", id=n) for n in range(10)]
    with http_destination(http_sink.url, transport, max_in_flight=4) as destination:
        outcomes = destination.deliver(messages)
    # Outcomes come back in the order of the messages, each with the sink's ack reference.
    assert [o.ref for o in outcomes] == [f"ref-ev-{n}" for n in range(10)]
    assert sorted(http_sink.keys()) == sorted(f"ev-{n}" for n in range(10))
    assert all(r.body == {"order_id": r.key, "qty": 1} for r in http_sink.received)


def test_body_is_the_payload_as_json(http_sink, transport):
    payload = {"order_id": "A-1", "lines": [{"sku": "ねこ", "qty": 2}], "note": None, "price": 12.5}
    outcome = deliver_one(http_sink.url, transport, claimed("ev-json", payload))
    assert outcome.kind == "sent"
    [received] = http_sink.received
    assert received.body == payload
    assert header(received, "Content-Type") == "application/json"
    assert header(received, "X-Outbox-Topic") == "order.created"


def test_bearer_token_is_sent_when_configured(http_sink, transport):
    deliver_one(http_sink.url, transport, claimed("with-token"), token="s3cret")
    deliver_one(http_sink.url, transport, claimed("without-token"))
    by_key = {r.key: r for r in http_sink.received}
    assert header(by_key["with-token"], "Authorization") == "Bearer s3cret"
    assert header(by_key["without-token"], "Authorization") is None


def test_trace_and_tenant_travel_in_headers(http_sink, transport):
    deliver_one(http_sink.url, transport, claimed("ev-trace", tenant_id="acme", headers={"trace_id": "t-123"}))
    [received] = http_sink.received
    assert header(received, "X-Trace-Id") == "t-123"
    assert header(received, "X-Tenant-Id") == "acme"


@pytest.mark.parametrize("path", ["orders", "/orders", ""])
def test_a_request_builder_cannot_change_the_idempotency_key_or_duplicate_headers(http_sink, transport, path):
    def build(message: ClaimedMessage) -> HttpRequest:
        # Header names are case-insensitive: these replace the defaults, never add a second copy.
        return HttpRequest(
            body={"wrapped": message.payload},
            headers={"idempotency-key": "something-else", "content-type": "application/json; charset=utf-8"},
            path=path,
        )

    outcome = deliver_one(http_sink.url, transport, claimed("ev-built"), build_request=build)
    assert outcome.kind == "sent", outcome
    [received] = http_sink.received
    assert received.key == "ev-built"
    assert header(received, "Idempotency-Key") == "ev-built"
    assert header(received, "Content-Type") == "application/json; charset=utf-8"
    assert received.body == {"wrapped": {"order_id": "ev-built", "qty": 1}}


# -- answers and failures, the same on every transport ------------------------------------------


@pytest.mark.parametrize(
    ("status", "headers", "body", "expected"),
    [
        (201, JSON, b'{"broker_order_id": "B-1"}', ("sent", None, "B-1")),
        (409, JSON, b'{"error": "already processed", "order_id": "B-0"}', ("sent", "CONFLICT_PROCESSED", "B-0")),
        (429, {"Retry-After": "30"}, b"slow down", ("retry", "RATE_LIMITED", None)),
        (503, {}, b"down", ("retry", "BROKER_5XX", None)),
        (400, JSON, b'{"error": "bad qty"}', ("dead", "BAD_REQUEST", None)),
        (422, JSON, b'{"error": "bad qty"}', ("dead", "BAD_REQUEST", None)),
        (401, {}, b"", ("dead", "UNAUTHORIZED", None)),
        (403, {}, b"", ("dead", "UNAUTHORIZED", None)),
        # Seed 000 §5: every other 4xx is final too (a plain 409 included); 408 is retried.
        (404, {}, b"no such route", ("dead", "BAD_REQUEST", None)),
        (409, JSON, b'{"error": "IDEMPOTENCY_CONFLICT"}', ("dead", "BAD_REQUEST", None)),
        (413, {}, b"too large", ("dead", "BAD_REQUEST", None)),
        (408, {}, b"", ("retry", "NETWORK_TIMEOUT", None)),
        (200, JSON, b"<html>not json</html>", ("retry", "UNKNOWN", None)),
    ],
)
def test_answers_map_to_outcomes(http_sink, transport, status, headers, body, expected):
    http_sink.script = lambda key, attempt, request_body: (status, headers, body)
    outcome = deliver_one(http_sink.url, transport)
    assert (outcome.kind, outcome.code, outcome.ref) == expected
    if status == 429:
        assert outcome.delay_s == 30


def test_no_answer_within_the_timeout_is_a_network_timeout(http_sink, transport):
    http_sink.delay_s = 0.8
    with http_destination(http_sink.url, transport, timeout_s=0.2) as destination:
        started = time.monotonic()
        [outcome] = destination.deliver([claimed()])
        waited = time.monotonic() - started
    assert (outcome.kind, outcome.code) == ("retry", "NETWORK_TIMEOUT")
    assert "0.2" in outcome.error
    assert waited < 0.7  # gave up at the timeout, did not wait for the answer


def test_a_per_request_timeout_overrides_the_destination_timeout(http_sink, transport):
    http_sink.delay_s = 0.3
    build = lambda m: HttpRequest(body=m.payload, timeout_s=0.1)  # noqa: E731
    outcome = deliver_one(http_sink.url, transport, timeout_s=5, build_request=build)
    assert (outcome.kind, outcome.code) == ("retry", "NETWORK_TIMEOUT")


def test_connection_refused_is_a_connection_refused_retry(transport):
    started = time.monotonic()
    outcome = deliver_one(f"http://127.0.0.1:{free_port()}/", transport, timeout_s=2)
    assert (outcome.kind, outcome.code) == ("retry", "CONNECTION_REFUSED")
    assert "refused, nothing listens at that host and port" in outcome.error
    # It is reported as a failed connection, not as a timeout it never waited for.
    assert "connect" in outcome.error.lower()
    assert "no answer within" not in outcome.error
    assert time.monotonic() - started < 1.5


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(b"NOT HTTP AT ALL\r\n\r\n", id="not-http"),
        pytest.param(b"HTTP/1.1 abc OK\r\n\r\n", id="bad-status-line"),
        pytest.param(b"\x00\xff\x16\x03\x01garbage" * 50, id="binary"),
    ],
)
def test_a_garbage_answer_is_an_unknown_retry_never_an_exception(raw_server, transport, reply):
    server = raw_server(reply)
    outcome = deliver_one(server.url, transport, timeout_s=2)
    assert (outcome.kind, outcome.code) == ("retry", "UNKNOWN")
    assert len(outcome.error) <= ERROR_TEXT_LIMIT
    assert server.connections >= 1


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(b"", id="closes-without-answer"),
        pytest.param(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"a":', id="truncated-body"),
    ],
)
def test_a_broken_answer_is_the_same_retry_on_every_transport(raw_server, reply):
    server = raw_server(reply)
    outcomes = {t: deliver_one(server.url, t, timeout_s=2) for t in TRANSPORTS}
    assert {(o.kind, o.code) for o in outcomes.values()} == {("retry", "UNKNOWN")}, outcomes


def test_one_failing_message_does_not_fail_the_batch(http_sink, transport):
    http_sink.script = lambda key, attempt, body: (500, {}, b"boom") if key == "ev-bad" else None
    with http_destination(http_sink.url, transport) as destination:
        outcomes = destination.deliver([claimed("ev-a"), claimed("ev-bad"), claimed("ev-b")])
    assert [(o.kind, o.code) for o in outcomes] == [("sent", None), ("retry", "BROKER_5XX"), ("sent", None)]


def test_a_payload_the_request_builder_cannot_map_is_dead_bad_request(http_sink, transport):
    def build(message: ClaimedMessage) -> HttpRequest:
        return HttpRequest(body={"qty": message.payload["qty"]})

    with http_destination(http_sink.url, transport, build_request=build) as destination:
        outcomes = destination.deliver([claimed("ev-ok"), claimed("ev-odd", payload={"no": "qty"})])
    assert [(o.kind, o.code) for o in outcomes] == [("sent", None), ("dead", "BAD_REQUEST")]
    assert "KeyError" in outcomes[1].error
    assert http_sink.keys() == ["ev-ok"]


def test_bad_configuration_is_a_clear_error():
    with pytest.raises(ValueError, match="transport"):
        HttpDestination("http://127.0.0.1:1/", transport="carrier-pigeon")
    with pytest.raises(ValueError, match="http://"):
        HttpDestination("127.0.0.1:1/orders")


# -- end to end through the relay ---------------------------------------------------------------

SMALL_RETRY = RetryPolicy(base_s=60.0, max_s=600.0, max_attempts=3, jitter=0.0)


def enqueue(conn, *names: str) -> list[str]:
    outbox = Outbox(ORDERS)
    for name in names:
        outbox.enqueue(
            conn,
            Message(topic="order.created", payload={"order_id": name, "qty": 1}, event_id=name),
            outside_transaction=True,
        )
    return list(names)


def orders_settings(sink, **overrides: object):
    return table_settings(ORDERS, destination="http", url=sink.url, retry=SMALL_RETRY, **overrides)


def relay(db_url: str, settings, sink, **kwargs: object) -> Relay:
    return Relay(db_url, settings, HttpDestination(sink.url, timeout_s=2), worker_id="test-relay", **kwargs)


def run_once(db_url: str, sink, **overrides: object):
    r = relay(db_url, orders_settings(sink, **overrides), sink)
    try:
        return r.run(once=True, max_seconds=30)
    finally:
        r.destination.close()


def rows(conn) -> dict[str, dict]:
    found = conn.execute(
        f"""SELECT event_id, status, attempts, last_error, last_error_code, result_ref, published_at,
                   extract(epoch FROM available_at - now())::float8 AS due_in_s
            FROM {ORDERS} ORDER BY id"""
    ).fetchall()
    return {row["event_id"]: row for row in found}


def audit_codes(conn, event_id: str) -> list[str]:
    found = conn.execute(
        "SELECT code FROM outbox_audit WHERE outbox_table = %s AND event_id = %s ORDER BY id", (ORDERS, event_id)
    ).fetchall()
    return [row["code"] for row in found]


def test_relay_retries_a_5xx_then_sends(conn, db_url, http_sink):
    [key] = enqueue(conn, "order-1")
    http_sink.script = lambda k, attempt, body: (503, {}, b"broker restarting") if attempt == 1 else None

    report = run_once(db_url, http_sink)
    assert (report.claimed, report.retried, report.sent) == (1, 1, 0)
    row = rows(conn)[key]
    assert (row["status"], row["attempts"], row["last_error_code"]) == ("pending", 1, "BROKER_5XX")
    assert "503" in row["last_error"]
    assert row["due_in_s"] == pytest.approx(60, abs=5)  # base 60 s, no jitter, in database time

    run_once(db_url, http_sink)  # not due yet: nothing happens
    assert rows(conn)[key]["attempts"] == 1

    make_due(conn, ORDERS)
    report = run_once(db_url, http_sink)
    assert report.sent == 1
    row = rows(conn)[key]
    assert (row["status"], row["attempts"], row["last_error_code"], row["last_error"]) == ("sent", 2, None, None)
    assert row["result_ref"] == f"ref-{key}"
    assert row["published_at"] is not None
    assert http_sink.keys() == [key, key]
    assert audit_codes(conn, key) == [
        "outbox_claim",
        "outbox_flush_retry",
        "outbox_claim",
        "outbox_flush_success",
    ]


def test_a_400_poison_pill_is_dead_after_one_attempt_and_never_blocks_the_rest(conn, db_url, http_sink):
    keys = enqueue(conn, "o-1", "o-2", "poison", "o-3", "o-4")
    http_sink.script = lambda k, attempt, body: (400, JSON, b'{"error": "qty invalid"}') if k == "poison" else None

    report = run_once(db_url, http_sink, batch_size=2)
    assert (report.sent, report.dead, report.dead_by_code) == (4, 1, {"BAD_REQUEST": 1})
    found = rows(conn)
    assert {k: found[k]["status"] for k in keys} == {
        "o-1": "sent",
        "o-2": "sent",
        "poison": "dead",
        "o-3": "sent",
        "o-4": "sent",
    }
    assert (found["poison"]["attempts"], found["poison"]["last_error_code"]) == (1, "BAD_REQUEST")
    assert "qty invalid" in found["poison"]["last_error"]
    assert audit_codes(conn, "poison") == ["outbox_claim", "outbox_flush_dead"]

    make_due(conn, ORDERS)
    run_once(db_url, http_sink)
    assert http_sink.counts["poison"] == 1  # dead is final: never delivered again
    assert rows(conn)["poison"]["attempts"] == 1


@pytest.mark.parametrize(
    ("status", "body", "final", "code"),
    [
        (401, b"", "dead", "UNAUTHORIZED"),
        (422, b'{"error": "invalid order"}', "dead", "BAD_REQUEST"),
        (409, b'{"error": "already processed", "order_id": "B-77"}', "sent", "CONFLICT_PROCESSED"),
    ],
)
def test_relay_settles_final_answers_in_one_attempt(conn, db_url, http_sink, status, body, final, code):
    [key] = enqueue(conn, "order-x")
    http_sink.script = lambda k, attempt, request_body: (status, JSON, body)
    run_once(db_url, http_sink)
    row = rows(conn)[key]
    assert (row["status"], row["attempts"], row["last_error_code"]) == (final, 1, code)
    expected_audit = "outbox_flush_success" if final == "sent" else "outbox_flush_dead"
    assert audit_codes(conn, key) == ["outbox_claim", expected_audit]
    if final == "sent":
        assert row["result_ref"] == "B-77"


def test_429_retry_after_sets_available_at_in_database_time(conn, db_url, http_sink):
    [key] = enqueue(conn, "order-rl")
    http_sink.script = lambda k, attempt, body: (429, {"Retry-After": "30"}, b"rate limited")
    # The relay holds the whole table after a 429; stop it as soon as the batch is settled.
    stop_when_settled = lambda report: report.settled and r.request_stop()  # noqa: E731
    r = relay(db_url, orders_settings(http_sink), http_sink, progress=stop_when_settled, progress_every_s=0.0)
    try:
        report = r.run(max_seconds=10)
    finally:
        r.destination.close()
    assert (report.retried, report.rate_limited, report.stopped_because) == (1, 1, "stop requested")
    row = rows(conn)[key]
    # throttling spends no attempt: the retry budget is for failures of the message itself
    assert (row["status"], row["attempts"], row["last_error_code"]) == ("pending", 0, "RATE_LIMITED")
    # Retry-After (30 s), not the table's backoff (60 s), measured with the database's clock.
    assert 25 <= row["due_in_s"] <= 30.5
    assert audit_codes(conn, key) == ["outbox_claim", "outbox_flush_retry"]


def test_429_holds_the_whole_table(conn, db_url, http_sink):
    enqueue(conn, "first", "second")
    http_sink.script = lambda k, attempt, body: (429, {"Retry-After": "30"}, b"")
    r = relay(db_url, orders_settings(http_sink, batch_size=1), http_sink)
    try:
        report = r.run(max_seconds=1.0)
    finally:
        r.destination.close()
    assert (report.claimed, report.rate_limited) == (1, 1)
    assert http_sink.keys() == ["first"]
    assert (rows(conn)["second"]["status"], rows(conn)["second"]["attempts"]) == ("pending", 0)
    # If the relay had already claimed "second" (it pipelines network deliveries), it gave it back unsent.
    assert set(audit_codes(conn, "second")) <= {"outbox_claim", "outbox_release"}


def test_garbage_answers_retry_then_go_dead_with_the_reason(conn, db_url, http_sink):
    [key] = enqueue(conn, "order-g")
    http_sink.script = lambda k, attempt, body: (200, JSON, b"<html>gateway says hi</html>")

    for attempt, backoff in [(1, 60), (2, 120)]:
        run_once(db_url, http_sink)
        row = rows(conn)[key]
        assert (row["status"], row["attempts"], row["last_error_code"]) == ("pending", attempt, "UNKNOWN")
        assert row["due_in_s"] == pytest.approx(backoff, abs=5)
        make_due(conn, ORDERS)

    report = run_once(db_url, http_sink)
    assert report.dead_by_code == {"UNKNOWN": 1}
    row = rows(conn)[key]
    assert (row["status"], row["attempts"], row["last_error_code"]) == ("dead", 3, "UNKNOWN")
    assert "gave up after 3 of 3 attempts" in row["last_error"]
    assert "not the JSON it declares" in row["last_error"]
    assert http_sink.keys() == [key] * 3
    assert audit_codes(conn, key) == [
        "outbox_claim",
        "outbox_flush_retry",
        "outbox_claim",
        "outbox_flush_retry",
        "outbox_claim",
        "outbox_flush_dead",
    ]


def test_an_unreachable_broker_keeps_messages_pending(conn, db_url):
    keys = enqueue(conn, "o-1", "o-2")
    settings = table_settings(ORDERS, destination="http", url=f"http://127.0.0.1:{free_port()}/", retry=SMALL_RETRY)
    r = Relay(db_url, settings, HttpDestination(settings.url, timeout_s=1), worker_id="test-relay")
    try:
        report = r.run(once=True, max_seconds=30)
    finally:
        r.destination.close()
    assert report.retried == 2
    found = rows(conn)
    assert [(found[k]["status"], found[k]["last_error_code"]) for k in keys] == [("pending", "CONNECTION_REFUSED")] * 2


def test_audit_rows_record_every_transition(conn, db_url, http_sink):
    enqueue(conn, "ok", "bad", "flaky")
    http_sink.script = lambda k, attempt, body: (
        (400, {}, b"nope") if k == "bad" else (502, {}, b"") if k == "flaky" and attempt == 1 else None
    )
    run_once(db_url, http_sink)
    make_due(conn, ORDERS)
    run_once(db_url, http_sink)
    transitions = conn.execute(
        """SELECT event_id, from_status, to_status, attempts, code, error_code, worker
           FROM outbox_audit WHERE outbox_table = %s ORDER BY id""",
        (ORDERS,),
    ).fetchall()
    by_event: dict[str, list[tuple]] = {}
    for t in transitions:
        assert t["worker"] == "test-relay"
        by_event.setdefault(t["event_id"], []).append(
            (t["from_status"], t["to_status"], t["attempts"], t["code"], t["error_code"])
        )
    assert by_event == {
        "ok": [("pending", "sending", 1, "outbox_claim", None), ("sending", "sent", 1, "outbox_flush_success", None)],
        "bad": [
            ("pending", "sending", 1, "outbox_claim", None),
            ("sending", "dead", 1, "outbox_flush_dead", "BAD_REQUEST"),
        ],
        "flaky": [
            ("pending", "sending", 1, "outbox_claim", None),
            ("sending", "pending", 1, "outbox_flush_retry", "BROKER_5XX"),
            ("pending", "sending", 2, "outbox_claim", None),
            ("sending", "sent", 2, "outbox_flush_success", None),
        ],
    }
