"""``Inbox.receive_async`` on every asyncio stack enqueue_async takes (psycopg's AsyncConnection and AsyncCursor,
asyncpg, SQLAlchemy's AsyncConnection and AsyncSession on psycopg and on asyncpg): the record commits and rolls back
with the consumer's own row, a repeat is False, and no transaction open is refused with nothing recorded."""

import asyncio

import asyncpg
import psycopg
import pytest

from outbox_pipelines import Inbox
from outbox_pipelines.core.errors import NoTransaction
from outbox_pipelines_tests.core.test_enqueue_async import STACKS, _asyncpg_url

INBOX = Inbox("billing_inbox")


@pytest.fixture
def business_table(conn):
    conn.execute("CREATE TABLE business (id int PRIMARY KEY)")


@pytest.mark.parametrize("stack", STACKS)
def test_received_once_kept_with_the_work_and_rolled_back_with_it(db_url, conn, inbox_table, business_table, stack):
    async def consume(message_id: str, n: int, *, commit: bool) -> bool:
        async with STACKS[stack](db_url, commit=commit) as (handle, write):
            received = await INBOX.receive_async(handle, message_id, consumer="billing")
            if received:
                await write(n)
            return received

    async def scenario() -> list[bool]:
        return [
            await consume("m-1", 1, commit=True),
            await consume("m-1", 2, commit=True),  # a redelivery: nothing done
            await consume("m-2", 3, commit=False),  # the consumer's transaction fails
            await consume("m-2", 4, commit=True),  # so the next delivery is handled
        ]

    assert asyncio.run(scenario()) == [True, False, True, True]
    assert [row["id"] for row in conn.execute("SELECT id FROM business ORDER BY id")] == [1, 4]
    rows = conn.execute("SELECT consumer, message_id FROM billing_inbox ORDER BY message_id").fetchall()
    assert [(row["consumer"], row["message_id"]) for row in rows] == [("billing", "m-1"), ("billing", "m-2")]


def test_outside_a_transaction_is_refused_on_psycopg_and_asyncpg(db_url, conn, inbox_table):
    async def scenario() -> list[str]:
        said = []
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as pg:
            with pytest.raises(NoTransaction) as refused:
                await INBOX.receive_async(pg, "m-1", consumer="billing")
            said.append(str(refused.value))
        apg = await asyncpg.connect(_asyncpg_url(db_url))
        try:
            with pytest.raises(NoTransaction) as refused:
                await INBOX.receive_async(apg, "m-1", consumer="billing")
            said.append(str(refused.value))
        finally:
            await apg.close()
        return said

    for said in asyncio.run(scenario()):
        assert said.startswith("await inbox.receive_async(conn, ...) outside a transaction")
        assert "nothing was recorded" in said
    assert conn.execute("SELECT count(*) AS n FROM billing_inbox").fetchone()["n"] == 0


def test_a_synchronous_connection_given_to_receive_async_says_which_call_to_use(db_url, inbox_table):
    with psycopg.connect(db_url) as pg, pytest.raises(TypeError) as refused:
        asyncio.run(INBOX.receive_async(pg, "m-1", consumer="billing"))
    assert "Inbox.receive_async needs" in str(refused.value)
    assert "inbox.receive(conn, ...)" in str(refused.value)
