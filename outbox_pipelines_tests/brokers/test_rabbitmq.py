"""The RabbitMQ destination against a real RabbitMQ node (Debian's package), one node for the module.

What a user checks: what a consumer reads from a queue bound to the table's exchange (counted by
message_id = event_id), the rows' status and codes, and that no credential shows anywhere. Every bad
input a broker refuses ends with its code while the rest of its batch is sent; a broker that is down or
refuses the login opens the table's circuit with nothing dead.
"""

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations.rabbitmq import outcomes as answers
from outbox_pipelines.core.destinations.rabbitmq.destination import RabbitMQDestination, build
from outbox_pipelines.core.operations.replay import ReplayFilter, replay_dead
from outbox_pipelines.core.redaction import url_origin
from outbox_pipelines.core.relay import Relay
from outbox_pipelines.core.settings import TableSettings
from outbox_pipelines.core.settings.brokers import BrokerSettings
from outbox_pipelines_tests.brokers.rabbitmq_server import RabbitMQ, bind_queue, drain_queue, installed
from outbox_pipelines_tests.conftest import run_cli, table_settings
from outbox_pipelines_tests.core.destinations.http.test_http import claimed
from outbox_pipelines_tests.helpers import rows, statuses
from outbox_pipelines_tests.processes import free_port, silent_port

pytestmark = [
    pytest.mark.skipif(not installed(), reason="rabbitmq-server is not installed (bash .ci/run installs it)"),
    pytest.mark.slow,  # real RabbitMQ nodes
]

TABLE = "outbox_events"
MAX_MESSAGE_SIZE = 64 * 1024
PASSWORD = RabbitMQ.PASSWORD


@pytest.fixture(scope="module")
def node() -> Iterator[RabbitMQ]:
    with RabbitMQ(
        max_message_size=MAX_MESSAGE_SIZE,
        users={"nobody": "nobody-pw-7", "reader": "reader-pw-8"},
        permissions={"nobody": None, "reader": (".*", "^$", ".*")},
    ) as server:
        yield server


@pytest.fixture
def exchange(request) -> str:
    """An exchange (and queue name) of this test's own: tests share the node, not its topology."""
    return "ex-" + request.node.name.replace("[", "-").replace("]", "")[:80]


def settings(url: str, exchange: str, **overrides: object) -> TableSettings:
    broker = BrokerSettings(
        kind="rabbitmq",
        url=url,
        shown=url_origin(url),
        exchange=exchange,
        topic_prefix=str(overrides.pop("topic_prefix", "")),
    )
    return table_settings(
        TABLE,
        **{
            "destination": "rabbitmq",
            "broker": broker,
            "mode": "competing",
            "idle_sleep_s": 0.01,
            "timeout_s": 2.0,
            **overrides,
        },
    )


def enqueue(conn, messages: list[Message]) -> None:
    Outbox(TABLE).enqueue_many(conn, messages, outside_transaction=True)


def relay_once(db_url: str, table: TableSettings):
    destination = build(table)
    try:
        return Relay(db_url, table, destination).run(once=True)
    finally:
        destination.close()


def by_event(conn) -> dict[str, dict]:
    return {r["event_id"]: r for r in rows(conn, TABLE)}


# -- delivered --------------------------------------------------------------------------------------


def test_a_drain_reaches_the_bound_queue_once_each_in_order_with_its_event_id(node, db_url, conn, exchange):
    bind_queue(node.url, exchange, exchange, "prod.order.*")
    messages = [
        Message(
            topic="order.created",
            payload={"n": i, "text": "grüße"},
            event_id=f"ev-{i}",
            tenant_id="acme" if i % 2 else None,
        )
        for i in range(250)
    ]
    enqueue(conn, messages)
    report = relay_once(db_url, settings(node.url, exchange, topic_prefix="prod.", batch_size=100))
    assert report.sent == 250 and statuses(conn, TABLE) == {"sent": 250}
    got = drain_queue(node.url, exchange)
    # one channel, publishes in claim order: the queue holds them in enqueue order, each once
    assert [r.message_id for r in got] == [f"ev-{i}" for i in range(250)]
    first, second = got[0], got[1]
    assert first.routing_key == "prod.order.created"
    assert json.loads(first.body) == {"n": 0, "text": "grüße"}
    assert (first.delivery_mode, first.content_type) == (2, "application/json")
    assert first.headers == {"Idempotency-Key": "ev-0"}
    assert second.headers == {"Idempotency-Key": "ev-1", "X-Tenant-Id": "acme"}


def test_the_connection_is_kept_across_batches_and_the_exchange_declared_once(node, exchange):
    bind_queue(node.url, exchange, exchange)
    destination = RabbitMQDestination(node.url, exchange=exchange, timeout_s=2)
    try:
        for batch in range(3):
            outcomes = destination.deliver([claimed(f"keep-{batch}-{i}") for i in range(10)])
            assert {o.kind for o in outcomes} == {"sent"}
        names = [line for line in node.ctl("list_connections", "client_properties").splitlines() if exchange in line]
        assert len(names) == 1, names
    finally:
        destination.close()
    assert len(drain_queue(node.url, exchange)) == 30


# -- what the broker refuses --------------------------------------------------------------------------


def test_an_unroutable_message_is_dead_no_subscribers_and_replays_without_force_once_bound(
    node, db_url, conn, exchange
):
    bind_queue(node.url, exchange, exchange, "order.*")
    enqueue(
        conn,
        [Message(topic="order.created", payload={"i": i}, event_id=f"ok-{i}") for i in range(5)]
        + [Message(topic="invoice.created", payload={"i": 0}, event_id="lost-0")],
    )
    relay_once(db_url, settings(node.url, exchange))
    found = by_event(conn)
    assert (found["lost-0"]["status"], found["lost-0"]["last_error_code"]) == ("dead", m.NO_SUBSCRIBERS)
    assert "no queue is bound" in found["lost-0"]["last_error"] and "invoice.created" in found["lost-0"]["last_error"]
    assert statuses(conn, TABLE) == {"sent": 5, "dead": 1}
    # the consumers' side fixes its binding; a replay without --force delivers it
    bind_queue(node.url, exchange, exchange, "invoice.*")
    assert replay_dead(db_url, TABLE, ReplayFilter(error_code=m.NO_SUBSCRIBERS)).replayed == 1
    relay_once(db_url, settings(node.url, exchange))
    assert statuses(conn, TABLE) == {"sent": 6}
    assert sorted(r.message_id or "" for r in drain_queue(node.url, exchange)) == [
        "lost-0",
        *(f"ok-{i}" for i in range(5)),
    ]


def test_a_message_over_the_max_size_is_dead_and_the_rest_of_its_batch_is_sent(node, db_url, conn, exchange):
    """RabbitMQ closes the channel of a message over max_message_size, failing every publish in flight on it:
    the destination reopens it, sends the others again, and refuses the next big one before sending."""
    bind_queue(node.url, exchange, exchange)
    big = {"blob": "x" * (MAX_MESSAGE_SIZE + 100)}
    enqueue(conn, [Message(topic="t", payload=big if i in (7, 20) else {"i": i}, event_id=f"m-{i}") for i in range(40)])
    table = settings(node.url, exchange, batch_size=40)
    destination = build(table)
    try:
        Relay(db_url, table, destination).run(once=True)
        found = by_event(conn)
        for big_one in ("m-7", "m-20"):
            assert (found[big_one]["status"], found[big_one]["last_error_code"]) == ("dead", m.BAD_REQUEST)
            assert f"max_message_size ({MAX_MESSAGE_SIZE} bytes)" in found[big_one]["last_error"]
        assert statuses(conn, TABLE) == {"sent": 38, "dead": 2}
        # the limit is known now: a big message is refused before it goes on the wire, the channel kept
        enqueue(
            conn, [Message(topic="t", payload=big, event_id="m-late"), Message(topic="t", payload={}, event_id="m-ok")]
        )
        Relay(db_url, table, destination).run(once=True)
        assert by_event(conn)["m-late"]["last_error_code"] == m.BAD_REQUEST
        assert by_event(conn)["m-ok"]["status"] == "sent"
    finally:
        destination.close()
    got = [r.message_id for r in drain_queue(node.url, exchange)]
    # every small message arrived; those in flight when the channel closed may have been routed before it
    # closed and were sent again (at least once)
    assert set(got) == {f"m-{i}" for i in range(40) if i not in (7, 20)} | {"m-ok"}


def test_a_refusal_that_names_no_size_is_traced_to_its_message_by_publishing_one_at_a_time(node, exchange, monkeypatch):
    """Should the broker's words change (another version, another 406), the culprit is still found: the
    unconfirmed rest goes one publish at a time, and the one whose publish closes the channel is dead."""
    import outbox_pipelines.core.destinations.rabbitmq.outcomes as rabbitmq

    monkeypatch.setattr(rabbitmq, "_TOO_LARGE", re.compile(r"(?!)"))  # understands no refusal text
    bind_queue(node.url, exchange, exchange)
    big = {"blob": "x" * (MAX_MESSAGE_SIZE + 100)}
    destination = RabbitMQDestination(node.url, exchange=exchange, timeout_s=2)
    try:
        outcomes = destination.deliver([claimed(f"s-{i}", payload=big if i == 3 else None) for i in range(10)])
    finally:
        destination.close()
    assert [(o.kind, o.code) for o in outcomes] == [("sent", None)] * 3 + [("dead", m.BAD_REQUEST)] + [
        ("sent", None)
    ] * 6
    assert "PRECONDITION_FAILED" in (outcomes[3].error or "") and destination.max_body is None
    assert {r.message_id for r in drain_queue(node.url, exchange)} == {f"s-{i}" for i in range(10) if i != 3}


def test_a_routing_key_over_255_bytes_is_dead_before_sending(node, exchange):
    bind_queue(node.url, exchange, exchange)
    destination = RabbitMQDestination(node.url, exchange=exchange, topic_prefix="prefix.", timeout_s=2)
    try:
        outcomes = destination.deliver(
            [claimed("a"), claimed("long", topic="é" * 130), claimed("b"), claimed("é" * 200)]
        )
    finally:
        destination.close()
    assert [(o.kind, o.code) for o in outcomes] == [
        ("sent", None),
        ("dead", m.BAD_REQUEST),
        ("sent", None),
        ("dead", m.BAD_REQUEST),
    ]
    assert "routing key (267 bytes" in (outcomes[1].error or "")
    assert "message_id" in (outcomes[3].error or "")
    assert [r.message_id for r in drain_queue(node.url, exchange)] == ["a", "b"]


def test_a_full_queue_that_rejects_publishes_is_a_nack_retried_as_broker_5xx(node, exchange):
    bind_queue(node.url, exchange, exchange, arguments={"x-max-length": 3, "x-overflow": "reject-publish"})
    destination = RabbitMQDestination(node.url, exchange=exchange, timeout_s=2, max_in_flight=1)
    try:
        outcomes = destination.deliver([claimed(f"q-{i}") for i in range(5)])
    finally:
        destination.close()
    assert [(o.kind, o.code) for o in outcomes] == [("sent", None)] * 3 + [("retry", m.BROKER_5XX)] * 2
    assert "basic.nack" in (outcomes[3].error or "")


# -- credentials and an unreachable broker --------------------------------------------------------------


@pytest.mark.parametrize(
    ("user", "password", "says"),
    [
        ("outbox", "wrong-password-3", "refused the login"),
        ("nobody", "nobody-pw-7", "refused to open the vhost"),
        ("reader", "reader-pw-8", "ACCESS_REFUSED"),  # may declare, may not write to the exchange
    ],
)
def test_a_refused_login_or_publish_is_unauthorized_and_opens_the_circuit_with_nothing_dead(
    node, db_url, conn, exchange, user, password, says
):
    bind_queue(node.url, exchange, exchange)
    url = node.url_for(user, password)
    enqueue(conn, [Message(topic="t", payload={"i": i}, event_id=f"a-{i}") for i in range(6)])
    table = settings(url, exchange, batch_size=2, circuit_threshold=2, probe_interval_s=60)
    destination = build(table)
    try:
        assert password not in destination.name and destination.name == f"amqp://127.0.0.1:{node.port}"
        [outcome] = destination.deliver([claimed("probe")])
        assert (outcome.kind, outcome.code) == ("retry", m.UNAUTHORIZED) and says in (outcome.error or "")
        assert password not in (outcome.error or "")
        report = Relay(db_url, table, destination).run(once=True)
    finally:
        destination.close()
    assert report.circuit == "open"
    assert {(r["status"], r["attempts"]) for r in rows(conn, TABLE)} == {("pending", 0)}
    assert drain_queue(node.url, exchange) == []
    shown = " ".join(str(v) for r in conn.execute("SELECT * FROM outbox_audit").fetchall() for v in r.values())
    shown += " ".join(str(r["last_error"]) for r in rows(conn, TABLE))
    assert password not in shown


def test_a_broker_that_is_down_answers_network_timeout_at_once_and_opens_the_circuit(db_url, conn, exchange):
    url = f"amqp://outbox:{PASSWORD}@127.0.0.1:{free_port()}/"
    enqueue(conn, [Message(topic="t", payload={"i": i}, event_id=f"d-{i}") for i in range(9)])
    table = settings(url, exchange, batch_size=3, circuit_threshold=3, probe_interval_s=60)
    destination = build(table)
    try:
        started = time.monotonic()
        outcomes = destination.deliver([claimed("x"), claimed("y")])
        assert time.monotonic() - started < 1
        assert {(o.kind, o.code) for o in outcomes} == {("retry", m.CONNECTION_REFUSED)}  # nothing listens there
        assert PASSWORD not in (outcomes[0].error or "")
        report = Relay(db_url, table, destination).run(once=True)
    finally:
        destination.close()
    assert report.circuit == "open" and report.dead == 0
    assert {(r["status"], r["attempts"]) for r in rows(conn, TABLE)} == {("pending", 0)}


def test_a_broker_that_never_answers_gives_network_timeout_within_the_table_timeout(exchange):
    """A port that takes the connection and says nothing (a hung broker, a black hole): the batch ends in
    about the table's timeout, never hangs the relay."""
    with silent_port() as port:  # the kernel completes the handshake; nobody ever answers
        url = f"amqp://outbox:{PASSWORD}@127.0.0.1:{port}/"
        destination = RabbitMQDestination(url, exchange=exchange, timeout_s=1.0)
        try:
            started = time.monotonic()
            outcomes = destination.deliver([claimed("h-1"), claimed("h-2")])
            took = time.monotonic() - started
        finally:
            destination.close()
    assert {(o.kind, o.code) for o in outcomes} == {("retry", m.NETWORK_TIMEOUT)}
    assert 0.9 < took < 2.5, took


def test_a_lost_connection_is_retried_and_the_next_batch_reconnects(node, exchange):
    """The broker killed and started again: the batch in flight is a retry, and the next batches deliver it.
    A restarted RabbitMQ answers AMQP before it has restored its queues' bindings, and returned a message
    published then in 1 of 6 runs: that must be a retry too (sent at a later attempt), never dead."""
    bind_queue(node.url, exchange, exchange)
    destination = RabbitMQDestination(node.url, exchange=exchange, timeout_s=2)
    try:
        assert {o.kind for o in destination.deliver([claimed("r-1")])} == {"sent"}
        node.stop(kill=True)
        try:
            outcomes = destination.deliver([claimed("r-2"), claimed("r-3")])
            assert {o.kind for o in outcomes} == {"retry"} and {o.code for o in outcomes} <= m.NETWORK_FAILURES
        finally:
            node.start()
        waiting = ["r-2", "r-3"]
        deadline = time.monotonic() + 30
        while waiting and time.monotonic() < deadline:  # as the relay does: what is not sent goes again
            outcomes = destination.deliver([claimed(event_id) for event_id in waiting])
            assert "dead" not in {o.kind for o in outcomes}, [(o.kind, o.code, o.error) for o in outcomes]
            waiting = [event_id for event_id, o in zip(waiting, outcomes, strict=True) if o.kind != "sent"]
            time.sleep(0.2 if waiting else 0)
        assert waiting == []
    finally:
        destination.close()
    assert [r.message_id for r in drain_queue(node.url, exchange)] == ["r-1", "r-2", "r-3"]


def test_a_message_returned_early_in_a_new_connection_is_retried_and_later_dead(node, exchange, monkeypatch):
    """A returned message (no queue bound for its routing key) is dead, except in the first
    RECOVERY_GRACE_S of a connection that replaced an earlier one, when the broker may be restoring its
    bindings after a restart: then it is a retry. The destination's first connection says dead at once."""
    bind_queue(node.url, exchange, exchange, "order.*")
    destination = RabbitMQDestination(node.url, exchange=exchange, timeout_s=2)
    try:
        first = destination.deliver([claimed("nowhere-1", topic="invoice.created")])
        assert [(o.kind, o.code) for o in first] == [("dead", m.NO_SUBSCRIBERS)]
        node.ctl("close_all_connections", "the broker closes every connection")
        for _ in range(3):  # the closed connection may be noticed by a failed publish first
            early = destination.deliver([claimed("nowhere-2", topic="invoice.created")])
            if early[0].code not in m.NETWORK_FAILURES:
                break
        assert [(o.kind, o.code) for o in early] == [("retry", m.NO_SUBSCRIBERS)]
        assert "no queue is bound" in (early[0].error or "") and "new connection" in (early[0].error or "")
        monkeypatch.setattr(answers, "RECOVERY_GRACE_S", 0.0)  # the connection is now older than the grace
        later = destination.deliver([claimed("nowhere-2", topic="invoice.created")])
        assert [(o.kind, o.code) for o in later] == [("dead", m.NO_SUBSCRIBERS)]
    finally:
        destination.close()


# -- from a user's outbox.toml ---------------------------------------------------------------------------


def test_the_relay_command_delivers_a_table_configured_in_outbox_toml(node, cli_env, conn, tmp_path: Path, exchange):
    bind_queue(node.url, exchange, exchange, "crm.#")
    (tmp_path / "outbox.toml").write_text(
        f'[tables.{TABLE}]\ndestination = "rabbitmq"\nurl_env = "CRM_RABBITMQ_URL"\nexchange = "{exchange}"\n'
        'topic_prefix = "crm."\ntimeout = "3s"\n'
    )
    enqueue(conn, [Message(topic="contact.updated", payload={"i": i}, event_id=f"c-{i}") for i in range(20)])
    env = {**cli_env, "CRM_RABBITMQ_URL": node.url}
    result = run_cli(env, "relay", "--table", TABLE, "--once", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert statuses(conn, TABLE) == {"sent": 20}
    assert sorted(r.message_id or "" for r in drain_queue(node.url, exchange)) == sorted(f"c-{i}" for i in range(20))
    assert PASSWORD not in result.stdout + result.stderr
    status = run_cli(env, "status", "--table", TABLE, cwd=tmp_path)
    assert PASSWORD not in status.stdout + status.stderr
