"""Every metric the seeds name (000 §8.2, 004 §10.2; docs/explanation/on-call.md) exists, moves, and stays bounded."""

import uuid

from prometheus_client.parser import text_string_to_metric_families

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core import models as m
from outbox_pipelines.core.models import Outcome
from outbox_pipelines.core.oncall import table_metrics
from outbox_pipelines.core.relay import Relay
from outbox_pipelines.core.telemetry import metrics
from outbox_pipelines_tests.conftest import table_settings
from outbox_pipelines_tests.helpers import ScriptedDestination

EVENTS = "outbox_events"


def scrape(db_url: str) -> dict[str, list]:
    """Every sample of the process registry plus the per-table gauges, by metric name."""
    collector = table_metrics.OutboxStateCollector(db_url, [EVENTS])
    text = metrics.exposition().decode()
    found: dict[str, list] = {}
    for family in list(text_string_to_metric_families(text)) + list(collector.collect()):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def total(samples: dict[str, list], name: str, **labels: str) -> float:
    return sum(s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))


def test_every_seed_metric_is_exposed_and_counts_what_happened(db_url, conn):
    topic = f"seed.metrics.{uuid.uuid4().hex[:6]}"
    before = scrape(db_url)
    outbox = Outbox(EVENTS)
    outbox.enqueue_many(
        conn,
        [Message(topic=topic, payload={"n": i}, tenant_id="acme", event_id=f"{topic}-{i}") for i in range(4)],
        outside_transaction=True,
    )
    answers = iter(
        [
            Outcome.sent(ref="a"),
            Outcome.sent(code=m.CONFLICT_PROCESSED),
            Outcome.dead(m.BAD_REQUEST, "HTTP 400"),
            Outcome.retry(m.BROKER_5XX, "HTTP 503"),
        ]
    )
    settings = table_settings(EVENTS, mode="competing", idle_sleep_s=0.01, batch_size=10)
    Relay(db_url, settings, ScriptedDestination(lambda msg: next(answers))).run(once=True)
    after = scrape(db_url)

    def moved(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    # seed 004 §10.2 counters, with the topic label
    assert moved("outbox_enqueue_total", table=EVENTS, topic=topic) == 4
    assert moved("outbox_dispatch_total", table=EVENTS, topic=topic, result="success") == 1
    # seed 000 §8.2: 409 "already processed" is its own outcome, not a plain success
    assert moved("outbox_dispatch_total", table=EVENTS, topic=topic, result="conflict_processed") == 1
    assert moved("outbox_dispatch_total", table=EVENTS, topic=topic, result="dead") == 1
    assert moved("outbox_dispatch_total", table=EVENTS, topic=topic, result="retry") == 1
    assert moved("outbox_dispatch_total", table=EVENTS, topic=topic, tenant="acme") == 4
    assert moved("outbox_dead_total", table=EVENTS, topic=topic) == 1
    # seed 000 §8.2: dequeue success / exhausted
    assert moved("outbox_dequeue_total", table=EVENTS, result="success") == 4
    assert moved("outbox_dequeue_total", table=EVENTS, result="empty") >= 1
    # per message, not per batch
    assert moved("outbox_dispatch_latency_seconds_count", table=EVENTS, topic=topic) == 4
    # seed 000 §8.2: the distribution of attempts of settled messages (sent and dead; the retry is not final)
    assert moved("outbox_retry_count_count", table=EVENTS) == 3
    # gauges read at scrape time (seed 004 §10.2, seed 000 inflight, lag, the circuit: docs/explanation/on-call.md)
    for gauge in (
        "outbox_pending_count",
        "outbox_locked_count",
        "outbox_inflight",
        "outbox_circuit_open",
        "outbox_paused_seconds",
    ):
        assert any(s.labels.get("table") == EVENTS for s in after.get(gauge, [])), gauge
    assert total(after, "outbox_pending_count", table=EVENTS) == 1  # the retried one
    assert {s.labels["quantile"] for s in after["outbox_lag_seconds"] if s.labels["table"] == EVENTS} >= {"0.95"}


def test_topic_and_tenant_labels_are_bounded_and_tenants_can_be_masked(monkeypatch):
    table = f"t_{uuid.uuid4().hex[:8]}"
    labels = {metrics.topic_label(table, f"topic-{i}") for i in range(metrics.TOPIC_LIMIT + 20)}
    assert len(labels) == metrics.TOPIC_LIMIT + 1 and "other" in labels
    assert metrics.topic_label(table, "topic-0") == "topic-0"  # the first ones keep their series
    monkeypatch.setenv(metrics.TENANT_LABEL_ENV, "hash")
    hashed = metrics.tenant_label(table, "acme-corp")
    assert hashed.startswith("t-") and "acme" not in hashed
    monkeypatch.setenv(metrics.TENANT_LABEL_ENV, "off")
    assert metrics.tenant_label(table, "acme-corp") == ""


def test_enqueue_counts_lose_nothing_to_threads_counting_and_scrapes_between():
    """outbox_enqueue_total is added up under a lock of its own (not a prometheus_client Counter): eight
    threads of a web server enqueueing at once, scraped all the while, count every message once."""
    import threading

    topic = f"threads.{uuid.uuid4().hex[:6]}"
    threads_n, each = 8, 5_000
    start = threading.Barrier(threads_n + 1)
    scraped: list[float] = []

    def enqueue_side() -> None:
        start.wait()
        for _ in range(each):
            metrics.count_enqueued_one(EVENTS, topic)

    def counted() -> float:
        families = text_string_to_metric_families(metrics.exposition().decode())
        return sum(
            s.value
            for family in families
            for s in family.samples
            if s.name == "outbox_enqueue_total" and s.labels == {"table": EVENTS, "topic": topic}
        )

    workers = [threading.Thread(target=enqueue_side) for _ in range(threads_n)]
    for worker in workers:
        worker.start()
    start.wait()
    while any(worker.is_alive() for worker in workers):
        scraped.append(counted())
    for worker in workers:
        worker.join()
    metrics.count_enqueued(EVENTS, [topic, topic, "other.topic." + topic])
    assert counted() == threads_n * each + 2
    assert scraped == sorted(scraped)  # a counter never goes back
