"""Each broker as a team declares it in its own Dagster project (``outbox_definitions``, the
OutboxComponent's tables): the relay group job delivers to a real server, a real consumer reads every
message, the checks pass, and the credential appears in no run log, metadata or check."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import dagster as dg
import pytest

from outbox_pipelines.core.storage import schema
from outbox_pipelines.defs.factory import declaration_of, outbox_definitions
from outbox_pipelines.defs.resources import outbox_resources
from outbox_pipelines_tests.brokers.kafka_cluster import KafkaCluster, read_topic
from outbox_pipelines_tests.brokers.nats_server import NatsServer
from outbox_pipelines_tests.brokers.rabbitmq_server import RabbitMQ, bind_queue, drain_queue
from outbox_pipelines_tests.helpers import enqueue_n, statuses

pytestmark = pytest.mark.slow  # real brokers under a Dagster job

TABLE = "billing_outbox"
COUNT = 30
PASSWORD = "dagster-broker-pw-5d1f"


@dataclass
class Broker:
    """A running broker as the test sees it: the table's section, the messages' topic, what a consumer read."""

    section: dict[str, Any]
    topic: str
    read: Callable[[], list[str]]
    secret: str


@contextmanager
def nats_broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[Broker]:
    server = NatsServer(user="relay", password=PASSWORD).start()
    try:
        server.add_stream("BILLING", ["billing.>"])
        monkeypatch.setenv("BILLING_BROKER_URL", server.admin_url)
        yield Broker(
            {"destination": "nats", "url_env": "BILLING_BROKER_URL", "topic_prefix": "billing."},
            "invoice.issued",
            lambda: [r.event_id for r in server.consume("BILLING")],
            PASSWORD,
        )
    finally:
        server.cleanup()


@contextmanager
def rabbitmq_broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[Broker]:
    with RabbitMQ() as node:
        bind_queue(node.url, "billing.events", "billing-consumer")
        monkeypatch.setenv("BILLING_BROKER_URL", node.url)
        yield Broker(
            {"destination": "rabbitmq", "url_env": "BILLING_BROKER_URL", "exchange": "billing.events"},
            "invoice.issued",
            lambda: [str(r.message_id) for r in drain_queue(node.url, "billing-consumer")],
            RabbitMQ.PASSWORD,
        )


@contextmanager
def kafka_broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[Broker]:
    with KafkaCluster(brokers=1) as cluster:
        cluster.create_topic("billing.invoice.issued", 3)
        yield Broker(
            {"destination": "kafka", "bootstrap_servers": cluster.bootstrap, "topic_prefix": "billing."},
            "invoice.issued",
            lambda: [r.headers["idempotency-key"] for r in read_topic(cluster.bootstrap, "billing.invoice.issued")],
            PASSWORD,
        )


BROKERS = {"nats": nats_broker, "rabbitmq": rabbitmq_broker, "kafka": kafka_broker}


@pytest.mark.parametrize("kind", sorted(BROKERS))
def test_the_relay_group_job_delivers_to_the_broker_and_shows_no_credential(kind, db_url, conn, monkeypatch):
    with BROKERS[kind](monkeypatch) as broker:
        tables = {TABLE: {**broker.section, "timeout": "3s", "mode": "competing"}}
        resources = outbox_resources(url=db_url, declaration=declaration_of(tables))
        defs = outbox_definitions(tables, resources=resources)
        assert schema.create_table(db_url, TABLE)
        enqueue_n(conn, TABLE, COUNT, topic=broker.topic, prefix=f"{kind}-")
        with dg.instance_for_test() as instance:
            job = defs.resolve_job_def("relay_group_default_job")
            result = job.execute_in_process(
                instance=instance,
                raise_on_error=False,
                run_config={"ops": {"relay_group": {"config": {"group": "default", "once": True}}}},
            )
            assert result.success, [e.message for e in result.all_events if e.is_failure]
            logs = [repr(record) for record in instance.all_logs(result.run_id)]
        assert statuses(conn, TABLE) == {"sent": COUNT}
        assert sorted(broker.read()) == sorted(f"{kind}-{i}" for i in range(COUNT))
        assert not [line for line in logs if broker.secret in line]
