"""The creation context at enqueue: inside the application's span, each message gets a ``create {topic}`` span
(PRODUCER, its child) whose W3C context is stored in the row's headers; a message that carries its own
``traceparent`` keeps it; a sampled-out parent's context is stored as it is; no span, nothing stored. On every
enqueue path: one row and a batch (INSERT and COPY), psycopg and asyncpg on asyncio, Django's connection."""

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import asyncpg
import psycopg
import pytest
from opentelemetry import baggage, context, trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.errors import ConfigError, InvalidMessage, NoTransaction
from outbox_pipelines.core.storage.db import sqlalchemy_url
from outbox_pipelines.core.telemetry.creation import create_spans_enabled
from outbox_pipelines_tests.core.test_enqueue_django import _django_settings

TABLE = "outbox_events"
# A caller's remote parent (an incoming request's headers), with a vendor's tracestate.
INCOMING = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "vendor=abc"}


class Traces:
    """An SDK provider (not the global one: the Outbox and the request are given it) and what it exported."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("test.app")

    def outbox(self, **options: Any) -> Outbox:
        return Outbox(TABLE, tracer_provider=self.provider, **options)

    def request(self) -> Any:
        """The application's request span, child of INCOMING."""
        return self.tracer.start_as_current_span(
            "POST /orders", context=TraceContextTextMapPropagator().extract(INCOMING)
        )

    def creates(self) -> list[ReadableSpan]:
        return [span for span in self.exporter.get_finished_spans() if span.name.startswith("create ")]

    def only(self, name: str) -> ReadableSpan:
        [span] = [span for span in self.exporter.get_finished_spans() if span.name == name]
        return span


@pytest.fixture
def traces() -> Iterator[Traces]:
    found = Traces()
    yield found
    found.provider.shutdown()


def headers_of(conn: Any, event_id: str) -> dict[str, Any]:
    return conn.execute(f"SELECT headers FROM {TABLE} WHERE event_id = %s", (event_id,)).fetchone()["headers"]


def parts(traceparent: str) -> tuple[int, int, str]:
    """(trace id, parent span id, flags) of a traceparent."""
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00"
    return int(trace_id, 16), int(span_id, 16), flags


def assert_stored_context_is(conn: Any, event_id: str, span: ReadableSpan) -> dict[str, Any]:
    headers = headers_of(conn, event_id)
    assert parts(headers["traceparent"]) == (span.context.trace_id, span.context.span_id, "01")
    assert headers["tracestate"] == "vendor=abc"
    return headers


def test_a_request_span_gets_a_create_span_whose_context_is_stored(db_url, conn, traces):
    outbox = traces.outbox()
    with psycopg.connect(db_url) as tx, traces.request() as request:
        # Baggage of the application's context stays out of the table.
        token = context.attach(baggage.set_baggage("user.id", "u-42"))
        try:
            result = outbox.enqueue(
                tx,
                Message(
                    topic="org.changed", payload={"n": 1}, event_id="e-1", ordering_key="org-1", headers={"x": "1"}
                ),
            )
        finally:
            context.detach(token)
        tx.commit()
    [create] = traces.creates()
    assert create.name == "create org.changed"
    assert create.kind is SpanKind.PRODUCER
    assert create.parent.span_id == request.get_span_context().span_id
    assert create.context.trace_id == request.get_span_context().trace_id == int(INCOMING["traceparent"][3:35], 16)
    assert dict(create.attributes) == {
        "messaging.system": "outbox",
        "messaging.operation.name": "create",
        "messaging.operation.type": "create",
        "messaging.destination.name": "org.changed",
        "messaging.message.id": "e-1",
        "outbox.table": TABLE,
        "outbox.ordering_key.present": True,
        "outbox.duplicate": False,
    }
    assert create.status.status_code is StatusCode.UNSET
    headers = assert_stored_context_is(conn, "e-1", create)
    assert set(headers) == {"x", "traceparent", "tracestate"}
    assert result.duplicate is False


def test_a_duplicate_keeps_the_first_context_and_says_so_on_its_span(db_url, conn, traces):
    outbox = traces.outbox(messaging_system="kafka")
    for _ in range(2):
        with psycopg.connect(db_url) as tx, traces.request():
            outbox.enqueue(tx, Message(topic="t", payload={"n": 1}, event_id="same"))
            tx.commit()
    first, second = traces.creates()
    assert (first.attributes["outbox.duplicate"], second.attributes["outbox.duplicate"]) == (False, True)
    assert first.attributes["messaging.system"] == "kafka"
    assert first.attributes["outbox.ordering_key.present"] is False
    assert_stored_context_is(conn, "same", first)


def test_a_message_with_its_own_traceparent_keeps_it_and_gets_no_create_span(db_url, conn, traces):
    own = {"traceparent": "00-11111111111111111111111111111111-2222222222222222-01", "tracestate": "mine=1"}
    with psycopg.connect(db_url) as tx, traces.request():
        traces.outbox().enqueue(tx, Message(topic="t", payload={}, event_id="custom", headers=own))
        tx.commit()
    assert traces.creates() == []
    assert headers_of(conn, "custom") == own


def test_without_a_current_span_nothing_is_added(db_url, conn, traces):
    with psycopg.connect(db_url) as tx:
        traces.outbox().enqueue(tx, Message(topic="t", payload={}, event_id="plain", headers={"x": "1"}))
        traces.outbox().enqueue_many(tx, [Message(topic="t", payload={}, event_id=f"m-{n}") for n in range(25)])
        tx.commit()
    assert traces.exporter.get_finished_spans() == ()
    assert headers_of(conn, "plain") == {"x": "1"}
    assert headers_of(conn, "m-3") == {}


def test_a_sampled_out_parent_is_stored_as_it_is_without_a_span(db_url, conn, traces):
    parent = SpanContext(0xABC, 0xDEF, is_remote=False, trace_flags=TraceFlags(0))
    with psycopg.connect(db_url) as tx, trace.use_span(NonRecordingSpan(parent)):
        traces.outbox().enqueue(tx, Message(topic="t", payload={}, event_id="sampled-out"))
        tx.commit()
    assert traces.creates() == []
    assert headers_of(conn, "sampled-out") == {"traceparent": f"00-{0xABC:032x}-{0xDEF:016x}-00"}


def test_create_spans_off_stores_the_parents_context(db_url, conn, traces, monkeypatch):
    monkeypatch.setenv("OUTBOX_TRACE_CREATE", "off")
    outbox = traces.outbox()
    with psycopg.connect(db_url) as tx, traces.request() as request:
        outbox.enqueue_many(tx, [Message(topic="t", payload={}, event_id=f"off-{n}") for n in range(3)])
        tx.commit()
    assert traces.creates() == []
    parent = traces.only("POST /orders")
    assert parent.context.span_id == request.get_span_context().span_id
    assert_stored_context_is(conn, "off-2", parent)


def test_the_switch_takes_on_or_off_only():
    assert create_spans_enabled({}) is True
    assert create_spans_enabled({"OUTBOX_TRACE_CREATE": "OFF"}) is False
    with pytest.raises(ConfigError, match="OUTBOX_TRACE_CREATE='sometimes': use on or off"):
        create_spans_enabled({"OUTBOX_TRACE_CREATE": "sometimes"})


@pytest.mark.parametrize("size", [5, 30], ids=["insert", "copy"])
def test_enqueue_many_gives_each_message_its_create_span(db_url, conn, traces, size):
    with psycopg.connect(db_url) as tx, traces.request():
        traces.outbox().enqueue_many(tx, [Message(topic=f"t.{n % 2}", payload={"n": n}) for n in range(size)])
        tx.commit()
    creates = traces.creates()
    assert len(creates) == size
    by_id = {span.attributes["messaging.message.id"]: span for span in creates}
    stored = conn.execute(f"SELECT event_id, topic FROM {TABLE}").fetchall()
    assert {row["event_id"] for row in stored} == set(by_id)
    for row in stored:
        assert by_id[row["event_id"]].name == f"create {row['topic']}"
        assert_stored_context_is(conn, row["event_id"], by_id[row["event_id"]])


def test_a_batch_that_falls_back_from_copy_starts_no_second_span(db_url, conn, traces):
    with psycopg.connect(db_url) as tx:
        traces.outbox().enqueue(tx, Message(topic="t", payload={"n": 0}, event_id="b-0"))
        tx.commit()
    with psycopg.connect(db_url) as tx, traces.request():
        results = traces.outbox().enqueue_many(
            tx, [Message(topic="t", payload={"n": n}, event_id=f"b-{n}") for n in range(25)]
        )
        tx.commit()
    assert [r.duplicate for r in results] == [True] + [False] * 24
    creates = {span.attributes["messaging.message.id"]: span for span in traces.creates()}
    assert len(traces.creates()) == len(creates) == 25
    assert [creates[f"b-{n}"].attributes["outbox.duplicate"] for n in range(3)] == [True, False, False]
    assert "traceparent" not in headers_of(conn, "b-0")  # the stored row keeps what it was written with
    assert_stored_context_is(conn, "b-24", creates["b-24"])


def test_a_rolled_back_enqueue_ends_its_span_and_leaves_no_row(db_url, conn, traces):
    with psycopg.connect(db_url) as tx, traces.request():
        traces.outbox().enqueue(tx, Message(topic="t", payload={}, event_id="undone"))
        tx.rollback()
    [create] = traces.creates()
    assert create.end_time is not None
    assert conn.execute(f"SELECT count(*) AS n FROM {TABLE}").fetchone()["n"] == 0


def test_a_refused_enqueue_ends_its_span_with_the_error(db_url, traces):
    with psycopg.connect(db_url, autocommit=True) as no_tx, traces.request(), pytest.raises(NoTransaction):
        traces.outbox().enqueue(no_tx, Message(topic="t", payload={}, event_id="refused"))
    [create] = traces.creates()
    assert create.attributes["error.type"] == "NoTransaction"
    assert create.status.status_code is StatusCode.ERROR


def test_the_stored_context_counts_toward_the_payload_limit(db_url, conn, traces):
    outbox = traces.outbox(max_payload_bytes=80)  # {"traceparent":"00-…-01","tracestate":"vendor=abc"}: 99 bytes
    message = Message(topic="t", payload={"n": 1}, event_id="limit")
    with psycopg.connect(db_url) as tx:
        with traces.request(), pytest.raises(InvalidMessage, match="headers"):
            outbox.enqueue(tx, message)
        outbox.enqueue(tx, message)  # no span: nothing added, the message fits
        tx.commit()
    [create] = traces.creates()
    assert create.attributes["error.type"] == "InvalidMessage"
    assert headers_of(conn, "limit") == {}


def _asyncpg_url(db_url: str) -> str:
    return sqlalchemy_url(db_url).replace("postgresql+psycopg://", "postgresql://")


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
def test_the_asyncio_enqueue_stores_the_create_spans_context(db_url, conn, traces, driver):
    outbox = traces.outbox()

    async def scenario() -> None:
        if driver == "psycopg":
            async with await psycopg.AsyncConnection.connect(db_url) as handle:
                with traces.request():
                    await outbox.enqueue_async(handle, Message(topic="t", payload={}, event_id="one"))
                    await outbox.enqueue_many_async(
                        handle, [Message(topic="t", payload={}, event_id=f"a-{n}") for n in range(3)]
                    )
                await handle.commit()
        else:
            handle = await asyncpg.connect(_asyncpg_url(db_url))
            try:
                async with handle.transaction():
                    with traces.request():
                        await outbox.enqueue_async(handle, Message(topic="t", payload={}, event_id="one"))
                        await outbox.enqueue_many_async(
                            handle, [Message(topic="t", payload={}, event_id=f"a-{n}") for n in range(3)]
                        )
            finally:
                await handle.close()

    asyncio.run(scenario())
    creates = {span.attributes["messaging.message.id"]: span for span in traces.creates()}
    assert sorted(creates) == ["a-0", "a-1", "a-2", "one"]
    for event_id, span in creates.items():
        assert span.parent.span_id == traces.only("POST /orders").context.span_id
        assert span.attributes["outbox.duplicate"] is False
        assert_stored_context_is(conn, event_id, span)


DJANGO = """
import json, sys
import django
from django.conf import settings

settings.configure(
    DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", **json.loads(sys.argv[1])}},
    INSTALLED_APPS=[], USE_TZ=True,
)
django.setup()
from django.db import connection, transaction
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from outbox_pipelines import Message, Outbox

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
outbox = Outbox("outbox_events", tracer_provider=provider)
with provider.get_tracer("view").start_as_current_span("GET /view"):
    with transaction.atomic():
        outbox.enqueue(connection, Message(topic="t", payload={"n": 1}, event_id="django-1"))
        outbox.enqueue_many(connection, [Message(topic="t", payload={}, event_id="django-2")])
print(json.dumps([
    {"name": s.name, "trace_id": s.context.trace_id, "span_id": s.context.span_id,
     "parent": s.parent.span_id if s.parent else None, "id": (s.attributes or {}).get("messaging.message.id")}
    for s in exporter.get_finished_spans()
]))
"""


def test_djangos_connection_stores_the_create_spans_context(db_url, conn):
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(DJANGO), _django_settings(db_url)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    spans = json.loads(done.stdout)
    [view] = [s for s in spans if s["name"] == "GET /view"]
    creates = {s["id"]: s for s in spans if s["name"] == "create t"}
    assert sorted(creates) == ["django-1", "django-2"]
    for event_id, span in creates.items():
        assert span["parent"] == view["span_id"]
        trace_id, parent_id, flags = parts(headers_of(conn, event_id)["traceparent"])
        # A root span of this SDK sets the W3C random-trace-id flag (02) beside the sampled one (01).
        assert (trace_id, parent_id, flags) == (view["trace_id"], span["span_id"], "03")
