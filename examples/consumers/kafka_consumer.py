"""A Kafka consumer that makes each message's effect happen once: the inbox record and the effect commit in one
transaction, and the offsets are committed to Kafka only after it. docs/how-to/consumers.md.

Run: DATABASE_URL=postgresql://... KAFKA_BOOTSTRAP=host:9092 KAFKA_TOPIC=orders.order.created python kafka_consumer.py
"""

import os
import signal
import sys

import psycopg
from confluent_kafka import Consumer, Message

from outbox_pipelines import Inbox

INBOX = Inbox("shipping_inbox")  # declared in outbox.toml as [inboxes.shipping_inbox], created by `db upgrade`
CONSUMER = "shipping"


def message_id(record: Message) -> str:
    """The relay's message id: the record's ``idempotency-key`` header (the outbox row's event_id)."""
    for name, value in record.headers() or []:
        if name == "idempotency-key" and value is not None:
            return value.decode() if isinstance(value, bytes) else value
    raise ValueError("the record has no idempotency-key header: not sent by an outbox relay")


def handle(conn: psycopg.Connection, record: Message) -> bool:
    """Record the message and do its work in one transaction; False (and nothing done) for a repeat."""
    event_id = message_id(record)
    with conn.transaction():
        if not INBOX.receive(conn, event_id, consumer=CONSUMER):
            return False  # handled before: a redelivery, or a second publish of one message
        conn.execute(
            "INSERT INTO shipments (event_id, payload) VALUES (%s, %s::jsonb)",
            (event_id, (record.value() or b"{}").decode()),
        )
        return True


def main() -> None:
    session_ms = int(os.environ.get("KAFKA_SESSION_TIMEOUT_MS", "45000"))
    consumer = Consumer(
        {
            "bootstrap.servers": os.environ["KAFKA_BOOTSTRAP"],
            "group.id": CONSUMER,
            "enable.auto.commit": False,  # offsets are committed below, after the database's commit
            "auto.offset.reset": "earliest",
            # How long a consumer that crashed keeps its partitions before the group gives them to another.
            "session.timeout.ms": session_ms,
            "heartbeat.interval.ms": session_ms // 3,
        }
    )
    consumer.subscribe([os.environ["KAFKA_TOPIC"]])
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        try:
            while not stopping:
                records = []
                for record in consumer.consume(100, timeout=1.0):
                    if record.error() is None:
                        records.append(record)
                    else:  # the client retries on its own; say so
                        print("kafka:", record.error(), file=sys.stderr, flush=True)
                for record in records:
                    new = handle(conn, record)  # committed when it returns
                    print("new" if new else "duplicate", message_id(record), flush=True)
                if records:  # a crash before this line: Kafka delivers these records again, the inbox skips them
                    consumer.commit(asynchronous=False)
        finally:
            consumer.close()


if __name__ == "__main__":
    main()
