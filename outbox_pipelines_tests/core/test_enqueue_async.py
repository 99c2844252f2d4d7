"""``enqueue_async`` and ``enqueue_many_async`` on every asyncio stack a service runs: psycopg's AsyncConnection
and AsyncCursor, SQLAlchemy's AsyncConnection and AsyncSession on psycopg and on asyncpg, and asyncpg itself.
On each, the message commits and rolls back with the business row, a duplicate event_id returns the stored
row, and a connection with no transaction open is refused before anything is written."""

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.errors import NotAnOutboxTable, NoTransaction, UnknownTable
from outbox_pipelines.core.storage.db import sqlalchemy_url

OUTBOX = Outbox("outbox_events")
# Each stack: how a service opens its business transaction and the object it hands to enqueue_async. The
# context yields (handle, write) where write(n) is the business INSERT on the same transaction.
Stack = Callable[[str], Any]


def _asyncpg_url(db_url: str) -> str:
    return sqlalchemy_url(db_url).replace("postgresql+psycopg://", "postgresql://")


@asynccontextmanager
async def _psycopg(db_url: str, *, commit: bool) -> AsyncIterator[tuple[Any, Any]]:
    async with await psycopg.AsyncConnection.connect(db_url) as conn:

        async def write(n: int) -> None:
            await conn.execute("INSERT INTO business VALUES (%s)", (n,))

        yield conn, write
        await (conn.commit() if commit else conn.rollback())


@asynccontextmanager
async def _psycopg_cursor(db_url: str, *, commit: bool) -> AsyncIterator[tuple[Any, Any]]:
    async with await psycopg.AsyncConnection.connect(db_url) as conn, conn.cursor() as cur:

        async def write(n: int) -> None:
            await cur.execute("INSERT INTO business VALUES (%s)", (n,))

        yield cur, write
        await (conn.commit() if commit else conn.rollback())


@asynccontextmanager
async def _asyncpg(db_url: str, *, commit: bool) -> AsyncIterator[tuple[Any, Any]]:
    conn = await asyncpg.connect(_asyncpg_url(db_url))
    try:
        tx = conn.transaction()
        await tx.start()

        async def write(n: int) -> None:
            await conn.execute("INSERT INTO business VALUES ($1)", n)

        yield conn, write
        await (tx.commit() if commit else tx.rollback())
    finally:
        await conn.close()


def _sqlalchemy(driver: str, session: bool) -> Stack:
    @asynccontextmanager
    async def stack(db_url: str, *, commit: bool) -> AsyncIterator[tuple[Any, Any]]:
        engine = create_async_engine(sqlalchemy_url(db_url).replace("+psycopg", f"+{driver}"))
        try:
            if session:
                async with AsyncSession(engine) as handle:

                    async def write(n: int) -> None:
                        await handle.execute(text("INSERT INTO business VALUES (:n)"), {"n": n})

                    yield handle, write
                    await (handle.commit() if commit else handle.rollback())
            else:
                async with engine.connect() as handle:

                    async def write(n: int) -> None:
                        await handle.execute(text("INSERT INTO business VALUES (:n)"), {"n": n})

                    yield handle, write
                    await (handle.commit() if commit else handle.rollback())
        finally:
            await engine.dispose()

    return stack


STACKS = {
    "psycopg": _psycopg,
    "psycopg-cursor": _psycopg_cursor,
    "asyncpg": _asyncpg,
    "sqlalchemy-psycopg-session": _sqlalchemy("psycopg", session=True),
    "sqlalchemy-psycopg-connection": _sqlalchemy("psycopg", session=False),
    "sqlalchemy-asyncpg-session": _sqlalchemy("asyncpg", session=True),
    "sqlalchemy-asyncpg-connection": _sqlalchemy("asyncpg", session=False),
}


@pytest.fixture
def business_table(conn):
    conn.execute("CREATE TABLE business (id int PRIMARY KEY)")


def _stored(conn) -> list[tuple[str, Any]]:
    rows = conn.execute("SELECT event_id, payload FROM outbox_events ORDER BY id").fetchall()
    return [(row["event_id"], row["payload"]) for row in rows]


def _business(conn) -> list[int]:
    return [row["id"] for row in conn.execute("SELECT id FROM business ORDER BY id")]


@pytest.mark.parametrize("stack", STACKS)
def test_the_message_commits_and_rolls_back_with_the_business_row(db_url, conn, business_table, stack):
    async def scenario() -> Any:
        async with STACKS[stack](db_url, commit=True) as (handle, write):
            # The enqueue first: on SQLAlchemy's asyncpg driver the transaction is not open on the server yet.
            kept = await OUTBOX.enqueue_async(handle, Message(topic="t", payload={"n": 1}, event_id="kept"))
            await write(1)
        async with STACKS[stack](db_url, commit=False) as (handle, write):
            await write(2)
            await OUTBOX.enqueue_async(handle, Message(topic="t", payload={"n": 2}, event_id="dropped"))
        async with STACKS[stack](db_url, commit=True) as (handle, write):
            await write(3)
            many = await OUTBOX.enqueue_many_async(
                handle, [Message(topic="t", payload={"n": n}, event_id=f"many-{n}") for n in range(3)]
            )
        async with STACKS[stack](db_url, commit=False) as (handle, write):
            await OUTBOX.enqueue_many_async(handle, [Message(topic="t", payload={"n": 9}, event_id="many-dropped")])
        return kept, many

    kept, many = asyncio.run(scenario())
    assert _business(conn) == [1, 3]
    assert _stored(conn) == [("kept", {"n": 1}), ("many-0", {"n": 0}), ("many-1", {"n": 1}), ("many-2", {"n": 2})]
    assert kept.duplicate is False
    assert conn.execute("SELECT id FROM outbox_events WHERE event_id = 'kept'").fetchone()["id"] == kept.id
    assert [(r.event_id, r.duplicate) for r in many] == [("many-0", False), ("many-1", False), ("many-2", False)]


@pytest.mark.parametrize("stack", STACKS)
def test_a_duplicate_event_id_returns_the_stored_row_as_enqueue_does(db_url, conn, business_table, stack):
    first = OUTBOX.enqueue(conn, Message(topic="t", payload={"n": 1}, event_id="same"), outside_transaction=True)

    async def scenario() -> Any:
        async with STACKS[stack](db_url, commit=True) as (handle, write):
            again = await OUTBOX.enqueue_async(handle, Message(topic="t", payload={"n": 1}, event_id="same"))
            other = await OUTBOX.enqueue_async(handle, Message(topic="t", payload={"n": 2}, event_id="same"))
            batch = await OUTBOX.enqueue_many_async(
                handle,
                [
                    Message(topic="t", payload={"n": 1}, event_id="same"),
                    Message(topic="t", payload={"n": 5}, event_id="new"),
                    Message(topic="t", payload={"n": 6}, event_id="new"),
                ],
            )
            await write(1)  # the transaction goes on after the duplicates
        return again, other, batch

    again, other, batch = asyncio.run(scenario())
    assert (again.id, again.duplicate, again.same_payload) == (first.id, True, True)
    assert (other.id, other.duplicate, other.same_payload) == (first.id, True, False)
    assert [(r.duplicate, r.same_payload) for r in batch] == [(True, True), (False, True), (True, False)]
    assert batch[1].id == batch[2].id
    assert _business(conn) == [1]
    assert [event_id for event_id, _ in _stored(conn)] == ["same", "new"]


@pytest.mark.parametrize("stack", ["psycopg", "asyncpg", "sqlalchemy-asyncpg-session"])
def test_every_column_the_sync_path_writes_the_async_path_writes_alike(db_url, conn, business_table, stack):
    later = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    message = Message(
        topic="org.changed",
        payload={"b": [1, 2.5, "é"], "a": None},
        event_id="e-async",
        tenant_id="acme",
        headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        available_at=later,
        ordering_key="org-1",
    )
    sync_message = Message(**{**message.__dict__, "event_id": "e-sync"})
    OUTBOX.enqueue(conn, sync_message, outside_transaction=True)

    async def scenario() -> None:
        async with STACKS[stack](db_url, commit=True) as (handle, _):
            await OUTBOX.enqueue_async(handle, message)

    asyncio.run(scenario())
    columns = "tenant_id, topic, payload, payload_sha, headers, available_at, ordering_key, ordering_blocked, status"
    rows = conn.execute(f"SELECT event_id, {columns} FROM outbox_events ORDER BY id").fetchall()
    assert [row["event_id"] for row in rows] == ["e-sync", "e-async"]
    assert {k: v for k, v in rows[1].items() if k != "event_id"} == {
        **{k: v for k, v in rows[0].items() if k != "event_id"},
        "ordering_blocked": True,  # the second message of key org-1 waits for the first
    }
    assert rows[1]["available_at"] == later


@pytest.mark.parametrize("stack", ["psycopg", "asyncpg", "sqlalchemy-asyncpg-connection"])
def test_a_keyed_batch_waits_behind_its_key_as_the_sync_batch_does(db_url, conn, stack):
    async def scenario() -> None:
        async with STACKS[stack](db_url, commit=True) as (handle, _):
            await OUTBOX.enqueue_many_async(
                handle,
                [
                    Message(topic="t", payload={"n": 1}, event_id="k1", ordering_key="a"),
                    Message(topic="t", payload={"n": 2}, event_id="k2", ordering_key="a"),
                    Message(topic="t", payload={"n": 3}, event_id="k3", ordering_key="b"),
                ],
            )

    asyncio.run(scenario())
    rows = conn.execute("SELECT event_id, ordering_blocked FROM outbox_events ORDER BY id").fetchall()
    assert [(row["event_id"], row["ordering_blocked"]) for row in rows] == [
        ("k1", False),
        ("k2", True),
        ("k3", False),
    ]


def test_a_connection_with_no_transaction_open_is_refused_on_every_driver(db_url, conn):
    message = Message(topic="t", payload={"n": 1}, event_id="alone")

    async def scenario() -> dict[str, str]:
        refused: dict[str, str] = {}
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as pg:
            with pytest.raises(NoTransaction, match="autocommit") as caught:
                await OUTBOX.enqueue_async(pg, message)
            refused["psycopg"] = str(caught.value)
            with pytest.raises(NoTransaction):
                await OUTBOX.enqueue_many_async(pg, [message])
        apg = await asyncpg.connect(_asyncpg_url(db_url))
        try:
            with pytest.raises(NoTransaction, match=r"async with conn.transaction\(\)") as caught:
                await OUTBOX.enqueue_async(apg, message)
            refused["asyncpg"] = str(caught.value)
        finally:
            await apg.close()
        for driver in ("psycopg", "asyncpg"):
            engine = create_async_engine(
                sqlalchemy_url(db_url).replace("+psycopg", f"+{driver}"), isolation_level="AUTOCOMMIT"
            )
            try:
                async with AsyncSession(engine) as session:
                    with pytest.raises(NoTransaction) as caught:
                        await OUTBOX.enqueue_async(session, message)
                    refused[f"sqlalchemy-{driver}"] = str(caught.value)
            finally:
                await engine.dispose()
        return refused

    refused = asyncio.run(scenario())
    assert set(refused) == {"psycopg", "asyncpg", "sqlalchemy-psycopg", "sqlalchemy-asyncpg"}
    assert all("outside_transaction=True" in text for text in refused.values())
    assert _stored(conn) == []  # nothing written by any of them


def test_outside_transaction_writes_the_message_on_its_own_when_asked(db_url, conn):
    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as pg:
            await OUTBOX.enqueue_async(pg, Message(topic="t", payload={"n": 1}, event_id="p"), outside_transaction=True)
        apg = await asyncpg.connect(_asyncpg_url(db_url))
        try:
            await OUTBOX.enqueue_many_async(
                apg, [Message(topic="t", payload={"n": 2}, event_id="a")], outside_transaction=True
            )
        finally:
            await apg.close()

    asyncio.run(scenario())
    assert [event_id for event_id, _ in _stored(conn)] == ["p", "a"]


def test_the_wrong_kind_of_connection_is_refused_naming_what_to_pass(db_url, conn):
    message = Message(topic="t", payload={"n": 1})

    async def scenario() -> list[str]:
        errors = []
        with psycopg.connect(db_url) as sync_pg:
            with pytest.raises(TypeError, match=r"synchronous connection: use outbox.enqueue\(conn, message\)") as e:
                await OUTBOX.enqueue_async(sync_pg, message)
            errors.append(str(e.value))
        with pytest.raises(TypeError, match="enqueue_async needs a psycopg 3 AsyncConnection") as e:
            await OUTBOX.enqueue_async(object(), message)
        errors.append(str(e.value))
        async with await psycopg.AsyncConnection.connect(db_url) as async_pg:
            with pytest.raises(TypeError, match=r"asyncio connection: use `await outbox.enqueue_async") as e:
                OUTBOX.enqueue(async_pg, message)
            errors.append(str(e.value))
        apg = await asyncpg.connect(_asyncpg_url(db_url))
        try:
            with pytest.raises(TypeError, match="asyncio connection"):
                OUTBOX.enqueue_many(apg, [message])
        finally:
            await apg.close()
        return errors

    asyncio.run(scenario())
    assert _stored(conn) == []


@pytest.mark.parametrize("stack", ["psycopg", "asyncpg", "sqlalchemy-asyncpg-session"])
def test_a_bad_message_or_an_unknown_table_writes_nothing_and_says_what(db_url, conn, business_table, stack):
    from outbox_pipelines import InvalidMessage

    async def scenario() -> None:
        async with STACKS[stack](db_url, commit=True) as (handle, write):
            await write(1)
            with pytest.raises(InvalidMessage, match="message at index 1 of the batch"):
                await OUTBOX.enqueue_many_async(
                    handle, [Message(topic="t", payload={"n": 1}), Message(topic="", payload={})]
                )
            await OUTBOX.enqueue_async(handle, Message(topic="t", payload={"n": 2}, event_id="after"))
        async with STACKS[stack](db_url, commit=False) as (handle, _):
            with pytest.raises(UnknownTable, match="db create-table no_such_outbox"):
                await Outbox("no_such_outbox").enqueue_async(handle, Message(topic="t", payload={}))

    asyncio.run(scenario())
    assert _business(conn) == [1]
    assert [event_id for event_id, _ in _stored(conn)] == ["after"]


def test_the_event_loop_never_blocks_while_200_coroutines_enqueue(db_url, conn):
    """asyncio's debug mode reports every callback slower than slow_callback_duration; a ticker measures the
    worst gap between its 5 ms ticks. One enqueue waits 3 s on the server for another transaction holding
    its event_id: awaited, the loop goes on; a blocking call would stall it those 3 s, far above the 1.5 s
    allowed (which leaves room for a busy CI machine taking the process off its core: 0.63 s was seen with three
    test workers on two cores, 1.03 s with a fourth test process beside them)."""
    import logging

    slow: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            # The producers' steps, where an enqueue runs (the test's own step creating 200 tasks is slow in
            # debug mode, which records where each task was created).
            message = record.getMessage()
            if "Executing" in message and ("producer" in message or "waits_on" in message):
                slow.append(record.getMessage())

    catcher = Catch()
    logging.getLogger("asyncio").addHandler(catcher)

    async def scenario() -> float:
        asyncio.get_running_loop().slow_callback_duration = 1.5
        pool = [await asyncpg.connect(_asyncpg_url(db_url)) for _ in range(5)]
        pg_pool = [await psycopg.AsyncConnection.connect(db_url) for _ in range(5)]
        worst = 0.0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal worst
            last = time.perf_counter()
            while not stop.is_set():
                await asyncio.sleep(0.005)
                now = time.perf_counter()
                worst = max(worst, now - last - 0.005)
                last = now

        async def producer(n: int) -> None:
            if n % 2:
                apg = pool[n % 5]
                async with locks[n % 10], apg.transaction():
                    await OUTBOX.enqueue_async(apg, Message(topic="t", payload={"n": n}, event_id=f"c-{n}"))
            else:
                pg = pg_pool[n % 5]
                async with locks[n % 10], pg.transaction():
                    await OUTBOX.enqueue_async(pg, Message(topic="t", payload={"n": n}, event_id=f"c-{n}"))

        locks = [asyncio.Lock() for _ in range(10)]

        async def waits_on_a_held_event_id(pg: Any) -> None:
            # Another transaction holds this event_id uncommitted for 3 s: the INSERT's ON CONFLICT waits
            # for it on the server. Awaited, the loop goes on; a blocking call would stall it that long.
            async with pg.transaction():
                await OUTBOX.enqueue_async(pg, Message(topic="t", payload={}, event_id="held"))

        holder = await psycopg.AsyncConnection.connect(db_url)
        waiter = await psycopg.AsyncConnection.connect(db_url)
        await OUTBOX.enqueue_async(holder, Message(topic="t", payload={}, event_id="held"))
        producers = [asyncio.create_task(producer(n)) for n in range(200)]
        producers.append(asyncio.create_task(waits_on_a_held_event_id(waiter)))
        tick = asyncio.create_task(ticker())
        await asyncio.sleep(3.0)
        await holder.rollback()
        await asyncio.gather(*producers)
        await holder.close()
        await waiter.close()
        stop.set()
        await tick
        for apg in pool:
            await apg.close()
        for pg in pg_pool:
            await pg.close()
        return worst

    try:
        worst = asyncio.run(scenario(), debug=True)
    finally:
        logging.getLogger("asyncio").removeHandler(catcher)
    assert conn.execute("SELECT count(*) AS n FROM outbox_events").fetchone()["n"] == 201
    assert slow == [], slow
    assert worst < 1.5, f"the event loop stalled {worst * 1000:.0f} ms"


def test_an_enqueue_at_a_set_time_uses_the_given_now_like_the_sync_path(db_url, conn):
    now = datetime.now(UTC) + timedelta(days=3)

    async def scenario() -> None:
        apg = await asyncpg.connect(_asyncpg_url(db_url))
        try:
            async with apg.transaction():
                await OUTBOX.enqueue_async(apg, Message(topic="t", payload={}, event_id="timed"), now=now)
                await OUTBOX.enqueue_many_async(apg, [Message(topic="t", payload={}, event_id="timed-many")], now=now)
        finally:
            await apg.close()

    asyncio.run(scenario())
    rows = conn.execute("SELECT available_at FROM outbox_events ORDER BY id").fetchall()
    assert [row["available_at"] for row in rows] == [now, now]


def _waiting_on_a_lock(conn) -> bool:
    found = conn.execute(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ).fetchone()
    return found["n"] > 0


@pytest.mark.parametrize("committed", [True, False])
def test_two_transactions_racing_on_one_event_id_write_it_once(db_url, conn, committed):
    """The second INSERT waits on the server for the first transaction: committed, the second gets its row as a
    duplicate; rolled back, the second writes it. Neither raises, on either driver."""

    async def scenario() -> tuple[Any, Any]:
        first = await asyncpg.connect(_asyncpg_url(db_url))
        second = await psycopg.AsyncConnection.connect(db_url)
        try:
            tx = first.transaction()
            await tx.start()
            mine = await OUTBOX.enqueue_async(first, Message(topic="t", payload={"n": 1}, event_id="raced"))
            theirs = asyncio.create_task(
                OUTBOX.enqueue_async(second, Message(topic="t", payload={"n": 1}, event_id="raced"))
            )
            while not _waiting_on_a_lock(conn):  # the second INSERT waits on the server for the first transaction
                assert not theirs.done()
                await asyncio.sleep(0.01)
            await (tx.commit() if committed else tx.rollback())
            result = await theirs
            await second.commit()
            return mine, result
        finally:
            await first.close()
            await second.close()

    mine, theirs = asyncio.run(scenario())
    stored = conn.execute("SELECT id FROM outbox_events WHERE event_id = 'raced'").fetchall()
    assert len(stored) == 1
    assert theirs.duplicate is committed
    assert (theirs.id == mine.id) is committed
    assert stored[0]["id"] == (mine.id if committed else theirs.id)


@pytest.mark.parametrize("stack", ["psycopg", "asyncpg", "sqlalchemy-asyncpg-session", "sqlalchemy-psycopg-session"])
def test_a_business_table_s_name_is_told_it_is_no_outbox_table(db_url, conn, business_table, stack):
    """``Outbox("business")``: a table, but not an outbox: the error says so with the server's words."""

    async def scenario() -> None:
        async with STACKS[stack](db_url, commit=False) as (handle, _):
            with pytest.raises(NotAnOutboxTable, match=r"table 'business' is not an outbox table \(column "):
                await Outbox("business").enqueue_async(handle, Message(topic="t", payload={}))

    asyncio.run(scenario())
    with psycopg.connect(db_url) as sync:
        with pytest.raises(NotAnOutboxTable, match=r"'business' is not an outbox table \(column \"event_id\""):
            Outbox("business").enqueue(sync, Message(topic="t", payload={}))
