"""The NATS JetStream destination against a real nats-server (JetStream on), read by a real consumer.

Each test starts its own server (a free port, a store of its own) and stops it by pid. What is checked is
what a user checks: what a JetStream consumer reads, and the rows' status, code and last_error.
"""

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations.nats.jetstream import NatsJetStreamDestination, build
from outbox_pipelines.core.models import ClaimedMessage
from outbox_pipelines.core.redaction import url_origin
from outbox_pipelines.core.relay import Relay
from outbox_pipelines.core.settings.brokers import BrokerSettings
from outbox_pipelines_tests.brokers.nats_server import NatsServer
from outbox_pipelines_tests.conftest import run_cli, table_settings
from outbox_pipelines_tests.helpers import enqueue_n, rows, statuses

pytestmark = pytest.mark.slow  # a real nats-server

EVENTS = "outbox_events"
PASSWORD = "pw-never-shown-7c1e"
TOKEN = "tok-never-shown-93ab"


@pytest.fixture
def nats_server() -> Iterator[NatsServer]:
    server = NatsServer().start()
    yield server
    server.cleanup()


def settings(url: str, **overrides: object):
    broker = BrokerSettings(
        kind="nats", url=url, shown=url_origin(url), topic_prefix=str(overrides.pop("topic_prefix", ""))
    )
    return table_settings(
        EVENTS,
        **{
            "destination": "nats",
            "broker": broker,
            "mode": "competing",
            "idle_sleep_s": 0.01,
            "timeout_s": 2.0,
            **overrides,
        },
    )


def relay_once(db_url: str, url: str, **overrides: object) -> tuple[NatsJetStreamDestination, object]:
    table = settings(url, **overrides)
    destination = build(table)
    try:
        report = Relay(db_url, table, destination).run(once=True)
    finally:
        destination.close()
    return destination, report


def by_event(conn) -> dict[str, dict]:
    return {r["event_id"]: r for r in rows(conn, EVENTS)}


def claimed(row: dict) -> ClaimedMessage:
    return ClaimedMessage(
        id=row["id"],
        event_id=row["event_id"],
        tenant_id=row["tenant_id"],
        topic=row["topic"],
        payload=row["payload"],
        payload_sha=row["payload_sha"],
        headers=row["headers"],
        attempts=1,
        created_at=row["created_at"],
    )


def test_a_drain_reaches_a_consumer_once_each_with_its_keys(db_url, conn, nats_server):
    nats_server.add_stream("SHOP", ["shop.>"])
    Outbox(EVENTS).enqueue_many(
        conn,
        [
            Message(
                topic="order.created" if i % 2 else "order.paid",
                payload={"n": i},
                event_id=f"ev-{i}",
                tenant_id="acme" if i == 3 else None,
                headers={"trace_id": f"trace-{i}"},
            )
            for i in range(300)
        ],
        outside_transaction=True,
    )
    destination, report = relay_once(db_url, nats_server.url, topic_prefix="shop.", batch_size=100)
    assert statuses(conn, EVENTS) == {"sent": 300} and report.sent == 300
    read = nats_server.consume("SHOP")
    assert sorted(r.event_id for r in read) == sorted(f"ev-{i}" for i in range(300))
    refs = {event_id: row["result_ref"] for event_id, row in by_event(conn).items()}
    for received in read:
        n = received.json()["n"]
        topic = "order.created" if n % 2 else "order.paid"
        assert received.event_id == f"ev-{n}" == received.headers["Idempotency-Key"]
        assert received.subject == f"shop.{topic}" and received.headers["X-Outbox-Topic"] == topic
        assert received.headers["X-Trace-Id"] == f"trace-{n}"
        assert refs[received.event_id] == f"SHOP:{received.seq}"  # the row names where the message is
    assert next(r for r in read if r.event_id == "ev-3").headers["X-Tenant-Id"] == "acme"
    assert destination.name == nats_server.url


def test_an_event_published_again_is_stored_once(db_url, conn, nats_server):
    """A relay that published and died before recording it: the next relay publishes the same events again;
    JetStream drops the copies by Nats-Msg-Id and acks them as duplicates, which count as sent."""
    nats_server.add_stream("EV", ["t.>"])
    enqueue_n(conn, EVENTS, 5, topic="t.done")
    crashed = NatsJetStreamDestination(nats_server.url, timeout_s=2)
    try:
        first = crashed.deliver([claimed(row) for row in rows(conn, EVENTS)])
    finally:
        crashed.close()
    assert {o.kind for o in first} == {"sent"}
    relay_once(db_url, nats_server.url)
    assert statuses(conn, EVENTS) == {"sent": 5}
    assert [row["result_ref"] for row in rows(conn, EVENTS)] == [o.ref for o in first]  # the copies it holds
    assert sorted(r.event_id for r in nats_server.consume("EV")) == [f"e{i}" for i in range(5)]


def test_each_bad_input_ends_with_its_code_and_the_rest_of_the_batch_is_sent(db_url, conn):
    server = NatsServer(max_payload=4096).start()
    try:
        server.add_stream("S", ["t.>"], max_msg_size=2500)
        bad = {
            "too-large": ("t.ok", {"x": "y" * 5000}),  # past the server's max_payload: refused before sending
            "stream-limit": ("t.ok", {"x": "y" * 3000}),  # past the stream's max_msg_size: JetStream's 10054
            "space": ("t.has space", {}),
            "star": ("t.*", {}),
            "gt": ("t.>", {}),
            "empty-token": ("t..x", {}),
            "trailing-dot": ("t.", {}),
            "system": ("$JS.API.STREAM.DELETE.S", {}),
            "no-stream": ("elsewhere.x", {}),
        }
        messages = [Message(topic="t.ok", payload={"n": i}, event_id=f"good-{i}") for i in range(10)]
        messages[5:5] = [Message(topic=topic, payload=payload, event_id=name) for name, (topic, payload) in bad.items()]
        Outbox(EVENTS).enqueue_many(conn, messages, outside_transaction=True)
        relay_once(db_url, server.url, batch_size=100)
        ended = {event_id: (row["status"], row["last_error_code"]) for event_id, row in by_event(conn).items()}
        assert ended == {
            **{f"good-{i}": ("sent", None) for i in range(10)},
            **{name: ("dead", m.BAD_REQUEST) for name in bad if name != "no-stream"},
            "no-stream": ("dead", m.NO_SUBSCRIBERS),
        }
        errors = {event_id: row["last_error"] for event_id, row in by_event(conn).items()}
        assert "max_payload (4,096 bytes)" in errors["too-large"]
        assert "message size exceeds maximum allowed" in errors["stream-limit"]
        assert "wildcard" in errors["star"] and "wildcard" in errors["gt"] and "empty token" in errors["empty-token"]
        assert "no JetStream stream" in errors["no-stream"] and "'elsewhere.x'" in errors["no-stream"]
        assert sorted(r.event_id for r in server.consume("S")) == sorted(f"good-{i}" for i in range(10))
        assert server.stream_messages("S") == 10  # and the stream was not touched by "$JS.API..."
    finally:
        server.cleanup()


def test_wrong_credentials_open_the_circuit_and_are_never_shown(db_url, conn):
    server = NatsServer(user="relay", password=PASSWORD).start()
    try:
        server.add_stream("S", ["t.>"])
        enqueue_n(conn, EVENTS, 30, topic="t.x")
        wrong = f"nats://relay:wrong-{PASSWORD}@127.0.0.1:{server.port}"
        table = settings(wrong, batch_size=10, circuit_threshold=5, probe_interval_s=0.3)
        destination = build(table)
        try:
            report = Relay(db_url, table, destination).run(max_seconds=1.5)
        finally:
            destination.close()
        assert report.circuit == "open" and report.destination_failures.get(m.UNAUTHORIZED)
        # the outage spent no attempt and killed nothing
        assert {(r["status"], r["attempts"]) for r in rows(conn, EVENTS)} == {("pending", 0)}
        health = conn.execute("SELECT * FROM outbox_destination_health WHERE table_name = %s", (EVENTS,)).fetchone()
        assert "refused the credentials" in health["last_error"]
        shown = [
            health["last_error"],
            health["destination"],
            destination.name,
            *(r["last_error"] or "" for r in rows(conn, EVENTS)),
            *(r["detail"] or "" for r in conn.execute("SELECT detail FROM outbox_audit").fetchall()),
        ]
        assert not any(PASSWORD in text for text in shown), shown
        assert destination.name == server.url
        # the right password: the next probe succeeds, the circuit closes, everything goes
        right = settings(f"nats://relay:{PASSWORD}@127.0.0.1:{server.port}", probe_interval_s=0.3)
        fixed = build(right)
        try:
            Relay(db_url, right, fixed).run(max_seconds=2.0)
        finally:
            fixed.close()
        assert statuses(conn, EVENTS) == {"sent": 30}
        assert len(server.consume("S")) == 30
    finally:
        server.cleanup()


def test_a_token_authenticates_and_a_wrong_one_is_unauthorized():
    server = NatsServer(token=TOKEN).start()
    try:
        server.add_stream("S", ["t.>"])
        message = ClaimedMessage(
            id=1,
            event_id="tok-1",
            tenant_id=None,
            topic="t.x",
            payload={},
            payload_sha="",
            headers={},
            attempts=1,
            created_at=datetime.now(UTC),
        )
        for token, expected in ((TOKEN, "sent"), (f"bad-{TOKEN}", m.UNAUTHORIZED)):
            destination = NatsJetStreamDestination(server.url, token=token, timeout_s=2)
            try:
                [outcome] = destination.deliver([message])
            finally:
                destination.close()
            assert (outcome.code or outcome.kind) == expected, outcome
            assert TOKEN not in (outcome.error or "") and TOKEN not in destination.name
    finally:
        server.cleanup()


def test_a_publish_the_server_denies_is_unauthorized_and_the_others_are_sent(db_url, conn):
    server = NatsServer(user="relay", password=PASSWORD, deny_publish=["t.secret"]).start()
    try:
        server.add_stream("S", ["t.>"])
        Outbox(EVENTS).enqueue_many(
            conn,
            [Message(topic="t.secret" if i == 2 else "t.open", payload={"n": i}, event_id=f"p{i}") for i in range(6)],
            outside_transaction=True,
        )
        started = time.monotonic()
        relay_once(db_url, f"nats://relay:{PASSWORD}@127.0.0.1:{server.port}")
        assert time.monotonic() - started < 2.0  # answered when the server said no, not at the ack timeout
        ended = {e: (r["status"], r["attempts"], r["last_error_code"]) for e, r in by_event(conn).items()}
        assert ended == {**{f"p{i}": ("sent", 1, None) for i in (0, 1, 3, 4, 5)}, "p2": ("pending", 1, m.UNAUTHORIZED)}
        assert "'t.secret'" in by_event(conn)["p2"]["last_error"]
        assert sorted(r.event_id for r in server.consume("S")) == ["p0", "p1", "p3", "p4", "p5"]
    finally:
        server.cleanup()


def test_a_server_without_jetstream_is_a_broker_failure_not_a_dead_letter(conn):
    server = NatsServer(jetstream=False).start()
    try:
        enqueue_n(conn, EVENTS, 2, topic="t.x")
        destination = NatsJetStreamDestination(server.url, timeout_s=2)
        try:
            outcomes = destination.deliver([claimed(row) for row in rows(conn, EVENTS)])
        finally:
            destination.close()
        assert {(o.kind, o.code) for o in outcomes} == {("retry", m.BROKER_5XX)}
        assert "JetStream on NATS" in (outcomes[0].error or "") and "not answering" in (outcomes[0].error or "")
    finally:
        server.cleanup()


def test_a_full_stream_is_a_broker_failure_retried_not_a_dead_letter(conn, nats_server):
    nats_server.add_stream("FULL", ["t.>"], max_msgs=2, discard="new")
    enqueue_n(conn, EVENTS, 4, topic="t.x")
    destination = NatsJetStreamDestination(nats_server.url, timeout_s=2)
    try:
        outcomes = destination.deliver([claimed(row) for row in rows(conn, EVENTS)])
    finally:
        destination.close()
    assert [(o.kind, o.code) for o in outcomes] == [("sent", None)] * 2 + [("retry", m.BROKER_5XX)] * 2
    assert "maximum messages exceeded" in (outcomes[2].error or "")


def test_a_broker_that_goes_down_opens_the_circuit_and_the_next_batch_reconnects(db_url, conn, nats_server):
    nats_server.add_stream("S", ["t.>"])
    table = settings(nats_server.url, batch_size=10, circuit_threshold=5, probe_interval_s=0.3)
    destination = build(table)  # one destination, one connection, across the outage
    try:
        enqueue_n(conn, EVENTS, 10, topic="t.x", prefix="before-")
        Relay(db_url, table, destination).run(once=True)
        assert statuses(conn, EVENTS) == {"sent": 10}
        nats_server.stop()
        enqueue_n(conn, EVENTS, 40, topic="t.x", prefix="during-")
        started = time.monotonic()
        outcomes = destination.deliver([claimed(row) for row in rows(conn, EVENTS, "status = 'pending'")][:10])
        assert time.monotonic() - started < table.timeout_s + 1
        assert {o.kind for o in outcomes} == {"retry"} and {o.code for o in outcomes} <= m.NETWORK_FAILURES
        report = Relay(db_url, table, destination).run(max_seconds=1.5)
        assert report.circuit == "open" and report.dead == 0
        assert {(r["status"], r["attempts"]) for r in rows(conn, EVENTS, "status <> 'sent'")} == {("pending", 0)}
        nats_server.start()  # same port, same store: the next probe reconnects, the circuit closes
        Relay(db_url, table, destination).run(max_seconds=2.0)
        assert statuses(conn, EVENTS) == {"sent": 50}
    finally:
        destination.close()
    read = [r.event_id for r in nats_server.consume("S")]
    assert sorted(read) == sorted({*(f"before-{i}" for i in range(10)), *(f"during-{i}" for i in range(40))})


def test_relay_once_from_a_project_with_its_own_outbox_toml(cli_env, conn, tmp_path):
    server = NatsServer(user="shop", password=PASSWORD).start()
    try:
        server.add_stream("ORDERS", ["shop.>"])
        project = tmp_path / "project"
        project.mkdir()
        (project / "outbox.toml").write_text(
            '[tables.nats_orders]\ndestination = "nats"\nurl_env = "ORDERS_NATS_URL"\ntopic_prefix = "shop."\n'
            'timeout = "2s"\nmode = "competing"\n'
        )
        env = {**cli_env, "ORDERS_NATS_URL": f"nats://shop:{PASSWORD}@127.0.0.1:{server.port}"}
        created = run_cli(env, "db", "create-table", "nats_orders", cwd=project)
        assert created.returncode == 0, created.stderr
        for i in range(3):
            queued = run_cli(
                env,
                "enqueue",
                "--table",
                "nats_orders",
                "--topic",
                "order.created",
                "--payload",
                f'{{"order": {i}}}',
                cwd=project,
            )
            assert queued.returncode == 0, queued.stderr
        relay = run_cli(env, "relay", "--table", "nats_orders", "--once", cwd=project)
        assert relay.returncode == 0 and "sent 3" in relay.stdout, relay.stdout + relay.stderr
        status = run_cli(env, "status", "--table", "nats_orders", cwd=project)
        assert PASSWORD not in relay.stdout + relay.stderr + status.stdout + status.stderr
        read = server.consume("ORDERS")
        assert sorted(r.json()["order"] for r in read) == [0, 1, 2]
        assert {r.subject for r in read} == {"shop.order.created"}
        assert statuses(conn, "nats_orders") == {"sent": 3}
    finally:
        server.cleanup()
