"""The outbox loop a team writes without us, with a broker's own client (the brokers scenario's second reference).

The drain scenario's simple loop (obench.peers: its claim, its settle and its partial index on pending ids) with a
publish in place of the no-op handler: one transaction per batch, ``SELECT id, event_id, topic, payload, headers
... WHERE status = 'pending' ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED``, the batch published with the client
exactly as that broker's client loop publishes (same in flight, headers, serialisation), every broker
acknowledgement awaited, then ``UPDATE ... SET status = 'sent' ... WHERE id = ANY(...)`` and COMMIT. No lease,
attempts, audit or per-message outcome: a batch with one unacknowledged message raises (its transaction rolls
back, every row stays pending). Timed from the first claim to the last commit; both connections open before it.
"""

import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from obench import peers
from obench.common import copy_rows, count_by_status, make_rows, reset_table, settle_server

BATCH = 100
# (id, event_id, topic, payload, headers) as the simple loop's claim returns them (payload parsed from jsonb).
Claimed = tuple[Any, ...]


@contextmanager
def loaded(db_url: str, table: str, messages: int, topic: str, prefix: str) -> Iterator[None]:
    """``messages`` pending rows loaded as the relay's are (COPY, then VACUUM ANALYZE), with the simple loop's
    own pending index while the loop runs (dropped after, so the relay never maintains it)."""
    reset_table(db_url, table)
    with psycopg.connect(db_url, autocommit=True) as conn:
        copy_rows(conn, table, make_rows(messages, topic, prefix))
    with peers.simple_loop_index(db_url, table):
        settle_server(db_url, table)
        yield


def _statements(table: str) -> tuple[sql.Composed, sql.Composed]:
    return (
        sql.SQL(peers.SIMPLE_CLAIM).format(sql.Identifier(table)),
        sql.SQL(peers.SIMPLE_SETTLE).format(sql.Identifier(table)),
    )


def _checked(rows: Sequence[Claimed], acked: int) -> None:
    if acked != len(rows):
        raise RuntimeError(f"outbox loop: {acked} of {len(rows)} messages acknowledged; the batch rolls back")


def drain(db_url: str, table: str, publish: Callable[[Sequence[Claimed]], int]) -> tuple[int, float]:
    """(rows sent, seconds) of the loop with a blocking client: ``publish(rows)`` returns how many the broker
    acknowledged once every acknowledgement is in."""
    claim, settle = _statements(table)
    sent = 0
    with psycopg.connect(db_url, autocommit=False, application_name="bench-outbox-loop") as conn:
        conn.execute("SELECT 1")  # connected before the clock, and no transaction left open
        conn.rollback()
        started = time.perf_counter()
        with conn.cursor() as cur:
            while True:
                cur.execute(claim, (BATCH,))
                rows = cur.fetchall()
                if not rows:
                    conn.commit()
                    break
                _checked(rows, publish(rows))
                cur.execute(settle, ([row[0] for row in rows],))
                conn.commit()
                sent += len(rows)
        seconds = time.perf_counter() - started
    return sent, seconds


async def drain_async(
    db_url: str, table: str, publish: Callable[[Sequence[Claimed]], Awaitable[int]]
) -> tuple[int, float]:
    """The same loop on psycopg's AsyncConnection, in the event loop of an asyncio client (nats-py, aiormq)."""
    claim, settle = _statements(table)
    sent = 0
    async with await psycopg.AsyncConnection.connect(
        db_url, autocommit=False, application_name="bench-outbox-loop"
    ) as conn:
        await conn.execute("SELECT 1")
        await conn.rollback()
        started = time.perf_counter()
        async with conn.cursor() as cur:
            while True:
                await cur.execute(claim, (BATCH,))
                rows = await cur.fetchall()
                if not rows:
                    await conn.commit()
                    break
                _checked(rows, await publish(rows))
                await cur.execute(settle, ([row[0] for row in rows],))
                await conn.commit()
                sent += len(rows)
        seconds = time.perf_counter() - started
    return sent, seconds


def check_table(db_url: str, table: str, messages: int, out: dict[str, Any]) -> None:
    """Every loaded row marked sent, and the loop says it sent them all."""
    counts = count_by_status(db_url, table)
    if out["sent"] != messages or counts != {"sent": messages}:
        raise RuntimeError(f"outbox loop: {out}, table {counts}")
