"""The consumers of examples/consumers/ run as real processes against a real destination of each kind, fed by the
real ``outbox-pipelines relay``: the harness of the inbox drill (test_inbox_drill.py) and of the examples' own test
(core/inbox/test_consumer_examples.py). Each consumer prints ``new ID`` or ``duplicate ID`` after each commit."""

import base64
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.inbox.schema import create_inbox
from outbox_pipelines_tests.brokers.kafka_cluster import KafkaCluster
from outbox_pipelines_tests.brokers.nats_server import NatsServer
from outbox_pipelines_tests.brokers.rabbitmq_server import RabbitMQ, bind_queue
from outbox_pipelines_tests.conftest import run_cli
from outbox_pipelines_tests.helpers import statuses
from outbox_pipelines_tests.processes import free_port, port_open, start_logged, start_relay, stop_process, tail

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "consumers"
KINDS = ("http", "kafka", "rabbitmq", "nats")
SCRIPTS = {
    "http": "webhook_receiver.py",
    "kafka": "kafka_consumer.py",
    "rabbitmq": "rabbitmq_consumer.py",
    "nats": "nats_consumer.py",
}
TABLE = "inbox_drill"
TOPIC = "order.created"
# Quick retries and a short lease: a killed relay's batch is claimable again within seconds.
TABLE_TUNING = 'base = "200ms"\nmax_backoff = "2s"\nprobe_interval = "1s"\nlease = "5s"\nbatch_size = 50\n'


@dataclass
class Destination:
    """One started destination: the table's outbox.toml lines, the relay's extra environment, the consumer's."""

    kind: str
    table_lines: str
    relay_env: dict[str, str]
    consumer_env: dict[str, str]
    port: int | None = None  # the webhook receiver's: the consumer is up once it listens


@contextlib.contextmanager
def destination(kind: str, tmp_path: Path) -> Iterator[Destination]:
    """The broker (or, for webhooks, the receiver's port and secret) of ``kind``, stopped at the end by its pid."""
    if kind == "http":
        port, secret = free_port(), "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
        yield Destination(
            kind,
            f'destination = "http"\nurl = "http://127.0.0.1:{port}/shipping"\n'
            'signing_secret_env = "DRILL_WEBHOOK_SECRET"\n',
            {"DRILL_WEBHOOK_SECRET": secret},
            {"WEBHOOK_SECRET": secret, "PORT": str(port)},
            port,
        )
    elif kind == "kafka":
        with KafkaCluster(brokers=1) as cluster:
            cluster.create_topic(f"inbox.{TOPIC}", 3)
            yield Destination(
                kind,
                f'destination = "kafka"\nbootstrap_servers = "{cluster.bootstrap}"\ntopic_prefix = "inbox."\n',
                {},
                {
                    "KAFKA_BOOTSTRAP": cluster.bootstrap,
                    "KAFKA_TOPIC": f"inbox.{TOPIC}",
                    "KAFKA_SESSION_TIMEOUT_MS": "6000",
                },
            )
    elif kind == "rabbitmq":
        with RabbitMQ(prefix="outbox-inbox-drill-") as node:
            bind_queue(node.url, "inbox.events", "shipping", "inbox.#")
            yield Destination(
                kind,
                'destination = "rabbitmq"\nurl_env = "DRILL_RABBITMQ_URL"\nexchange = "inbox.events"\n'
                'topic_prefix = "inbox."\n',
                {"DRILL_RABBITMQ_URL": node.url},
                {"AMQP_URL": node.url, "AMQP_QUEUE": "shipping"},
            )
    elif kind == "nats":
        server = NatsServer().start()
        try:
            server.add_stream("INBOX", ["inbox.>"])
            # A short ack wait: what a crashed or stalled consumer had not acknowledged comes again within it.
            server.add_consumer("INBOX", "shipping", ack_wait_s=0.5)
            yield Destination(
                kind,
                f'destination = "nats"\nurl = "{server.url}"\ntopic_prefix = "inbox."\n',
                {},
                {"NATS_URL": server.url, "NATS_STREAM": "INBOX", "NATS_DURABLE": "shipping"},
            )
        finally:
            server.cleanup()
    else:
        raise ValueError(kind)


@dataclass
class Fleet:
    """The relay and the consumer of one destination, as processes killed with SIGKILL and started again."""

    dest: Destination
    db_url: str
    relay_env: dict[str, str]
    project: Path
    relay_log: Path
    consumer_log: Path
    relay: "subprocess.Popen[Any] | None" = None
    consumer: "subprocess.Popen[Any] | None" = None
    relay_kills: int = 0
    consumer_kills: int = 0
    consumer_pauses: int = 0
    # NATS: the first consumer stalls before its ack of this many messages, and is killed there (dies_before_ack.py).
    stall_at_ack: int | None = None
    consumer_starts: list[float] = field(default_factory=list)

    def start_relay(self) -> None:
        with self.relay_log.open("a") as log:
            self.relay = start_relay(
                self.relay_env, TABLE, "--max-seconds", "900", quiet=False, cwd=self.project, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def start_consumer(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
        env.update(self.dest.consumer_env, DATABASE_URL=self.db_url, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
        command = [sys.executable, str(EXAMPLES / SCRIPTS[self.dest.kind])]
        if self.stall_at_ack is not None:
            env["DRILL_STALL_AT_ACK"] = str(self.stall_at_ack)
            command.insert(1, str(Path(__file__).with_name("dies_before_ack.py")))
        self.consumer = start_logged(command, self.consumer_log, env=env, cwd=self.project)
        self.consumer_starts.append(time.monotonic())
        if self.dest.port is not None:
            deadline = time.monotonic() + 30
            while not port_open(self.dest.port):
                if self.consumer.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the webhook receiver did not listen:\n{tail(self.consumer_log, 30)}")
                time.sleep(0.02)

    @staticmethod
    def _kill(process: "subprocess.Popen[Any] | None") -> None:
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)

    def pause_consumer(self, seconds: float) -> None:
        """SIGSTOP the consumer for ``seconds``, then SIGCONT: a consumer stalled past its ack wait (a long GC
        pause, a slow disk) gets what it had fetched but not acknowledged again once it goes on."""
        assert self.consumer is not None
        os.kill(self.consumer.pid, signal.SIGSTOP)
        time.sleep(seconds)  # the stall is what is drilled
        os.kill(self.consumer.pid, signal.SIGCONT)
        self.consumer_pauses += 1

    def kill_if_stalled_before_ack(self) -> bool:
        """Kill the consumer once it stalls between a commit and its ack (started again without the stall)."""
        if self.stall_at_ack is None or "\nstalled-before-ack " not in self.consumer_log.read_text():
            return False
        self.stall_at_ack = None
        self.kill_consumer()
        return True

    def kill_relay(self) -> None:
        self._kill(self.relay)
        self.relay_kills += 1
        self.start_relay()

    def kill_consumer(self) -> None:
        self._kill(self.consumer)
        self.consumer_kills += 1
        self.start_consumer()

    def stop(self) -> None:
        stop_process(self.relay)
        stop_process(self.consumer)

    def lines(self) -> list[tuple[str, str]]:
        """(``new`` or ``duplicate``, message id) for every delivery a consumer committed, in order."""
        found = []
        for line in self.consumer_log.read_text().splitlines():
            verdict, _, message_id = line.partition(" ")
            if verdict in ("new", "duplicate") and message_id:
                found.append((verdict, message_id))
        return found

    def logs(self) -> str:
        return f"--- relay ---\n{tail(self.relay_log, 30)}\n--- consumer ---\n{tail(self.consumer_log, 30)}"


def prepare(dest: Destination, db_url: str, cli_env: dict[str, str], tmp_path: Path, messages: int) -> Fleet:
    """The outbox table (``db create-table``), the inbox and the consumer's ``shipments`` table (no unique key: the
    inbox alone keeps it to one row a message), and ``messages`` messages enqueued, event ids ``inbox-<i>``."""
    project = tmp_path / f"project-{dest.kind}"
    project.mkdir()
    (project / "outbox.toml").write_text(f"[tables.{TABLE}]\n{dest.table_lines}{TABLE_TUNING}")
    relay_env = {**cli_env, **dest.relay_env, "OUTBOX_CONFIG": str(project / "outbox.toml")}
    created = run_cli(relay_env, "db", "create-table", TABLE, cwd=project)
    assert created.returncode == 0, created.stderr
    create_inbox(db_url, "shipping_inbox")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE shipments (id bigserial PRIMARY KEY, event_id text NOT NULL, payload jsonb)")
        Outbox(TABLE).enqueue_many(
            conn,
            [Message(topic=TOPIC, payload={"n": i}, event_id=f"inbox-{i}") for i in range(messages)],
            outside_transaction=True,
        )
    fleet = Fleet(dest, db_url, relay_env, project, project / "relay.log", project / "consumer.log")
    if dest.kind == "nats":  # the relay's resends are deduplicated by JetStream: the consumer makes the duplicate
        fleet.stall_at_ack = 30
    return fleet


def effects(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """(rows in ``shipments``, distinct event ids among them)."""
    row = conn.execute("SELECT count(*) AS n, count(DISTINCT event_id) AS d FROM shipments").fetchone()
    assert row is not None
    return int(row["n"]), int(row["d"])


def sent(conn: psycopg.Connection[Any]) -> int:
    return statuses(conn, TABLE).get("sent", 0)


def unsent(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    """What holds the messages not sent, for a drill's failure: counts by status, attempts and last error code."""
    found = conn.execute(
        sql.SQL(
            "SELECT status, attempts, last_error_code AS code, left(min(last_error), 200) AS error, count(*) AS n "
            "FROM {} WHERE status <> 'sent' GROUP BY 1, 2, 3 ORDER BY n DESC LIMIT 10"
        ).format(sql.Identifier(TABLE))
    )
    return [dict(row) for row in found]
