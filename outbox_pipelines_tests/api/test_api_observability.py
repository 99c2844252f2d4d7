"""Seed 001 §7 for the Order API: one log line per request, no PII in any log, the do.order span.

- Every request to /do/order gives exactly one line with trace_id,
  idempotency_key, status, reason_code and latency_ms, rejections included
  (401, 409, 413, 415, 422, 429) and routing errors too.
- No order field and no token reaches any log record, at any level, from any
  logger (the app's, uvicorn's, SQLAlchemy's, psycopg's).
- POST /do/order runs in a ``do.order`` span (in-memory exporter) whose W3C
  traceparent is stored in the accepted order's outbox headers, for the relay's
  broker-send span to be its child.
"""

import json
import logging
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from outbox_pipelines.orders.api import tracing
from outbox_pipelines_tests.api.conftest import order, post_order, post_raw
from outbox_pipelines_tests.helpers import rows

KEY = "01JABCXYZ-ULID-5678"
TOKEN = "tok-observability-7d1c"
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")


@pytest.fixture
def all_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every record of every logger at DEBUG, uvicorn's (which do not propagate) and SQLAlchemy's (WARNING
    unless an operator turns it up, as here: it would log statements and their parameters) included."""
    caplog.set_level(logging.DEBUG)
    for name in ("sqlalchemy", "sqlalchemy.engine", "sqlalchemy.pool", "psycopg"):
        caplog.set_level(logging.DEBUG, logger=name)  # restored by caplog at teardown
    yield caplog
    for name in UVICORN_LOGGERS:
        logging.getLogger(name).removeHandler(caplog.handler)


def capture_uvicorn(caplog: pytest.LogCaptureFixture) -> None:
    """After the server started (its Config re-applies uvicorn's logging config)."""
    for name in UVICORN_LOGGERS:
        logging.getLogger(name).addHandler(caplog.handler)
        logging.getLogger(name).setLevel(logging.DEBUG)


def request_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "outbox_pipelines.orders.api"]


# -- one line per request --------------------------------------------------------------------------
def test_one_log_line_per_request_with_the_seed_fields_rejections_included(start_api, all_logs):
    api = start_api(tokens=(TOKEN,), rate_per_minute=9, max_body_bytes=1024)
    with api.client(TOKEN) as client, api.client() as anonymous:
        big = order(KEY, tags=["t" * 32] * 16, order_id="o" * 64)
        big["pad"] = "p" * 2000
        cases = [
            (lambda: post_order(client, order(KEY), X_Trace_Id="trace-given-1"), 201, "OK", KEY),
            (lambda: post_order(client, order(KEY)), 200, "OK", KEY),
            (lambda: post_order(client, order(KEY, qty=0.5)), 409, "IDEMPOTENCY_CONFLICT", KEY),
            (lambda: post_order(client, order(KEY), key="other-key"), 422, "IDEMPOTENCY_MISMATCH", "other-key"),
            (lambda: post_order(client, order("k-bad", qty=-1)), 422, "VALIDATION_ERROR", "k-bad"),
            (
                lambda: post_raw(client, b"qty=1", key="k-form", content_type="application/x-www-form-urlencoded"),
                415,
                "UNSUPPORTED_MEDIA_TYPE",
                "k-form",
            ),
            (lambda: post_order(client, big), 413, "PAYLOAD_TOO_LARGE", KEY),
            (lambda: client.get(f"/do/order/{KEY}"), 200, "OK", KEY),
            (lambda: client.get("/do/order/k-unknown"), 404, "NOT_FOUND", "k-unknown"),
            (lambda: post_order(client, order("k-over")), 429, "RATE_LIMITED", "k-over"),  # the 10th: over 9/min
            (lambda: post_order(anonymous, order("k-anon")), 401, "UNAUTHORIZED", "k-anon"),
            (lambda: anonymous.get("/nowhere"), 404, "NOT_FOUND", ""),
            (lambda: client.delete(f"/do/order/{KEY}"), 405, "METHOD_NOT_ALLOWED", ""),
        ]
        for send, status, reason_code, key in cases:
            all_logs.clear()
            response = send()
            assert response.status_code == status, response.text
            lines = request_lines(all_logs)
            assert len(lines) == 1, (status, [r.getMessage() for r in lines])
            [line] = lines
            assert (line.status, line.reason_code, line.idempotency_key) == (status, reason_code, key)
            assert isinstance(line.latency_ms, float) and line.latency_ms >= 0
            message = line.getMessage()
            for field in ("status=", "reason_code=", "trace_id=", "idempotency_key=", "latency_ms="):
                assert field in message, message
            assert line.levelno == logging.INFO
            if line.route.startswith("/do/order"):
                assert line.trace_id and response.headers["x-trace-id"] == line.trace_id
        # A healthy /healthz or /metrics scrape is not logged; the app's own lines are all there is.
        all_logs.clear()
        assert client.get("/healthz").status_code == 200 and client.get("/metrics").status_code == 200
        assert request_lines(all_logs) == []


def test_the_given_trace_id_is_kept_and_a_hostile_one_replaced(client, conn, all_logs):
    answer = post_order(client, order(KEY), X_Trace_Id="trace-from-client.01")
    assert answer.headers["x-trace-id"] == "trace-from-client.01"
    replaced = post_order(client, order("k-2"), X_Trace_Id="a b\tc{}").headers["x-trace-id"]
    assert replaced.startswith("do-") and rows(conn, "outbox_orders")[1]["headers"]["trace_id"] == replaced


# -- no PII ----------------------------------------------------------------------------------------
MARKERS = ("ordPIIMARKERa1", "tagPIIMARKERb2", "MRKPIIC3", "tagPIIMARKERd4", "riskPIIMARKER")


def test_no_order_field_and_no_token_reaches_any_log(start_api, conn, all_logs, monkeypatch):
    monkeypatch.setenv("OUTBOX_INSTRUMENTS", "USDJPY,MRKPIIC3")  # a marker as an allowed instrument
    api = start_api(tokens=(TOKEN,), max_body_bytes=4096)
    capture_uvicorn(all_logs)
    body = order(KEY, order_id=MARKERS[0], tags=[MARKERS[1], "x"], instrument=MARKERS[2])
    with api.client(TOKEN) as client, api.client(f"wrong-{TOKEN}") as wrong:
        assert post_order(client, body).status_code == 201
        assert post_order(client, body).status_code == 200
        assert post_order(client, {**body, "tags": [MARKERS[3]]}).status_code == 409
        # Rejected for its content: the violations name fields and values in the answer, never in a log.
        invalid = {
            **body,
            "idempotency_key": "k-invalid",
            "tags": [MARKERS[3] * 3],
            "qty": "lots",
            "risk_constraints": {"max_dd": MARKERS[4]},
        }
        assert post_order(client, invalid).status_code == 422
        assert post_order(client, {**body, "note": MARKERS[4] * 200}).status_code in (413, 422)
        assert post_raw(client, json.dumps(body).encode()[:-3], key=KEY).status_code == 400
        assert post_order(wrong, body).status_code == 401
        assert client.get(f"/do/order/{KEY}").status_code == 200
    assert rows(conn, "outbox_orders")[0]["payload"]["order_id"] == MARKERS[0]  # the markers did get in

    assert request_lines(all_logs), "the requests were logged"
    assert any(r.name.startswith("sqlalchemy.engine") for r in all_logs.records), "SQLAlchemy was heard too"
    for record in all_logs.records:
        text = " ".join([record.getMessage(), repr(record.__dict__), record.exc_text or ""])
        for secret in (*MARKERS, TOKEN):
            assert secret not in text, (record.name, record.levelname, text[:500])


# -- tracing ---------------------------------------------------------------------------------------
@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def do_order_spans(exporter: InMemorySpanExporter) -> list:
    return [s for s in exporter.get_finished_spans() if s.name == "do.order"]


def test_do_order_span_and_its_traceparent_in_the_outbox_headers(start_api, conn, spans):
    provider, exporter = spans
    api = start_api(tracer_provider=provider)
    with api.client() as client:
        created = post_order(client, order(KEY))
        assert created.status_code == 201
        [span] = do_order_spans(exporter)
        assert span.kind == trace.SpanKind.SERVER and span.parent is None
        assert dict(span.attributes) == {
            "http.request.method": "POST",
            "http.route": "/do/order",
            "http.response.status_code": 201,
            "order.reason_code": "OK",
            "order.trace_id": f"{span.context.trace_id:032x}",
            "order.idempotency_key": KEY,
        }
        [row] = rows(conn, "outbox_orders")
        traceparent = row["headers"]["traceparent"]
        flags = f"{int(span.context.trace_flags):02x}"
        assert traceparent == f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-{flags}"
        assert int(flags, 16) & 1  # sampled
        # Without an X-Trace-Id, the trace id is the span's: logs, ledger headers and traces line up.
        assert created.headers["x-trace-id"] == row["headers"]["trace_id"] == f"{span.context.trace_id:032x}"

        exporter.clear()
        assert post_order(client, order(KEY)).status_code == 200
        assert post_order(client, order(KEY, qty=0.5)).status_code == 409
        assert post_order(client, order("k-bad", side="HOLD")).status_code == 422
        replay, conflict, invalid = do_order_spans(exporter)
        assert [
            (s.attributes["http.response.status_code"], s.attributes["order.reason_code"])
            for s in (replay, conflict, invalid)
        ] == [(200, "OK"), (409, "IDEMPOTENCY_CONFLICT"), (422, "VALIDATION_ERROR")]
        assert rows(conn, "outbox_orders") == [row]  # the replay did not rewrite the stored traceparent


def test_a_client_traceparent_makes_do_order_its_child(start_api, conn, spans):
    provider, exporter = spans
    api = start_api(tracer_provider=provider)
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with api.client() as client:
        assert post_order(client, order(KEY), traceparent=parent).status_code == 201
    [span] = do_order_spans(exporter)
    assert span.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert span.parent is not None and span.parent.span_id == 0xB7AD6B7169203331
    stored = rows(conn, "outbox_orders")[0]["headers"]["traceparent"]
    assert stored.startswith(f"00-0af7651916cd43dd8448eb211c80319c-{span.context.span_id:016x}-")


def test_without_a_tracer_nothing_is_traced_and_no_traceparent_is_stored(client, conn):
    assert post_order(client, order(KEY)).status_code == 201
    assert "traceparent" not in rows(conn, "outbox_orders")[0]["headers"]


def test_otlp_export_is_configured_only_when_the_otel_variables_ask_for_it():
    assert tracing.configure_from_env({}, install=False) is None
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert tracing.configure_from_env({**endpoint, "OTEL_SDK_DISABLED": "true"}, install=False) is None
    assert tracing.configure_from_env({**endpoint, "OTEL_TRACES_EXPORTER": "none"}, install=False) is None
    provider = tracing.configure_from_env({**endpoint, "OTEL_SERVICE_NAME": "orders-eu"}, install=False)
    try:
        assert isinstance(provider, TracerProvider)
        assert provider.resource.attributes["service.name"] == "orders-eu"
    finally:
        provider.shutdown()
    provider = tracing.configure_from_env(endpoint, install=False)
    try:
        assert provider.resource.attributes["service.name"] == tracing.DEFAULT_SERVICE_NAME
    finally:
        provider.shutdown()
