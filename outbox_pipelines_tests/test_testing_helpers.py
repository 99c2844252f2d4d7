"""``outbox_pipelines.testing``, used as a team's tests would: assert what their code enqueued, then relay it once
in-process to a recording destination."""

import psycopg
import pytest

from outbox_pipelines import Message, Outbox, Outcome, UnknownTable
from outbox_pipelines.testing import RecordingDestination, enqueued, relay_once

ORDERS = Outbox("outbox_events")


def place_order(conn: psycopg.Connection, customer: str) -> None:
    """The team's code under test: a business write and its message, in the caller's transaction."""
    conn.execute("CREATE TABLE IF NOT EXISTS orders (id serial PRIMARY KEY, customer text)")
    order_id = conn.execute("INSERT INTO orders (customer) VALUES (%s) RETURNING id", (customer,)).fetchone()[0]
    ORDERS.enqueue(conn, Message(topic="order.placed", payload={"order_id": order_id, "customer": customer}))


def test_enqueued_sees_what_the_transaction_wrote_and_what_it_committed(db_url):
    with psycopg.connect(db_url) as app, psycopg.connect(db_url, autocommit=True) as other:
        place_order(app, "acme")
        [inside] = enqueued(app, "outbox_events", topic="order.placed")  # the writer's own transaction
        assert inside.payload["customer"] == "acme" and inside.status == "pending"
        assert enqueued(other, "outbox_events") == []  # not committed yet
        app.commit()
        assert [m.payload["customer"] for m in enqueued(other, "outbox_events", topic="order.placed")] == ["acme"]
        assert enqueued(other, "outbox_events", topic="something.else") == []
        with pytest.raises(UnknownTable, match="db create-table no_such_outbox"):
            enqueued(other, "no_such_outbox")


def test_relay_once_delivers_to_a_recording_destination_and_settles(db_url):
    with psycopg.connect(db_url) as app:
        place_order(app, "acme")
        place_order(app, "globex")
        app.commit()
        recorder = RecordingDestination()
        report = relay_once(db_url, "outbox_events", recorder)
        assert report.sent == 2
        assert [m.payload["customer"] for m in recorder.delivered] == ["acme", "globex"]
        assert {m.status for m in enqueued(app, "outbox_events")} == {"sent"}


def test_a_recording_destination_can_answer_a_retry(db_url):
    with psycopg.connect(db_url) as app:
        place_order(app, "acme")
        app.commit()
        recorder = RecordingDestination(lambda message: Outcome.retry("HANDLER_ERROR", "try later"))
        report = relay_once(db_url, "outbox_events", recorder)
        [message] = enqueued(app, "outbox_events")
    assert (report.sent, report.retried) == (0, 1)
    assert (message.status, message.attempts) == ("pending", 1)
