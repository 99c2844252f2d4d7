"""One connected trace from the request to the consumer, on every destination kind, all real processes (each with an
OpenTelemetry SDK exporting to a file: trace_processes.py says how): a producer enqueues inside a request span
(sync: one message a table; async: two in one transaction), the real ``outbox-pipelines relay`` sends them (a
one-message batch, then a batch of two), and a consumer of each kind continues each message's trace.

Asserted, per kind: request → ``create {topic}`` (its child) → ``send {destination}`` (links to each create; the
child of it for the one-message batch) → ``process {destination}`` (same trace, the child of the create span: the
creation context reached the consumer unchanged).
"""

import contextlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from outbox_pipelines.core.storage import schema
from outbox_pipelines_tests.conftest import REPO
from outbox_pipelines_tests.core.telemetry.trace_processes import SERVICE, SPANS_DIR, read_spans, sitecustomize
from outbox_pipelines_tests.drills.inbox_consumers import destination
from outbox_pipelines_tests.processes import port_open, start_logged, stop_process, tail, wait_until

KINDS = ("http", "kafka", "rabbitmq", "nats")
# The destination name of each kind, as its send and process spans name it (topic_prefix "inbox.", RabbitMQ's
# exchange "inbox.events"): docs/how-to/traces.md, "Spans".
NAMES = {
    "http": "order.created",
    "kafka": "inbox.order.created",
    "rabbitmq": "inbox.events:inbox.order.created",
    "nats": "inbox.order.created",
}
MODULE = "outbox_pipelines_tests.core.telemetry.trace_processes"

pytestmark = pytest.mark.slow


def run(env: dict[str, str], service: str, *args: str, cwd: Path) -> None:
    done = subprocess.run(
        args, env={**env, SERVICE: service}, cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"{service}: {done.stdout}\n{done.stderr}"


def test_one_trace_from_the_request_to_each_kind_of_consumer(db_url, cli_env, tmp_path):
    spans_dir = tmp_path / "spans"
    spans_dir.mkdir()
    python_path = f"{sitecustomize(tmp_path / 'site')}:{REPO}"
    with contextlib.ExitStack() as stack:
        dests = {kind: stack.enter_context(destination(kind, tmp_path)) for kind in KINDS}
        project = tmp_path / "project"
        project.mkdir()
        (project / "outbox.toml").write_text(
            "".join(f"[tables.trace_{kind}]\n{dests[kind].table_lines}" for kind in KINDS)
        )
        for kind in KINDS:
            schema.create_table(db_url, f"trace_{kind}")
        env = {
            **cli_env,
            **{k: v for dest in dests.values() for k, v in dest.relay_env.items()},
            "OUTBOX_CONFIG": str(project / "outbox.toml"),
            "DATABASE_URL": db_url,
            "PYTHONPATH": python_path,
            SPANS_DIR: str(spans_dir),
        }
        consumers = {}
        for kind in KINDS:
            consumer_env = {**env, **dests[kind].consumer_env, SERVICE: f"consumer-{kind}"}
            log = tmp_path / f"consumer-{kind}.log"
            consumers[kind] = (
                start_logged([sys.executable, "-m", MODULE, "consume", kind, "3"], log, env=consumer_env),
                log,
            )
            stack.callback(stop_process, consumers[kind][0])
        port = dests["http"].port
        assert port is not None
        wait_until(lambda: port_open(port), 30, "the webhook consumer to listen", 0.05, process=consumers["http"][0])
        tables = [f"trace_{kind}" for kind in KINDS]
        relay = [sys.executable, "-m", "outbox_pipelines.cli", "relay", "--group", "default", "--once", "--quiet"]
        run(env, "producer-sync", sys.executable, "-m", MODULE, "produce", "sync", *tables, cwd=project)
        run(env, "relay", *relay, cwd=project)
        run(env, "producer-async", sys.executable, "-m", MODULE, "produce", "async", *tables, cwd=project)
        run(env, "relay", *relay, cwd=project)
        for kind, (process, log) in consumers.items():
            try:
                assert process.wait(timeout=30) == 0, tail(log)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the {kind} consumer did not get its 3 messages:\n{tail(log)}")
    spans = read_spans(spans_dir)
    for kind in KINDS:
        check_kind(kind, spans)


def by(spans: list[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    return [s for s in spans if all(s.get(k) == v for k, v in match.items())]


def check_kind(kind: str, spans: list[dict[str, Any]]) -> None:
    table, name = f"trace_{kind}", NAMES[kind]
    sends = [s for s in by(spans, service="relay", name=f"send {name}") if s["attributes"]["outbox.table"] == table]
    processes = by(spans, service=f"consumer-{kind}", name=f"process {name}")
    assert len(sends) == 2 and len(processes) == 3, (kind, [s["name"] for s in spans])
    for producer, count in (("producer-sync", 1), ("producer-async", 2)):
        [request] = by(spans, service=producer, kind="SERVER")
        creates = [
            s for s in by(spans, service=producer, name="create order.created", parent=request["span_id"])
            if s["attributes"]["outbox.table"] == table
        ]  # fmt: skip
        assert len(creates) == count, (kind, producer)
        assert {s["trace_id"] for s in creates} == {request["trace_id"]} and {s["kind"] for s in creates} == {
            "PRODUCER"
        }
        created = {s["span_id"] for s in creates}
        [send] = [s for s in sends if {link["span_id"] for link in s["links"]} == created]
        assert send["kind"] == "CLIENT" and send["status"] == "UNSET"
        attributes = send["attributes"]
        assert attributes["messaging.system"] == kind
        assert attributes["messaging.operation.type"] == "send"
        assert attributes["messaging.destination.name"] == name
        assert {link["attributes"]["messaging.message.id"] for link in send["links"]} == {
            s["attributes"]["messaging.message.id"] for s in creates
        }
        if count == 1:  # a one-message batch: the send is the child of the create, in the request's trace
            assert (send["trace_id"], send["parent"]) == (request["trace_id"], creates[0]["span_id"])
            assert attributes["messaging.message.id"] == creates[0]["attributes"]["messaging.message.id"]
        else:
            assert send["parent"] is None and attributes["messaging.batch.message_count"] == 2
        for create in creates:  # the consumer continued each message's creation context, unchanged
            [process] = by(processes, parent=create["span_id"])
            assert process["trace_id"] == request["trace_id"] and process["kind"] == "CONSUMER"
            assert [link["span_id"] for link in process["links"]] == [create["span_id"]]
