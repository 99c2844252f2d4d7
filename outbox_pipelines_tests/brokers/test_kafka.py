"""The Kafka destination against a Kafka cluster, read back by a real consumer.

The cluster is librdkafka's own mock cluster (``kafka_cluster.py``) in a process of its own: no Kafka
server can be installed here, and the mock speaks the real Kafka protocol (metadata, idempotent produce,
fetch) to the real confluent-kafka producer and consumer. Refusals a real broker makes from its
configuration (a size limit, ACLs, auto-creation off) are injected into the mock as the broker's error
codes; each test says which refusal it exercises and whether it came from the broker or the client.
"""

import json
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations.kafka.destination import REPORT_GRACE_S, KafkaDestination
from outbox_pipelines.core.destinations.kafka.producer import ProducerKeeper
from outbox_pipelines.core.models import ClaimedMessage
from outbox_pipelines.core.relay import Relay
from outbox_pipelines_tests.brokers.kafka_cluster import PRODUCE, KafkaCluster, read_topic
from outbox_pipelines_tests.conftest import run_cli, table_settings
from outbox_pipelines_tests.helpers import free_port, rows, statuses, wait_until

pytestmark = pytest.mark.slow  # librdkafka's mock cluster in a process of its own

EVENTS = "outbox_events"


@pytest.fixture(scope="module")
def cluster() -> Iterator[KafkaCluster]:
    """One 3-broker cluster for the module; each test uses topics of its own."""
    with KafkaCluster(brokers=3) as running:
        yield running


def settings(**overrides: object):  # type: ignore[no-untyped-def]
    return table_settings(EVENTS, **{"mode": "competing", "idle_sleep_s": 0.01, "timeout_s": 3.0, **overrides})


def claimed(i: int, topic: str, payload: object = None, ordering_key: str | None = None) -> ClaimedMessage:
    return ClaimedMessage(
        i,
        f"ev-{i}",
        None,
        topic,
        {"n": i} if payload is None else payload,
        "sha",
        {},
        1,
        datetime.now(UTC),
        None,
        ordering_key,
    )


def by_event(conn, table: str = EVENTS) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    return {r["event_id"]: r for r in rows(conn, table)}


def test_a_drain_lands_every_message_once_keyed_by_its_aggregate(cluster, db_url, conn):
    """200 messages, 150 of them on 7 ordering keys: a consumer reads each event_id once, with its
    idempotency key; one aggregate stays in one partition, in the order it was enqueued."""
    cluster.create_topic("shop.order.changed", 6)
    messages = [
        Message(
            topic="order.changed",
            payload={"n": i},
            event_id=f"ev-{i}",
            ordering_key=f"order-{i % 7}" if i < 150 else None,
            headers={"trace_id": f"tr-{i}"},
        )
        for i in range(200)
    ]
    Outbox(EVENTS).enqueue_many(conn, messages, outside_transaction=True)
    destination = KafkaDestination(cluster.bootstrap, timeout_s=3.0, topic_prefix="shop.")
    try:
        report = Relay(db_url, settings(batch_size=50), destination).run(once=True)
    finally:
        destination.close()
    assert report.sent == 200 and statuses(conn, EVENTS) == {"sent": 200}
    records = read_topic(cluster.bootstrap, "shop.order.changed")
    assert sorted(r.headers["idempotency-key"] for r in records) == sorted(f"ev-{i}" for i in range(200))
    assert all(json.loads(r.value) == {"n": int(r.headers["idempotency-key"][3:])} for r in records)
    partitions: dict[str, set[int]] = defaultdict(set)
    offsets: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for r in records:
        n = int(r.headers["idempotency-key"][3:])
        assert r.key == (f"order-{n % 7}" if n < 150 else f"ev-{n}")
        assert r.headers["outbox-topic"] == "order.changed" and r.headers["trace-id"] == f"tr-{n}"
        if n < 150:
            partitions[r.key].add(r.partition)
            offsets[r.key].append((n, r.offset))
    assert all(len(found) == 1 for found in partitions.values()), partitions
    assert len({p for found in partitions.values() for p in found}) > 1  # the keys spread over partitions
    for key, pairs in offsets.items():
        assert [n for n, _ in sorted(pairs, key=lambda pair: pair[1])] == sorted(n for n, _ in pairs), key
    # each row's reference is where its record is
    where = {r.headers["idempotency-key"]: f"{r.topic}/{r.partition}@{r.offset}" for r in records}
    assert {e: row["result_ref"] for e, row in by_event(conn).items()} == where


def test_each_refusal_ends_with_its_code_and_the_rest_of_the_batch_is_delivered(cluster, db_url, conn):
    """One batch: good messages among one of each refusal.

    - ``big``: the broker refuses the record as too large (MSG_SIZE_TOO_LARGE injected as the broker's
      produce answer for the only partition of topic ``big``: a broker-side refusal);
    - ``huge``: a 1.01 MB payload (under the outbox's own 1 MiB limit), over the producer's own
      ``message.max.bytes`` (1,000,000): the client refuses it before it goes on the wire;
    - ``bad topic!`` and a 250-character topic: names Kafka cannot hold, refused before producing;
    - ``missing``: the broker answers UNKNOWN_TOPIC_OR_PART (a cluster that does not create topics);
    - ``secret``: the broker answers TOPIC_AUTHORIZATION_FAILED (an ACL).
    """
    for topic in ("good", "big"):
        cluster.create_topic(topic, 1 if topic == "big" else 3)
    cluster.partition_errors("big", 0, PRODUCE, KafkaError.MSG_SIZE_TOO_LARGE)
    cluster.topic_error("missing", KafkaError.UNKNOWN_TOPIC_OR_PART)
    cluster.topic_error("secret", KafkaError.TOPIC_AUTHORIZATION_FAILED)
    odd = {
        "big": "big",
        "huge": "good",
        "bad": "bad topic!",
        "long": "t" * 250,
        "missing": "missing",
        "secret": "secret",
    }
    messages = [Message(topic="good", payload={"n": i}, event_id=f"ok-{i}") for i in range(10)]
    for name, topic in odd.items():
        payload = {"blob": "x" * 1_010_000} if name == "huge" else {"n": name}
        messages.insert(len(messages) // 2, Message(topic=topic, payload=payload, event_id=name))
    Outbox(EVENTS).enqueue_many(conn, messages, outside_transaction=True)
    destination = KafkaDestination(cluster.bootstrap, timeout_s=3.0)
    try:
        Relay(db_url, settings(batch_size=50), destination).run(once=True)
    finally:
        destination.close()
    found = by_event(conn)
    assert {e: (r["status"], r["last_error_code"]) for e, r in found.items() if not e.startswith("ok-")} == {
        "big": ("dead", m.BAD_REQUEST),
        "huge": ("dead", m.BAD_REQUEST),
        "bad": ("dead", m.BAD_REQUEST),
        "long": ("dead", m.BAD_REQUEST),
        "missing": ("dead", m.NO_SUBSCRIBERS),
        "secret": ("pending", m.UNAUTHORIZED),
    }  # to be retried (pending again), not dead
    assert "broker's max.message.bytes" in found["big"]["last_error"]
    assert "producer's message.max.bytes" in found["huge"]["last_error"]
    assert all(found[f"ok-{i}"]["status"] == "sent" for i in range(10))
    assert sorted(r.headers["idempotency-key"] for r in read_topic(cluster.bootstrap, "good")) == sorted(
        f"ok-{i}" for i in range(10)
    )
    assert read_topic(cluster.bootstrap, "big") == []


def test_a_sasl_failure_retries_unauthorized_and_shows_no_credential(cluster):
    """The client asks for SASL PLAIN; the mock broker has no SASL (a real protocol refusal of the
    handshake): the record times out while the client reports the authentication failure."""
    destination = KafkaDestination(
        cluster.bootstrap,
        timeout_s=1.0,
        config={
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "svc-outbox",
            "sasl.password": "pw-Very-Secret-123",
        },
    )
    try:
        outcomes = destination.deliver([claimed(1, "good")])
    finally:
        destination.close()
    assert [(o.kind, o.code) for o in outcomes] == [("retry", m.UNAUTHORIZED)]
    assert "SASL" in (outcomes[0].error or "") and "pw-Very-Secret-123" not in (outcomes[0].error or "")
    assert destination.name.startswith("kafka://127.0.0.1:") and "svc" not in destination.name


def test_all_brokers_down_keeps_the_reason_the_client_reported_before_it():
    """librdkafka follows every failed connection with "all brokers are down": a record that times out after
    it is still explained by the refusal (credentials, a refused connect), not by its consequence."""
    keeper = ProducerKeeper("127.0.0.1:1", {}, name="k", timeout_s=1.0, text=str)
    keeper._on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert keeper.client_error is not None and keeper.client_error.code() == KafkaError._ALL_BROKERS_DOWN
    keeper._on_error(KafkaError(KafkaError._AUTHENTICATION, "SASL Handshake not supported by broker"))
    keeper._on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert keeper.client_error.code() == KafkaError._AUTHENTICATION


def test_a_fatal_producer_error_retries_unknown_and_the_next_batch_gets_a_new_producer(cluster):
    """The broker answers OUT_OF_ORDER_SEQUENCE_NUMBER to the head of a partition's requests: the
    idempotent producer can no longer vouch for the partition's order and raises a fatal error."""
    cluster.create_topic("fatal", 2)
    destination = KafkaDestination(cluster.bootstrap, timeout_s=3.0)
    try:
        first = destination.deliver([claimed(i, "fatal") for i in range(10)])
        cluster.partition_errors("fatal", 0, PRODUCE, KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER)
        second = destination.deliver([claimed(i, "fatal") for i in range(10, 30)])
        third = destination.deliver([claimed(i, "fatal") for i in range(10, 30) if second[i - 10].kind != "sent"])
    finally:
        destination.close()
    assert {o.kind for o in first} == {"sent"}
    failed = [o for o in second if o.kind != "sent"]
    assert failed and {(o.kind, o.code) for o in failed} == {("retry", m.UNKNOWN)}, second
    assert {o.kind for o in third} == {"sent"} and destination.producers_created == 2
    ids = [r.headers["idempotency-key"] for r in read_topic(cluster.bootstrap, "fatal")]
    assert sorted(set(ids)) == sorted(f"ev-{i}" for i in range(30))


def test_an_unreachable_cluster_opens_the_circuit_and_kills_nothing(db_url, conn):
    """Nothing listens at the bootstrap address: each batch ends within the timeout (and librdkafka's
    report grace) as retry CONNECTION_REFUSED (NETWORK_TIMEOUT when librdkafka had not yet reported the refused
    connect), and the table's circuit opens with every attempt given back."""
    Outbox(EVENTS).enqueue_many(
        conn, [Message(topic="t", payload={"n": i}, event_id=f"ev-{i}") for i in range(12)], outside_transaction=True
    )
    destination = KafkaDestination(f"127.0.0.1:{free_port()}", timeout_s=1.0)
    try:
        started = time.monotonic()
        outcomes = destination.deliver([claimed(i, "t") for i in range(3)])
        assert time.monotonic() - started < 1.0 + REPORT_GRACE_S + 0.5
        assert {o.kind for o in outcomes} == {"retry"}
        assert {o.code for o in outcomes} <= {m.CONNECTION_REFUSED, m.NETWORK_TIMEOUT}
        report = Relay(
            db_url, settings(batch_size=5, circuit_threshold=3, probe_interval_s=0.5, timeout_s=1.0), destination
        ).run(max_seconds=4)
    finally:
        destination.close()
    assert report.circuit == "open" and report.dead == 0
    assert {(r["status"], r["attempts"]) for r in rows(conn, EVENTS)} == {("pending", 0)}


def test_brokers_that_go_down_and_come_back_are_reconnected_on_its_own():
    """All brokers down (connections closed, connects refused): the batch ends in retry NETWORK_TIMEOUT
    within the timeout; once they are up the same producer delivers again, with no duplicate."""
    with KafkaCluster(brokers=1) as own:
        own.create_topic("flaky", 2)
        # 2 s: a cluster just started on a loaded machine may take a second to give the producer its id.
        destination = KafkaDestination(own.bootstrap, timeout_s=2.0)
        try:
            assert {o.kind for o in destination.deliver([claimed(i, "flaky") for i in range(5)])} == {"sent"}
            own.brokers_down()
            started = time.monotonic()
            down = destination.deliver([claimed(i, "flaky") for i in range(5, 10)])
            assert time.monotonic() - started < 2.0 + REPORT_GRACE_S + 0.5
            assert {o.kind for o in down} == {"retry"} and {o.code for o in down} <= m.NETWORK_FAILURES
            own.brokers_up()
            wait_until(
                lambda: {o.kind for o in destination.deliver([claimed(i, "flaky") for i in range(5, 10)])} == {"sent"},
                20,
                "the producer to deliver again after the brokers came back",
                0.1,
            )
        finally:
            destination.close()
        ids = [r.headers["idempotency-key"] for r in read_topic(own.bootstrap, "flaky")]
        assert sorted(set(ids)) == sorted(f"ev-{i}" for i in range(10))
        assert destination.producers_created == 1 and len(ids) - len(set(ids)) <= destination.late_deliveries


def test_the_cli_relays_a_kafka_table_from_its_outbox_toml(cluster, cli_env, tmp_path: Path):
    project = tmp_path / "shop"
    project.mkdir()
    first_broker = cluster.bootstrap.split(",")[0]
    (project / "outbox.toml").write_text(
        '[tables.kafka_outbox]\ndestination = "kafka"\n'
        f'bootstrap_servers = "{first_broker}"\ntopic_prefix = "cli."\ntimeout = "3s"\n'
    )
    env = {**cli_env, "OUTBOX_CONFIG": str(project / "outbox.toml")}
    created = run_cli(env, "db", "create-table", "kafka_outbox", cwd=project)
    assert created.returncode == 0, created.stderr
    for i in range(3):
        queued = run_cli(
            env,
            "enqueue",
            "--table",
            "kafka_outbox",
            "--topic",
            "order.created",
            "--payload",
            json.dumps({"n": i}),
            "--event-id",
            f"cli-{i}",
            "--ordering-key",
            "order-1",
            cwd=project,
        )
        assert queued.returncode == 0, queued.stderr
    relay = run_cli(env, "relay", "--table", "kafka_outbox", "--once", cwd=project)
    assert relay.returncode == 0 and "sent 3" in relay.stdout, relay.stdout + relay.stderr
    records = read_topic(cluster.bootstrap, "cli.order.created")
    assert [r.headers["idempotency-key"] for r in sorted(records, key=lambda r: r.offset)] == [
        "cli-0",
        "cli-1",
        "cli-2",
    ]
    assert {r.key for r in records} == {"order-1"} and len({r.partition for r in records}) == 1
    status = run_cli(env, "status", "--table", "kafka_outbox", cwd=project)
    assert status.returncode == 0, status.stdout + status.stderr


def test_a_full_local_queue_is_waited_out_not_lost(cluster):
    """The producer's local queue holds 10 records; a batch of 60 waits for reports to free it (BufferError
    served by polling) and every record is delivered."""
    cluster.create_topic("queue", 2)
    destination = KafkaDestination(cluster.bootstrap, timeout_s=3.0, config={"queue.buffering.max.messages": 10})
    try:
        outcomes = destination.deliver([claimed(i, "queue") for i in range(60)])
    finally:
        destination.close()
    assert {o.kind for o in outcomes} == {"sent"}
    assert sorted(r.headers["idempotency-key"] for r in read_topic(cluster.bootstrap, "queue")) == sorted(
        f"ev-{i}" for i in range(60)
    )


def test_librdkafka_complaints_are_logged_once_per_kind_and_broker(caplog):
    from outbox_pipelines.core.destinations.kafka.producer import _ClientLog

    client_log = _ClientLog()
    with caplog.at_level("DEBUG", logger="outbox_pipelines.kafka"):
        for _ in range(5):
            client_log.log(40, "%s [%s] %s", "FAIL", "p-1", "127.0.0.1:9/1: Connect failed: Connection refused")
        client_log.log(40, "%s [%s] %s", "FAIL", "p-1", "127.0.0.1:9/2: Connect failed: Connection refused")
    assert [r.getMessage() for r in caplog.records] == [
        "librdkafka FAIL: 127.0.0.1:9/1: Connect failed: Connection refused",
        "librdkafka FAIL: 127.0.0.1:9/2: Connect failed: Connection refused",
    ]
