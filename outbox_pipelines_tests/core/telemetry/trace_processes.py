"""The processes of the end-to-end trace test (test_trace_end_to_end.py), each with an OpenTelemetry SDK whose spans
go to a JSON-lines file: a producer (sync or async) that enqueues inside a request span, and a consumer per
destination kind that continues each message's trace in a ``process {destination}`` span, as docs/how-to/traces.md
shows.

How a process gets its SDK: ``sitecustomize(dir)`` writes a ``sitecustomize.py`` that calls ``install_from_env``;
with that directory first on PYTHONPATH, every Python process started with ``TRACE_SPANS_DIR`` set (the producers,
the real ``outbox-pipelines relay``, the consumers) installs a TracerProvider exporting each span, as it ends, to
``$TRACE_SPANS_DIR/<service>-<pid>.jsonl``. The relay's own ``configure_from_env`` then finds a provider installed
and leaves it.

Run: python -m outbox_pipelines_tests.core.telemetry.trace_processes produce sync|async TABLE...
     python -m outbox_pipelines_tests.core.telemetry.trace_processes consume http|kafka|rabbitmq|nats COUNT
"""

import asyncio
import json
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

TOPIC = "order.created"
SPANS_DIR = "TRACE_SPANS_DIR"
SERVICE = "TRACE_SERVICE"


class JsonLinesExporter(SpanExporter):
    """Each span as one JSON line: what the test asserts on (ids in hex, as a traceparent writes them)."""

    def __init__(self, path: Path, service: str) -> None:
        self.path = path
        self.service = service
        self.lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for span in spans:
            ctx = span.get_span_context()
            assert ctx is not None
            lines.append(
                json.dumps(
                    {
                        "service": self.service,
                        "name": span.name,
                        "kind": span.kind.name,
                        "trace_id": f"{ctx.trace_id:032x}",
                        "span_id": f"{ctx.span_id:016x}",
                        "parent": f"{span.parent.span_id:016x}" if span.parent else None,
                        "links": [
                            {
                                "trace_id": f"{link.context.trace_id:032x}",
                                "span_id": f"{link.context.span_id:016x}",
                                "attributes": dict(link.attributes or {}),
                            }
                            for link in span.links
                        ],
                        "attributes": dict(span.attributes or {}),
                        "status": span.status.status_code.name,
                    }
                )
            )
        with self.lock, self.path.open("a") as out:
            out.write("".join(line + "\n" for line in lines))
        return SpanExportResult.SUCCESS


def install_from_env() -> None:
    """Install the SDK, spans to ``$TRACE_SPANS_DIR`` (nothing when it is unset)."""
    where = os.environ.get(SPANS_DIR)
    if not where:
        return
    service = os.environ.get(SERVICE, "unnamed")
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(
        SimpleSpanProcessor(JsonLinesExporter(Path(where) / f"{service}-{os.getpid()}.jsonl", service))
    )
    trace.set_tracer_provider(provider)


def sitecustomize(directory: Path) -> Path:
    """A directory holding a ``sitecustomize.py`` that installs the SDK: put it first on PYTHONPATH."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(
        "from outbox_pipelines_tests.core.telemetry.trace_processes import install_from_env\n\ninstall_from_env()\n"
    )
    return directory


def read_spans(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in sorted(directory.glob("*.jsonl")) for line in path.read_text().splitlines()]


# -- the consumers: docs/how-to/traces.md, "Continue the trace in a consumer" ---------------------------------

tracer = trace.get_tracer("shipping")


def process_span(destination: str, carrier: Mapping[str, str]) -> AbstractContextManager[trace.Span]:
    """The CONSUMER span of one message: the child of its creation context, and linked to it."""
    context = propagate.extract(carrier)
    created = trace.get_current_span(context).get_span_context()
    links = [trace.Link(created)] if created.is_valid else []
    return tracer.start_as_current_span(
        f"process {destination}", context=context, kind=trace.SpanKind.CONSUMER, links=links,
        attributes={"messaging.operation.type": "process", "messaging.destination.name": destination},
    )  # fmt: skip


def consume_http(count: int) -> None:
    seen: list[int] = []

    class Receiver(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with process_span(TOPIC, dict(self.headers.items())):
                pass
            # Counted once its span has ended (and been written): a batch's messages come on concurrent requests,
            # and the last one counted stops the server, daemon threads and all.
            seen.append(1)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            if len(seen) >= count:
                threading.Thread(target=server.shutdown).start()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Receiver)
    server.serve_forever()


def consume_kafka(count: int) -> None:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {"bootstrap.servers": os.environ["KAFKA_BOOTSTRAP"], "group.id": "traces", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([os.environ["KAFKA_TOPIC"]])
    seen = 0
    try:
        while seen < count:
            for record in consumer.consume(10, timeout=0.5):
                if record.error() is not None:
                    continue
                carrier: dict[str, str] = {}
                for name, value in record.headers() or []:
                    if value is not None:
                        carrier.setdefault(name, value.decode())  # the first of a name wins
                with process_span(record.topic() or "", carrier):
                    seen += 1
    finally:
        consumer.close()


async def consume_rabbitmq(count: int) -> None:
    import aiormq

    done = asyncio.Event()
    seen: list[int] = []
    broker = await aiormq.connect(os.environ["AMQP_URL"])
    channel = await broker.channel()

    async def on_message(message: Any) -> None:
        headers = message.header.properties.headers or {}
        carrier = {k: v.decode() if isinstance(v, bytes) else str(v) for k, v in headers.items()}
        with process_span(f"{message.delivery.exchange}:{message.delivery.routing_key}", carrier):
            seen.append(1)
        if len(seen) >= count:
            done.set()

    await channel.basic_consume(os.environ["AMQP_QUEUE"], on_message, no_ack=True)
    await done.wait()
    await broker.close()


async def consume_nats(count: int) -> None:
    import nats

    nc = await nats.connect(os.environ["NATS_URL"])
    subscription = await nc.jetstream().pull_subscribe_bind(
        durable=os.environ["NATS_DURABLE"], stream=os.environ["NATS_STREAM"]
    )
    seen = 0
    while seen < count:
        try:
            batch = await subscription.fetch(10, timeout=0.5)
        except TimeoutError:
            continue
        for msg in batch:
            with process_span(msg.subject, msg.headers or {}):
                seen += 1
            await msg.ack()
    await nc.close()


# -- the producers ---------------------------------------------------------------------------------------------


def produce_sync(tables: list[str]) -> None:
    """One request: one message in each table, in one transaction."""
    import psycopg

    from outbox_pipelines import Message, Outbox

    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        with trace.get_tracer("shop").start_as_current_span("POST /orders", kind=trace.SpanKind.SERVER):
            with conn.transaction():
                for table in tables:
                    Outbox(table).enqueue(conn, Message(topic=TOPIC, payload={"table": table}))


async def produce_async(tables: list[str]) -> None:
    """One request: two messages in each table, in one transaction."""
    import psycopg

    from outbox_pipelines import Message, Outbox

    async with await psycopg.AsyncConnection.connect(os.environ["DATABASE_URL"]) as conn:
        with trace.get_tracer("shop").start_as_current_span("POST /orders/batch", kind=trace.SpanKind.SERVER):
            async with conn.transaction():
                for table in tables:
                    messages = [Message(topic=TOPIC, payload={"table": table, "n": n}) for n in range(2)]
                    await Outbox(table).enqueue_many_async(conn, messages)


def main(args: list[str]) -> None:
    role, what, *rest = args
    if role == "produce":
        if what == "sync":
            produce_sync(rest)
        else:
            asyncio.run(produce_async(rest))
        return
    count = int(rest[0])
    if what == "http":
        consume_http(count)
    elif what == "kafka":
        consume_kafka(count)
    elif what == "rabbitmq":
        asyncio.run(consume_rabbitmq(count))
    else:
        asyncio.run(consume_nats(count))


if __name__ == "__main__":
    main(sys.argv[1:])
