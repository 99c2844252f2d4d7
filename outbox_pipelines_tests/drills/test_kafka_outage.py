"""Drill: the Kafka cluster stops for 60 s in the middle of a 5,000-message drain by the real relay.

The cluster is librdkafka's mock cluster in a process of its own (``brokers/kafka_cluster.py``): no Kafka
server can be installed here, and the mock speaks the real Kafka protocol to the real producer and
consumer. "Stopped" is the mock's own broker-down switch, set from the cluster's process: every broker
closes its connections and its listening socket, so the relay's producer gets "connection refused", as
from a stopped broker process; records already written stay (a broker whose log survived its restart).
After 60 s the brokers listen again on the same ports.

The brokers answer 25 ms late (the mock's round-trip setting) and the relay claims 25 messages a batch, so
the drain lasts seconds and the outage begins in its middle (once 2,000 messages are sent), not after it.

What is asserted is what an operator would check: every row sent, none dead, the circuit opened during
the outage (no attempt burnt while open), and a real consumer reads every event_id; duplicates are
counted and reported (the idempotent producer prevents them within its session; a record that timed out
during the outage yet was written is sent again: at least once).
"""

import subprocess
import time
from pathlib import Path

import pytest

from outbox_pipelines import Message, Outbox
from outbox_pipelines_tests.brokers.kafka_cluster import KafkaCluster, read_topic
from outbox_pipelines_tests.conftest import run_cli
from outbox_pipelines_tests.helpers import statuses
from outbox_pipelines_tests.processes import start_relay, stop_process, wait_until

TABLE = "kafka_drill"
TOPIC = "drill.order.changed"
MESSAGES = 5_000
KEYS = 20  # a fifth of the messages carry one of these ordering keys
OUTAGE_S = 60.0


def _health(conn) -> dict:  # type: ignore[no-untyped-def]
    found = conn.execute("SELECT * FROM outbox_destination_health WHERE table_name = %s", (TABLE,)).fetchone()
    return dict(found) if found else {}


@pytest.mark.drill
def test_a_60_s_cluster_outage_mid_drain_loses_nothing_and_kills_nothing(cli_env, conn, tmp_path: Path):
    with KafkaCluster(brokers=3) as cluster:
        cluster.create_topic(TOPIC, 6)
        cluster.command("rtt", "all", 25)
        config = tmp_path / "outbox.toml"
        config.write_text(
            f'[tables.{TABLE}]\ndestination = "kafka"\nbootstrap_servers = "{cluster.bootstrap}"\n'
            'topic_prefix = "drill."\ntimeout = "2s"\nprobe_interval = "5s"\nbatch_size = 25\n'
        )
        env = {**cli_env, "OUTBOX_CONFIG": str(config)}
        created = run_cli(env, "db", "create-table", TABLE, cwd=tmp_path)
        assert created.returncode == 0, created.stderr
        Outbox(TABLE).enqueue_many(
            conn,
            [
                Message(
                    topic="order.changed",
                    payload={"n": i},
                    event_id=f"drill-{i}",
                    ordering_key=f"order-{i % KEYS}" if i % 5 == 0 else None,
                )
                for i in range(MESSAGES)
            ],
            outside_transaction=True,
        )
        log_path = tmp_path / "relay.log"
        with log_path.open("w") as log:
            relay = start_relay(
                env,
                TABLE,
                "--max-seconds",
                "170",
                quiet=False,
                cwd=tmp_path,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

        def relay_log() -> str:
            return "\n".join(log_path.read_text().splitlines()[-40:])

        def sent() -> int:
            return statuses(conn, TABLE).get("sent", 0)

        try:
            started = time.monotonic()
            wait_until(lambda: sent() >= 2_000, 60, "2,000 messages sent before the outage", 0.05, on_timeout=relay_log)
            cluster.brokers_down()
            down_at = time.monotonic()
            sent_at_stop = sent()
            assert sent_at_stop < MESSAGES - 1_000, f"the drain was nearly over ({sent_at_stop} sent) at the stop"
            wait_until(
                lambda: _health(conn).get("circuit_opened_at") is not None,
                30,
                "the outage to open the table's circuit",
                0.2,
                on_timeout=relay_log,
            )
            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))  # the outage itself lasts 60 s
            cluster.brokers_up()
            up_at = time.monotonic()
            wait_until(
                lambda: sent() == MESSAGES,
                90,
                "every message sent after the brokers came back",
                0.2,
                on_timeout=lambda: f"{statuses(conn, TABLE)}\n{relay_log()}",
            )
            drained_at = time.monotonic()
        finally:
            stop_process(relay)
        counts = statuses(conn, TABLE)
        records = read_topic(cluster.bootstrap, TOPIC, timeout_s=60)
    ids = [r.headers["idempotency-key"] for r in records]
    distinct = set(ids)
    lost = MESSAGES - len(distinct & {f"drill-{i}" for i in range(MESSAGES)})
    duplicates = len(ids) - len(distinct)
    # One ordering key stays in one partition, in its enqueue order (first copies: a duplicate is a re-send).
    first_seen: dict[str, list[int]] = {}
    partitions: dict[str, set[int]] = {}
    seen: set[str] = set()
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        if r.key and r.key.startswith("order-"):
            partitions.setdefault(r.key, set()).add(r.partition)
            event = r.headers["idempotency-key"]
            if event not in seen:
                first_seen.setdefault(r.key, []).append(int(event.split("-")[1]))
        seen.add(r.headers["idempotency-key"])
    print(
        f"\nkafka outage drill: {MESSAGES} messages, {counts.get('sent', 0)} sent, {counts.get('dead', 0)} dead, "
        f"{len(distinct)} distinct event_ids consumed of {len(ids)} records, lost {lost}, duplicates "
        f"{duplicates}; stopped at {sent_at_stop} sent, {up_at - down_at:.1f} s down, drained "
        f"{drained_at - up_at:.1f} s after the brokers came back, {drained_at - started:.1f} s in all"
    )
    assert counts == {"sent": MESSAGES}, counts
    assert lost == 0 and len(distinct) == MESSAGES
    assert all(len(found) == 1 for found in partitions.values()), partitions
    assert all(events == sorted(events) for events in first_seen.values())
