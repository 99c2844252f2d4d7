"""The metrics the alert rules and the dashboard read (docs/how-to/prometheus.md): the table gauges say what the
table holds, ``outbox_state_up`` is 0 (not silence) when the state cannot be read, and a relay observes delivery
latency from creation, its claims, settles and destination calls, with the OpenTelemetry messaging names."""

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core import models as m
from outbox_pipelines.core.models import Outcome
from outbox_pipelines.core.oncall import table_metrics
from outbox_pipelines.core.relay import Relay, liveness
from outbox_pipelines.core.telemetry import counts, metrics
from outbox_pipelines_tests.conftest import table_settings
from outbox_pipelines_tests.helpers import ScriptedDestination
from outbox_pipelines_tests.processes import free_port

EVENTS = "outbox_events"


def samples(families) -> dict[str, list]:
    found: dict[str, list] = {}
    for family in families:
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def value(found: dict[str, list], name: str, **labels: str) -> float:
    return sum(s.value for s in found.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))


def relay_samples() -> dict[str, list]:
    return samples(text_string_to_metric_families(metrics.exposition().decode()))


def test_table_gauges_say_what_waits_what_is_dead_blocked_and_who_relays(db_url, conn):
    outbox = Outbox(EVENTS)
    keyed = [Message(topic="t", payload={"n": i}, ordering_key="k1", event_id=f"k1-{i}") for i in range(3)]
    outbox.enqueue_many(conn, [*keyed, Message(topic="t", payload={}, event_id="free")], outside_transaction=True)
    conn.execute(f"UPDATE {EVENTS} SET created_at = now() - interval '300 seconds' WHERE event_id = 'free'")
    collector = table_metrics.OutboxStateCollector(db_url, [EVENTS], enabled={EVENTS: False})
    before = samples(collector.collect())
    assert value(before, "outbox_state_up", table=EVENTS) == 1
    assert value(before, "outbox_pending_count", table=EVENTS) == 4
    assert 299 <= value(before, "outbox_oldest_waiting_age_seconds", table=EVENTS) < 400
    assert value(before, "outbox_relays_alive", table=EVENTS) == 0
    assert value(before, "outbox_relay_enabled", table=EVENTS) == 0

    # The key's head dies: it is dead, and its key is blocked with the two behind it.
    def decide(msg):
        return Outcome.dead(m.BAD_REQUEST, "HTTP 400") if msg.event_id == "k1-0" else Outcome.sent(ref="ok")

    settings = table_settings(EVENTS, mode="competing", idle_sleep_s=0.01, batch_size=10)
    Relay(db_url, settings, ScriptedDestination(decide)).run(once=True)
    liveness.register(conn, "relay-a", EVENTS, None)
    liveness.register(conn, "relay-b", EVENTS, None)
    liveness.stopped(conn, "relay-b", "ended")
    after = samples(collector.collect())
    assert value(after, "outbox_dead_count", table=EVENTS) == 1
    assert value(after, "outbox_blocked_keys", table=EVENTS) == 1
    assert value(after, "outbox_pending_count", table=EVENTS) == 2  # parked behind the dead head
    assert value(after, "outbox_relays_alive", table=EVENTS) == 1  # relay-b said goodbye
    assert value(after, "outbox_circuit_open", table=EVENTS) == 0


def test_state_up_is_zero_when_the_state_cannot_be_read(db_url, conn):
    """A database away (or a table missing) leaves outbox_state_up = 0 for an alert to see, not an empty scrape."""
    away = f"postgresql://nobody@127.0.0.1:{free_port()}/nothing?connect_timeout=2"
    gone = samples(table_metrics.OutboxStateCollector(away, [EVENTS, "outbox_other"]).collect())
    assert {s.labels["table"]: s.value for s in gone["outbox_state_up"]} == {EVENTS: 0, "outbox_other": 0}
    assert "outbox_pending_count" not in gone
    mixed = samples(table_metrics.OutboxStateCollector(db_url, [EVENTS, "outbox_missing"]).collect())
    assert {s.labels["table"]: s.value for s in mixed["outbox_state_up"]} == {EVENTS: 1, "outbox_missing": 0}
    assert [s.labels["table"] for s in mixed["outbox_pending_count"]] == [EVENTS]


def test_a_relay_observes_delivery_latency_from_creation_claims_settles_and_sends(db_url, conn):
    outbox = Outbox(EVENTS)
    outbox.enqueue_many(
        conn, [Message(topic="t", payload={"n": i}, event_id=f"lat-{i}") for i in range(5)], outside_transaction=True
    )
    conn.execute(f"UPDATE {EVENTS} SET created_at = now() - interval '90 seconds' WHERE event_id = 'lat-0'")
    retried = Outcome.retry(m.BROKER_5XX, "HTTP 503")
    destination = ScriptedDestination(lambda msg: retried if msg.event_id == "lat-1" else Outcome.sent(ref="ok"))
    kind = destination.messaging_system
    before = relay_samples()
    settings = table_settings(EVENTS, mode="competing", idle_sleep_s=0.01, batch_size=10)
    Relay(db_url, settings, destination).run(once=True)
    after = relay_samples()

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    # The four delivered, one of them created 90 s ago (between the 60 and 120 s buckets); not the retried one.
    assert moved("outbox_delivery_latency_seconds_count", table=EVENTS, destination=kind) == 4
    assert moved("outbox_delivery_latency_seconds_bucket", table=EVENTS, destination=kind, le="60.0") == 3
    assert moved("outbox_delivery_latency_seconds_bucket", table=EVENTS, destination=kind, le="120.0") == 4
    assert moved("outbox_delivery_latency_seconds_sum", table=EVENTS, destination=kind) >= 90
    assert value(after, "outbox_destination_info", table=EVENTS, destination=kind) == 1
    # Claims (the batch, then the empty claim that ends --once), one settle and one destination call per batch.
    assert moved("outbox_claim_duration_seconds_count", table=EVENTS) >= 2
    assert moved("outbox_settle_duration_seconds_count", table=EVENTS) == 1
    sent = {"messaging_system": kind, "messaging_operation_name": "send", "table": EVENTS}
    assert moved("messaging_client_operation_duration_seconds_count", **sent) == 1
    assert moved("messaging_client_sent_messages_total", **sent, error_type="") == 4
    assert moved("messaging_client_sent_messages_total", **sent, error_type=m.BROKER_5XX) == 1


class _One(Collector):
    def __init__(self, family: counts.Family) -> None:
        self.family = family

    def collect(self):
        yield metrics.family_metric(self.family)


def test_many_observations_at_once_expose_what_single_ones_do():
    values = [0.001, 0.01, 0.0100001, 0.3, 0.3, 7.0, 99.0, 1e9]

    def exposition(observe) -> bytes:
        registry = CollectorRegistry()
        child = Histogram("h", "h", ["table"], registry=registry, buckets=(0.01, 0.1, 1.0, 10.0)).labels("t")
        observe(child)
        return b"\n".join(line for line in generate_latest(registry).splitlines() if b"_created" not in line)

    def one_by_one(child) -> None:
        for v in values:
            child.observe(v)

    def ours(observe) -> bytes:
        family = counts.HistogramFamily("h", "h", ["table"], buckets=(0.01, 0.1, 1.0, 10.0))
        observe(family.labels("t"))
        registry = CollectorRegistry()
        registry.register(_One(family))
        return b"\n".join(line for line in generate_latest(registry).splitlines() if b"_created" not in line)

    assert ours(lambda child: child.observe_many(values)) == exposition(one_by_one)
    assert ours(lambda child: child.observe_many([])) == exposition(lambda child: None)
    assert ours(one_by_one) == exposition(one_by_one)
