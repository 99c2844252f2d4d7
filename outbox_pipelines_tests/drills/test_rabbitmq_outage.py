"""Drill: the RabbitMQ node stops for 60 s in the middle of a 5,000-message drain by the real relay.

The node is Debian's RabbitMQ, started for this drill (``brokers/rabbitmq_server.py``) with a durable
queue bound to the table's exchange, and a real consumer (its own thread, manual acks, reconnecting
every 0.2 s while the node is away) reads that queue throughout. Once the relay has sent about a
third of the messages the node is killed by its pid (SIGKILL to the node's process session: a crash, the
harder case, as nothing is flushed on the way down), stays down 60 s, and boots again on the same port
with the same data dir: the durable queue keeps every persistent message it had confirmed.

``outbox-pipelines relay`` runs as its own process from a project dir with its own outbox.toml, the URL
(with the password) read from ``url_env``. Batches of 25 make the drain last long enough for the outage
to begin in its middle. The table's ``probe_interval`` is 5 s (10 s by default), so the drain resumes
within 5 s of the node answering again; the default backoff needs no change (the first success closes
the circuit and every waiting retry is due at once).

Asserted, as an operator would check: every row sent, none dead, the circuit opened during the outage
(no attempt burnt while open, nothing dead-lettered), the consumer read every event_id (0 lost), the
relay's output shows no credential. Duplicates are counted and reported, not asserted: a publish whose
confirm was lost when the node went down is sent again (at least once; consumers deduplicate by
message_id = event_id), and a message the consumer read but had not acknowledged comes again
(``redelivered``) after the restart.
"""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from outbox_pipelines import Message, Outbox
from outbox_pipelines_tests.brokers.rabbitmq_server import Consumer, RabbitMQ, bind_queue, installed
from outbox_pipelines_tests.conftest import run_cli
from outbox_pipelines_tests.helpers import statuses
from outbox_pipelines_tests.processes import start_relay, stop_process, wait_until

TABLE = "rabbitmq_drill"
EXCHANGE = "drill.events"
QUEUE = "drill-consumer"
MESSAGES = 5_000
OUTAGE_S = 60.0
RESULTS_ENV = "OUTBOX_DRILL_RESULTS"


def _health(conn) -> dict:  # type: ignore[no-untyped-def]
    found = conn.execute("SELECT * FROM outbox_destination_health WHERE table_name = %s", (TABLE,)).fetchone()
    return dict(found) if found else {}


@pytest.mark.drill
@pytest.mark.skipif(not installed(), reason="rabbitmq-server is not installed (bash .ci/run installs it)")
def test_a_60_s_node_outage_mid_drain_loses_nothing_and_kills_nothing(cli_env, conn, tmp_path: Path):
    with RabbitMQ(prefix="outbox-drill-rabbitmq-") as node:
        bind_queue(node.url, EXCHANGE, QUEUE, "drill.#")
        config = tmp_path / "outbox.toml"
        config.write_text(
            f'[tables.{TABLE}]\ndestination = "rabbitmq"\nurl_env = "DRILL_RABBITMQ_URL"\nexchange = "{EXCHANGE}"\n'
            'topic_prefix = "drill."\ntimeout = "2s"\nprobe_interval = "5s"\nbatch_size = 25\n'
        )
        env = {**cli_env, "OUTBOX_CONFIG": str(config), "DRILL_RABBITMQ_URL": node.url}
        created = run_cli(env, "db", "create-table", TABLE, cwd=tmp_path)
        assert created.returncode == 0, created.stderr
        Outbox(TABLE).enqueue_many(
            conn,
            [Message(topic="order.changed", payload={"n": i}, event_id=f"drill-{i}") for i in range(MESSAGES)],
            outside_transaction=True,
        )
        consumer = Consumer(node.url, QUEUE)
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
            return "\n".join(log_path.read_text().splitlines()[-40:]) + "\n" + node.log(10)

        def consumed() -> int:
            return len(set(consumer.ids()))

        try:
            started = time.monotonic()
            # The relay's progress, not the consumer's: on a busy machine the consumer's thread lags, and the drain
            # was over before it had read a third.
            wait_until(
                lambda: statuses(conn, TABLE).get("sent", 0) >= MESSAGES // 3,
                60,
                "a third of the messages sent before the outage",
                0.02,
                on_timeout=relay_log,
            )
            node.stop(kill=True)
            down_at = time.monotonic()
            sent_at_stop, consumed_at_stop = statuses(conn, TABLE).get("sent", 0), consumed()
            assert sent_at_stop < MESSAGES - 1_000, f"the drain was nearly over ({sent_at_stop} sent) at the stop"
            wait_until(
                lambda: _health(conn).get("circuit_opened_at") is not None,
                30,
                "the outage to open the table's circuit",
                0.2,
                on_timeout=relay_log,
            )
            dead_during = statuses(conn, TABLE).get("dead", 0)
            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))  # the outage itself lasts 60 s
            node.start()
            up_at = time.monotonic()
            wait_until(
                lambda: statuses(conn, TABLE).get("sent", 0) == MESSAGES,
                90,
                "every message sent after the node came back",
                0.2,
                on_timeout=lambda: f"{statuses(conn, TABLE)}\n{relay_log()}",
            )
            drained_at = time.monotonic()
            wait_until(
                lambda: consumed() == MESSAGES,
                60,
                "the consumer to read every message",
                0.2,
                on_timeout=lambda: f"consumed {consumed()}\n{relay_log()}",
            )
        finally:
            consumer.stop()
            stop_process(relay)
        counts = statuses(conn, TABLE)
        output = log_path.read_text()
    reads = list(consumer.read)
    seen: set[str] = set()
    published_twice = redelivered = 0
    for read in reads:
        if read.message_id in seen:
            if read.redelivered:
                redelivered += 1  # the queue's own copy again: read, not acknowledged before the crash
            else:
                published_twice += 1  # a second publish: its first confirm was lost in the outage
        seen.add(read.message_id or "")
    lost = MESSAGES - len(seen & {f"drill-{i}" for i in range(MESSAGES)})
    figures = {
        "drill": "rabbitmq_outage",
        "messages": MESSAGES,
        "sent": counts.get("sent", 0),
        "dead": counts.get("dead", 0),
        "dead_during_outage": dead_during,
        "reads": len(reads),
        "distinct_consumed": len(seen),
        "lost": lost,
        "duplicates": len(reads) - len(seen),
        "published_twice": published_twice,
        "redelivered": redelivered,
        "sent_at_stop": sent_at_stop,
        "consumed_at_stop": consumed_at_stop,
        "down_s": round(up_at - down_at, 1),
        "drained_after_restart_s": round(drained_at - up_at, 1),
        "total_s": round(drained_at - started, 1),
        "boot_s": [round(s, 1) for s in node.boot_seconds],
        "consumer_reconnects": consumer.reconnects,
    }
    print(f"\nrabbitmq outage drill: {json.dumps(figures)}")
    if os.environ.get(RESULTS_ENV):
        with open(os.environ[RESULTS_ENV], "a") as out:
            out.write(json.dumps(figures) + "\n")
    assert counts == {"sent": MESSAGES}, counts
    assert dead_during == 0
    assert lost == 0 and len(seen) == MESSAGES
    assert node.PASSWORD not in output
