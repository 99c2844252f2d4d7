"""One order, one trace: POST /do/order → outbox row → relay process → broker.

The API runs here with an in-memory span exporter; the relay runs as its own process and
exports over OTLP/HTTP (configured only by OTEL_* variables) to a collector on loopback that
decodes the protobuf. The relay's ``send`` span must be the child of ``do.order`` (the order's creation
context) across the process boundary and link to it, and the broker must receive that context unchanged.
"""

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from outbox_pipelines_tests.api.conftest import order, post_order
from outbox_pipelines_tests.helpers import rows

KEY = "01JTRACE-0RDER-2-BROKER"


class Collector:
    """An OTLP/HTTP traces endpoint: keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list = []
        spans = self.spans

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for resource_spans in request.resource_spans:
                    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                    for scope_spans in resource_spans.scope_spans:
                        for span in scope_spans.spans:
                            spans.append((service.get("service.name"), span))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def collector() -> Iterator[Collector]:
    found = Collector()
    yield found
    found.stop()


def test_one_trace_from_the_post_to_the_broker(start_api, conn, cli_env, http_sink, collector):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    api = start_api(tracer_provider=provider)
    with api.client() as client:
        assert post_order(client, order(KEY)).status_code == 201
    [do_order] = [s for s in exporter.get_finished_spans() if s.name == "do.order"]
    trace_id, api_span_id = do_order.context.trace_id, do_order.context.span_id

    env = {
        **cli_env,
        "OUTBOX_BROKER_URL": http_sink.url + "orders",
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
        "OTEL_SERVICE_NAME": "relay-under-test",
    }
    done = subprocess.run(
        [sys.executable, "-m", "outbox_pipelines.cli", "relay", "--table", "outbox_orders", "--once", "--quiet"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert [r["status"] for r in rows(conn, "outbox_orders")] == ["sent"]

    deadline = time.monotonic() + 10  # the relay flushes its spans on exit; the collector may lag a moment
    while time.monotonic() < deadline and not any(s.name.startswith("send ") for _, s in collector.spans):
        time.sleep(0.05)
    sends = [s for service, s in collector.spans if s.name.startswith("send ")]
    assert len(sends) == 1, [s.name for _, s in collector.spans]
    [send] = sends
    # the child of do.order, across the process boundary
    assert int.from_bytes(send.trace_id, "big") == trace_id
    assert int.from_bytes(send.parent_span_id, "big") == api_span_id
    assert send.name == "send order.submitted"
    assert [int.from_bytes(link.span_id, "big") for link in send.links] == [api_span_id]
    attributes = {a.key: a.value for a in send.attributes}
    assert attributes["outbox.table"].string_value == "outbox_orders"
    assert attributes["outbox.outcome"].string_value == "sent"
    assert attributes["messaging.operation.type"].string_value == "send"
    assert {service for service, _ in collector.spans} == {"relay-under-test"}
    assert {"outbox.claim", "outbox.settle"} <= {s.name for _, s in collector.spans}
    # the broker received the order's creation context unchanged: its own spans continue the trace from do.order
    [received] = http_sink.received
    traceparent = received.headers.get("traceparent") or received.headers.get("Traceparent")
    assert traceparent is not None and traceparent.split("-")[1:3] == [f"{trace_id:032x}", f"{api_span_id:016x}"]
