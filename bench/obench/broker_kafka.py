"""kafka: the relay's Kafka destination against confluent-kafka's own publish loop, in the same run.

The cluster is librdkafka's mock cluster (3 brokers) in a process of its own
(``outbox_pipelines_tests/brokers/kafka_cluster.py``): no Kafka server can be installed here, and the mock
speaks the real Kafka protocol to the real confluent-kafka producer. It costs the same to both sides.

Per run, interleaved, each side in a fresh spawned process, every producer warmed first (connected, with
its producer id: a publishing service keeps its producer), the data built before the clock starts:

- the client's own publish loop, what a user writes with confluent-kafka for the relay's guarantee: one
  Producer with the same settings (``enable.idempotence``, ``acks=all``, the same partitioner), every
  message serialised to JSON and produced keyed by its event_id with an ``idempotency-key`` header and a
  delivery callback, then ``flush()``; measured two ways:
    * ``loop-batch-100``: a flush after every 100 messages. This is the comparison: the relay may mark a
      row sent only once its delivery report came back, so it waits for each batch's reports (its default
      batch is 100) before settling it; a loop that waits the same way is the same client doing the same
      work without the outbox table;
    * ``loop-all``: everything produced, one flush at the end (no bound on what is unconfirmed), for
      information;
- ``outbox-loop``: the outbox loop a team writes with confluent-kafka (obench.outbox_loop): FOR UPDATE SKIP
  LOCKED LIMIT 100 on the same loaded rows (the simple loop's claim and pending index), the batch produced as
  the client loop produces, ``flush()`` for its delivery reports, UPDATE ... WHERE id = ANY, COMMIT; from its
  first claim to its last commit (a warmed producer, PostgreSQL connected before);
- ``relay``: the relay draining ``messages`` rows loaded beforehand (``copy_rows``; not measured), batch
  100, into its KafkaDestination: msg/s = sent / the relay's seconds (claim, deliver, settle, all in);
- what explains the gap between the two, for information: ``relay-noop``, the same drain into a
  destination that accepts everything at once (the relay's own database work at batch 100: no Kafka
  destination can make the relay faster than this); ``destination-100``, the KafkaDestination alone, its
  ``deliver()`` called with 100 claimed messages at a time as the relay calls it, without the database;
  ``relay-batch-1000``, the Kafka relay at batch 1,000.

Each side writes to topics of its own, and a real consumer then reads them back: a run whose topic does
not hold every message exactly once on the relay's side (or every message on a loop's) is an error.
"""

import json
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: the obench package and the repository on the path
    for entry in (str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2])):
        if entry not in sys.path:
            sys.path.insert(0, entry)

import psycopg

from obench.common import (
    Barrier,
    copy_rows,
    count_by_status,
    log,
    make_rows,
    reset_table,
    run_processes,
    sample_payload,
    settle_server,
)

TABLE = "outbox_events"
BATCH = 100
PARTITIONS = 6
TOPIC = "order.created"
WARM_UP_TOPIC = "warm-up"
SIDES = ("loop-all", "loop-batch-100", "destination-100", "outbox-loop", "relay", "relay-noop", "relay-batch-1000")
PRODUCER_SETTINGS = {"enable.idempotence": True, "acks": "all", "partitioner": "murmur2_random"}


def _produce(producer: Any, topic: str, event_id: str, payload: dict[str, Any], on_delivery: Any) -> None:
    """One message as every loop produces it: JSON, keyed by its event_id, an idempotency-key header."""
    producer.produce(
        topic,
        json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode(),
        event_id,
        on_delivery=on_delivery,
        headers=[("idempotency-key", event_id)],
    )


def _warm_producer(bootstrap: str) -> Any:
    """A publishing service keeps its producer: connected, with its producer id, before the clock starts
    (the relay's destination is warmed the same way)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_SETTINGS})
    producer.produce(WARM_UP_TOPIC, b"{}", b"warm-up")
    producer.flush(30)
    return producer


def client_loop(bootstrap: str, topic: str, messages: int, flush_every: int | None, barrier: Barrier) -> dict[str, Any]:
    """confluent-kafka's own publish loop (in a spawned process): msg/s from the first produce to the last
    delivery report."""
    payloads = [sample_payload(n) for n in range(messages)]  # the data exists before the clock starts
    delivered = failed = 0

    def on_delivery(err: Any, _msg: Any) -> None:
        nonlocal delivered, failed
        if err is None:
            delivered += 1
        else:
            failed += 1

    producer = _warm_producer(bootstrap)
    barrier()
    started = time.perf_counter()
    for n, payload in enumerate(payloads):
        _produce(producer, topic, f"kafka-{n}", payload, on_delivery)
        if flush_every and (n + 1) % flush_every == 0:
            producer.flush()
    producer.flush()
    seconds = time.perf_counter() - started
    return {"rate": delivered / seconds, "delivered": delivered, "failed": failed, "seconds": seconds}


def outbox_loop(db_url: str, bootstrap: str, prefix: str, barrier: Barrier) -> dict[str, Any]:
    """The outbox loop a team writes with confluent-kafka (in a spawned process): obench.outbox_loop's claim,
    batch 100, each row produced as the client loop produces, one ``flush()`` for the batch's delivery reports
    (as loop-batch-100 waits), then the settle and COMMIT; msg/s from the first claim to the last commit."""
    from obench import outbox_loop as loop

    producer = _warm_producer(bootstrap)

    def publish(rows: Any) -> int:
        delivered = 0

        def on_delivery(err: Any, _msg: Any) -> None:
            nonlocal delivered
            delivered += err is None

        for _, event_id, topic, payload, _ in rows:
            _produce(producer, prefix + topic, event_id, payload, on_delivery)
        producer.flush()
        return delivered

    barrier()
    sent, seconds = loop.drain(db_url, TABLE, publish)
    return {"sent": sent, "seconds": seconds, "rate": sent / seconds}


def relay_drain(db_url: str, bootstrap: str | None, prefix: str, batch: int, barrier: Barrier) -> dict[str, Any]:
    """The relay draining the loaded rows (in a spawned process) into its Kafka destination, or into a
    destination that accepts everything at once when ``bootstrap`` is None (the relay's own ceiling)."""
    from dataclasses import replace
    from datetime import UTC, datetime

    from obench.common import NoopDestination
    from outbox_pipelines.core.destinations.base import Destination
    from outbox_pipelines.core.destinations.kafka.destination import KafkaDestination
    from outbox_pipelines.core.models import ClaimedMessage
    from outbox_pipelines.core.relay import Relay
    from outbox_pipelines.core.settings import load_settings

    table = replace(load_settings(env={}, path=None).tables[TABLE], mode="competing", batch_size=batch)
    destination: Destination = NoopDestination()
    if bootstrap is not None:
        destination = KafkaDestination(bootstrap, timeout_s=table.timeout_s, topic_prefix=prefix)
        # Warm, as the client loop's producer is: connected, with its producer id (a record to a side topic).
        warm_up = ClaimedMessage(0, "warm-up", None, WARM_UP_TOPIC, {}, "", {}, 1, datetime.now(UTC), None, None)
        assert [o.kind for o in destination.deliver([warm_up])] == ["sent"]
    relay = Relay(db_url, table, destination, worker_id="bench-kafka")
    try:
        barrier()
        report = relay.run(once=True)
    finally:
        destination.close()
    late = destination.late_deliveries if isinstance(destination, KafkaDestination) else 0
    return {
        "sent": report.sent,
        "retried": report.retried,
        "dead": report.dead,
        "seconds": report.seconds,
        "rate": report.sent / report.seconds if report.seconds else 0.0,
        "late": late,
    }


def destination_only(bootstrap: str, topic_prefix: str, messages: int, barrier: Barrier) -> dict[str, Any]:
    """The relay's KafkaDestination alone (in a spawned process): ``deliver()`` of 100 claimed messages at a
    time, as the relay calls it, without the relay's database work; msg/s like the client loop's."""
    from datetime import UTC, datetime

    from outbox_pipelines.core.destinations.kafka.destination import KafkaDestination
    from outbox_pipelines.core.models import ClaimedMessage

    now = datetime.now(UTC)
    claimed = [
        ClaimedMessage(n, f"kafka-{n}", None, TOPIC, sample_payload(n), "", {}, 1, now, now, None)
        for n in range(messages)
    ]
    destination = KafkaDestination(bootstrap, topic_prefix=topic_prefix)
    warm_up = ClaimedMessage(0, "warm-up", None, WARM_UP_TOPIC, {}, "", {}, 1, now, now, None)
    assert [o.kind for o in destination.deliver([warm_up])] == ["sent"]
    barrier()
    started = time.perf_counter()
    sent = 0
    for first in range(0, messages, BATCH):
        sent += sum(1 for o in destination.deliver(claimed[first : first + BATCH]) if o.kind == "sent")
    seconds = time.perf_counter() - started
    destination.close()
    return {"rate": sent / seconds, "delivered": sent, "failed": messages - sent, "seconds": seconds}


def _relay_run(db_url: str, cluster: Any, rows: list[Any], prefix: str, batch: int, kafka: bool) -> float:
    """Load the rows, let a relay drain them, check the table and (for Kafka) what a consumer reads; msg/s."""
    messages = len(rows)
    if kafka:
        cluster.create_topic(prefix + TOPIC, PARTITIONS)
    reset_table(db_url, TABLE)
    with psycopg.connect(db_url, autocommit=True) as conn:
        copy_rows(conn, TABLE, rows)
    settle_server(db_url, TABLE)
    out = run_processes([(relay_drain, (db_url, cluster.bootstrap if kafka else None, prefix, batch))], 300)[0]
    counts = count_by_status(db_url, TABLE)
    if out["retried"] or out["dead"] or out["sent"] != messages or counts != {"sent": messages}:
        raise RuntimeError(f"relay {prefix}: {out}, table {counts}")
    if kafka:
        _check_topic(cluster.bootstrap, prefix + TOPIC, messages, exactly_once=True)
    rate: float = out["rate"]
    return rate


def _outbox_run(db_url: str, cluster: Any, messages: int, prefix: str) -> float:
    """Load the rows as the relay's are, let the outbox loop drain them, check the table and the topic; msg/s."""
    from obench import outbox_loop as loop

    cluster.create_topic(prefix + TOPIC, PARTITIONS)
    with loop.loaded(db_url, TABLE, messages, TOPIC, prefix):
        out = run_processes([(outbox_loop, (db_url, cluster.bootstrap, prefix))], 300)[0]
    loop.check_table(db_url, TABLE, messages, out)
    _check_topic(cluster.bootstrap, prefix + TOPIC, messages, exactly_once=False)
    rate: float = out["rate"]
    return rate


def _check_topic(bootstrap: str, topic: str, messages: int, exactly_once: bool) -> None:
    from outbox_pipelines_tests.brokers.kafka_cluster import read_topic

    ids = [r.headers["idempotency-key"] for r in read_topic(bootstrap, topic, timeout_s=120)]
    if len(set(ids)) != messages or (exactly_once and len(ids) != messages):
        raise RuntimeError(f"{topic}: {len(ids)} records, {len(set(ids))} distinct event_ids, expected {messages}")


def measure(db_url: str, messages: int, runs: int) -> dict[str, Any]:
    """Per-run msg/s of the relay and of both client loops, interleaved, against one mock cluster."""
    import confluent_kafka

    from outbox_pipelines_tests.brokers.kafka_cluster import KafkaCluster

    rows = make_rows(messages, TOPIC, "kafka")
    figures: dict[str, list[float]] = {side: [] for side in SIDES}
    with KafkaCluster(brokers=3) as cluster:
        log(f"  kafka: librdkafka mock cluster {cluster.bootstrap} (pid {cluster.pid})")
        for run in range(runs):
            for side, flush_every in (("loop-all", None), ("loop-batch-100", BATCH)):
                topic = f"{side}-{run}.{TOPIC}"
                cluster.create_topic(topic, PARTITIONS)
                out = run_processes([(client_loop, (cluster.bootstrap, topic, messages, flush_every))], 300)[0]
                if out["failed"] or out["delivered"] != messages:
                    raise RuntimeError(f"{side}: {out}")
                _check_topic(cluster.bootstrap, topic, messages, exactly_once=False)
                figures[side].append(out["rate"])
                log(f"  kafka run {run + 1}/{runs} {side:15s} {out['rate']:8,.0f} msg/s")
            prefix = f"destination-{run}."
            cluster.create_topic(prefix + TOPIC, PARTITIONS)
            out = run_processes([(destination_only, (cluster.bootstrap, prefix, messages))], 300)[0]
            if out["failed"]:
                raise RuntimeError(f"destination-100: {out}")
            _check_topic(cluster.bootstrap, prefix + TOPIC, messages, exactly_once=True)
            figures["destination-100"].append(out["rate"])
            log(f"  kafka run {run + 1}/{runs} {'destination-100':15s} {out['rate']:8,.0f} msg/s")
            figures["outbox-loop"].append(_outbox_run(db_url, cluster, messages, f"outbox-loop-{run}."))
            log(f"  kafka run {run + 1}/{runs} {'outbox-loop':15s} {figures['outbox-loop'][-1]:8,.0f} msg/s")
            for side, batch, kafka in (
                ("relay", BATCH, True),
                ("relay-noop", BATCH, False),
                ("relay-batch-1000", 1_000, True),
            ):
                figures[side].append(_relay_run(db_url, cluster, rows, f"{side}-{run}.", batch, kafka))
                log(f"  kafka run {run + 1}/{runs} {side:15s} {figures[side][-1]:8,.0f} msg/s")

    def ratio(ours: str, ceiling: str) -> list[float]:
        return [o / c for o, c in zip(figures[ours], figures[ceiling], strict=True)]

    return {
        "messages": messages,
        "runs": runs,
        "batch": BATCH,
        "relay_msg_s": figures["relay"],
        "client_loop_batch_100_msg_s": figures["loop-batch-100"],
        "client_loop_all_msg_s": figures["loop-all"],
        "relay_noop_msg_s": figures["relay-noop"],
        "destination_only_batch_100_msg_s": figures["destination-100"],
        "ratio_destination_only_to_loop_batch_100": ratio("destination-100", "loop-batch-100"),
        "relay_batch_1000_msg_s": figures["relay-batch-1000"],
        "ratio_relay_to_loop_batch_100": ratio("relay", "loop-batch-100"),
        "ratio_relay_to_loop_all": ratio("relay", "loop-all"),
        "outbox_loop_msg_s": figures["outbox-loop"],
        "ratio_relay_to_outbox_loop": ratio("relay", "outbox-loop"),
        "ratio_outbox_loop_to_loop_batch_100": ratio("outbox-loop", "loop-batch-100"),
        "ratio_relay_to_relay_noop": ratio("relay", "relay-noop"),
        "ratio_relay_batch_1000_to_loop_batch_100": ratio("relay-batch-1000", "loop-batch-100"),
        "comparison": "loop-batch-100 (the same client waiting for each 100 messages' delivery reports, as the "
        "relay must before it marks them sent); loop-all is the client's ceiling, for information",
        "outbox_comparison": "the outbox loop with confluent-kafka: FOR UPDATE SKIP LOCKED LIMIT 100, the batch "
        "produced, flush() for its delivery reports, UPDATE ... WHERE id = ANY, COMMIT (obench.outbox_loop)",
        "librdkafka": confluent_kafka.libversion()[0],
        "confluent_kafka": metadata.version("confluent-kafka"),
        "cluster": "librdkafka mock cluster, 3 brokers, in its own process",
    }


def main() -> None:
    from obench.brokers import run_standalone

    result, _ = run_standalone("kafka", measure)
    median = statistics.median
    print(
        f"relay {median(result['relay_msg_s']):,.0f} msg/s; client loop, flush every {BATCH}: "
        f"{median(result['client_loop_batch_100_msg_s']):,.0f} msg/s (ratio "
        f"{median(result['ratio_relay_to_loop_batch_100']):.2f}); client loop, one flush: "
        f"{median(result['client_loop_all_msg_s']):,.0f} msg/s "
        f"(ratio {median(result['ratio_relay_to_loop_all']):.2f}); relay into a no-op destination "
        f"{median(result['relay_noop_msg_s']):,.0f} msg/s (ratio {median(result['ratio_relay_to_relay_noop']):.2f}); "
        f"relay batch 1,000 {median(result['relay_batch_1000_msg_s']):,.0f} msg/s (ratio to the loop "
        f"{median(result['ratio_relay_batch_1000_to_loop_batch_100']):.2f}); the destination alone, batches of "
        f"100: {median(result['destination_only_batch_100_msg_s']):,.0f} msg/s (ratio to the loop "
        f"{median(result['ratio_destination_only_to_loop_batch_100']):.2f}); the outbox loop with confluent-kafka "
        f"{median(result['outbox_loop_msg_s']):,.0f} msg/s (relay / it "
        f"{median(result['ratio_relay_to_outbox_loop']):.2f}, it / the loop "
        f"{median(result['ratio_outbox_loop_to_loop_batch_100']):.2f}); librdkafka {result['librdkafka']}"
    )


if __name__ == "__main__":
    main()
