"""Drill: NATS stopped for 60 s in the middle of a 5,000-message drain, then started again.

All real processes: ``outbox-pipelines relay`` (the CLI, from a project directory with its own
outbox.toml, default retry preset and circuit), a nats-server with JetStream on a file store, and a
consumer reading the stream through a durable pull consumer while it all happens. Once the consumer has
read about a third, the server is stopped (SIGTERM by pid), kept down 60 s, and started again on the same
port and store. The drill passes when the table reports every message sent, none dead, and the consumer
has read every event_id; duplicates in the stream (the same event_id at two stream sequences) are counted
and expected to be 0 (JetStream's duplicate window, 2 minutes, covers the retries).

The figures are printed (``pytest -s``) and attached to the test's report (``record_property``).
"""

import json
import signal
import subprocess
import threading
import time
from collections import Counter

import pytest

from outbox_pipelines import Message, Outbox
from outbox_pipelines_tests.brokers.nats_server import NatsServer, Received
from outbox_pipelines_tests.conftest import run_cli
from outbox_pipelines_tests.helpers import statuses
from outbox_pipelines_tests.processes import start_relay, stop_process, wait_until

TABLE = "nats_drill"
MESSAGES = 5_000
OUTAGE_S = 60.0


class LiveConsumer:
    """A consumer reading the stream over and over on its own thread, through the outage (a read that fails
    while the server is down is tried again): every message it read, by stream sequence."""

    def __init__(self, server: NatsServer, stream: str, durable: str) -> None:
        self.server, self.stream, self.durable = server, stream, durable
        self.read: dict[int, Received] = {}
        self.deliveries = 0  # every message handed to the consumer, redeliveries included
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nats-drill-consumer", daemon=True)

    def start(self) -> "LiveConsumer":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                batch = self.server.fetch(self.stream, self.durable, batch=50, timeout_s=0.5)
            except Exception:  # the server is down: read again when it is back
                time.sleep(0.2)
                continue
            self.deliveries += len(batch)
            for message in batch:
                self.read[message.seq] = message
            if not batch:
                time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def event_ids(self) -> Counter[str]:
        return Counter(message.event_id for message in list(self.read.values()))


@pytest.mark.drill
def test_nats_stopped_for_60s_mid_drain_loses_nothing(cli_env, conn, tmp_path, record_property):
    server = NatsServer().start()
    relay: subprocess.Popen[str] | None = None
    consumer: LiveConsumer | None = None
    try:
        server.add_stream("DRILL", ["drill.>"])
        # A message the server delivered as it stopped never reached the reader: delivered again after
        # the ack wait, 30 s by default, which would outlast the wait for the reader below.
        server.add_consumer("DRILL", "reader", ack_wait_s=5.0)
        project = tmp_path / "project"
        project.mkdir()
        # Defaults everywhere that matters: the generic retry preset (1 s doubling to 60 s, 25 attempts),
        # the circuit (10 failures, a probe every 10 s), batch 100, 32 in flight, timeout 5 s.
        (project / "outbox.toml").write_text(
            f'[tables.{TABLE}]\ndestination = "nats"\nurl = "{server.url}"\ntopic_prefix = "drill."\n'
        )
        created = run_cli(cli_env, "db", "create-table", TABLE, cwd=project)
        assert created.returncode == 0, created.stderr
        Outbox(TABLE).enqueue_many(
            conn,
            [Message(topic="order.created", payload={"n": i}, event_id=f"drill-{i}") for i in range(MESSAGES)],
            outside_transaction=True,
        )
        consumer = LiveConsumer(server, "DRILL", "reader").start()
        log_path = tmp_path / "relay.log"
        with log_path.open("w") as log:
            relay = start_relay(
                cli_env,
                TABLE,
                "--max-seconds",
                "170",
                quiet=False,
                cwd=project,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        relay_log = lambda: log_path.read_text()[-4000:]  # noqa: E731
        started = time.monotonic()

        wait_until(
            lambda: len(consumer.event_ids()) >= MESSAGES // 3,
            60,
            "the consumer to read a third",
            interval_s=0.005,
            on_timeout=relay_log,
        )
        read_at_signal = len(consumer.event_ids())
        server.stop(signal.SIGTERM)  # returns once the process has exited
        stopped_at = time.monotonic()
        read_at_stop = len(consumer.event_ids())
        sent_at_stop = statuses(conn, TABLE).get("sent", 0)
        time.sleep(OUTAGE_S)  # the outage itself: wall-clock time is what is being drilled
        during = statuses(conn, TABLE)
        server.start()  # same port, same store directory
        restarted_at = time.monotonic()

        wait_until(
            lambda: statuses(conn, TABLE).get("sent", 0) == MESSAGES,
            90,
            "the table to report all sent",
            on_timeout=lambda: f"{statuses(conn, TABLE)}\n{relay_log()}",
        )
        drained_at = time.monotonic()
        reader = consumer
        wait_until(
            lambda: sum(reader.event_ids().values()) >= MESSAGES,
            30,
            "the consumer to read them all",
            on_timeout=lambda: (
                f"read {len(reader.event_ids())} distinct of {MESSAGES}; the stream holds "
                f"{server.stream_messages('DRILL')}; the consumer: {server.consumer_state('DRILL', 'reader')}"
            ),
        )
        status = run_cli(cli_env, "status", "--table", TABLE, cwd=project)

        ids = consumer.event_ids()
        in_stream = server.stream_messages("DRILL")
        attempts = conn.execute(
            f"SELECT max(attempts) AS most, count(*) FILTER (WHERE attempts > 1) AS retried FROM {TABLE}"
        ).fetchone()
        codes = {
            r["error_code"]: r["n"]
            for r in conn.execute(
                "SELECT error_code, count(*) AS n FROM outbox_audit WHERE outbox_table = %s AND error_code IS NOT NULL "
                "GROUP BY error_code",
                (TABLE,),
            ).fetchall()
        }
        figures = {
            "messages": MESSAGES,
            "outage_s": OUTAGE_S,
            "read_at_sigterm": read_at_signal,
            "read_when_stopped": read_at_stop,
            "sent_when_stopped": sent_at_stop,
            "table_during_outage": during,
            "table_after": statuses(conn, TABLE),
            "consumed_distinct": len(ids),
            "lost": sum(1 for i in range(MESSAGES) if f"drill-{i}" not in ids),
            "dead": statuses(conn, TABLE).get("dead", 0),
            "duplicates_in_stream": sum(n - 1 for n in ids.values()),
            "stream_messages": in_stream,
            "consumer_deliveries": consumer.deliveries,
            "rows_retried": attempts["retried"],
            "max_attempts": attempts["most"],
            "failure_codes": codes,
            "drain_after_restart_s": round(drained_at - restarted_at, 1),
            "total_s": round(drained_at - started, 1),
            "stopped_after_s": round(stopped_at - started, 1),
        }
        print("\nNATS outage drill:", json.dumps(figures))
        record_property("nats_outage_drill", figures)

        assert figures["table_after"] == {"sent": MESSAGES} and figures["dead"] == 0
        assert figures["lost"] == 0 and len(ids) == MESSAGES
        assert during.get("dead", 0) == 0  # nothing died of the outage while it lasted
        assert figures["duplicates_in_stream"] == 0 and in_stream == MESSAGES
        assert status.returncode == 0, status.stdout + status.stderr
    finally:
        stop_process(relay)
        if consumer is not None:
            consumer.stop()
        server.cleanup()
