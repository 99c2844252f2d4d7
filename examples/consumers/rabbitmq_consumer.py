"""A RabbitMQ consumer that makes each message's effect happen once: the inbox record and the effect commit in one
transaction, and the message is acknowledged only after it (manual acks). docs/how-to/consumers.md.

Run: DATABASE_URL=postgresql://... AMQP_URL=amqp://... AMQP_QUEUE=shipping python rabbitmq_consumer.py
"""

import asyncio
import os
import signal

import aiormq
import psycopg
from aiormq.abc import DeliveredMessage

from outbox_pipelines import Inbox

INBOX = Inbox("shipping_inbox")  # declared in outbox.toml as [inboxes.shipping_inbox], created by `db upgrade`
CONSUMER = "shipping"


async def handle(conn: psycopg.AsyncConnection, message: DeliveredMessage) -> bool:
    """Record the message and do its work in one transaction; False (and nothing done) for a repeat."""
    event_id = message.header.properties.message_id  # the relay sets AMQP's message_id to the event_id
    async with conn.transaction():
        if not await INBOX.receive_async(conn, event_id, consumer=CONSUMER):
            return False  # handled before: a redelivery, or a second publish of one message
        await conn.execute(
            "INSERT INTO shipments (event_id, payload) VALUES (%s, %s::jsonb)", (event_id, message.body.decode())
        )
        return True


async def main() -> None:
    conn = await psycopg.AsyncConnection.connect(os.environ["DATABASE_URL"], autocommit=True)
    one_at_a_time = asyncio.Lock()  # aiormq may run callbacks concurrently; one connection, one transaction
    broker = await aiormq.connect(os.environ["AMQP_URL"])
    channel = await broker.channel()
    await channel.basic_qos(prefetch_count=50)

    async def on_message(message: DeliveredMessage) -> None:
        async with one_at_a_time:
            new = await handle(conn, message)  # committed when it returns
        print("new" if new else "duplicate", message.header.properties.message_id, flush=True)
        # Acknowledged after the commit: a crash before this line, and RabbitMQ delivers the message again.
        await channel.basic_ack(message.delivery.delivery_tag)

    await channel.basic_consume(os.environ["AMQP_QUEUE"], on_message)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await stop.wait()
    finally:
        await broker.close()
        await conn.close()


if __name__ == "__main__":
    asyncio.run(main())
