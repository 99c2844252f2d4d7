"""A NATS JetStream consumer that makes each message's effect happen once: the inbox record and the effect commit
in one transaction, and the message is acknowledged only after it (a durable pull consumer, explicit acks).
docs/how-to/consumers.md.

Run: DATABASE_URL=postgresql://... NATS_URL=nats://... NATS_STREAM=ORDERS NATS_DURABLE=shipping python nats_consumer.py
"""

import asyncio
import os
import signal

import nats
import psycopg
from nats.aio.msg import Msg

from outbox_pipelines import Inbox

INBOX = Inbox("shipping_inbox")  # declared in outbox.toml as [inboxes.shipping_inbox], created by `db upgrade`
CONSUMER = "shipping"


async def handle(conn: psycopg.AsyncConnection, msg: Msg) -> bool:
    """Record the message and do its work in one transaction; False (and nothing done) for a repeat."""
    event_id = (msg.headers or {})["Nats-Msg-Id"]  # the relay's message id: the event_id
    async with conn.transaction():
        if not await INBOX.receive_async(conn, event_id, consumer=CONSUMER):
            return False  # handled before: a redelivery after the ack wait, or after a crash
        await conn.execute(
            "INSERT INTO shipments (event_id, payload) VALUES (%s, %s::jsonb)", (event_id, msg.data.decode())
        )
        return True


async def main() -> None:
    conn = await psycopg.AsyncConnection.connect(os.environ["DATABASE_URL"], autocommit=True)
    nc = await nats.connect(os.environ["NATS_URL"])
    subscription = await nc.jetstream().pull_subscribe_bind(
        durable=os.environ["NATS_DURABLE"], stream=os.environ["NATS_STREAM"]
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        while not stop.is_set():
            try:
                batch = await subscription.fetch(50, timeout=1.0)
            except TimeoutError:  # nothing new within a second
                continue
            for msg in batch:
                new = await handle(conn, msg)  # committed when it returns
                print("new" if new else "duplicate", msg.headers["Nats-Msg-Id"], flush=True)
                await msg.ack()  # after the commit: a crash before it, and JetStream delivers the message again
    finally:
        await nc.close()
        await conn.close()


if __name__ == "__main__":
    asyncio.run(main())
