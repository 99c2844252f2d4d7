"""An application's enqueue through PgBouncer in transaction mode on a connection with its driver's defaults, several
clients sharing the pool (issue 41): psycopg prepares a statement from its sixth run, and on the next server
connection it does not exist. Enqueue runs its own statements unprepared there (made safe, and it says once what
the application's own statements need); asyncpg, which prepares and caches every statement, and SQLAlchemy on
asyncpg, which names every statement, are refused with the settings that stop it, before anything is written."""

import asyncio
import logging
import threading
import uuid
from collections.abc import Iterator

import asyncpg
import psycopg
import pytest

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines_tests.helpers import statuses
from outbox_pipelines_tests.pgbouncer import PgBouncer

TABLE = "outbox_events"
OUTBOX = Outbox(TABLE)
MISSING = "does not exist"


@pytest.fixture
def bouncer(db_url: str) -> Iterator[PgBouncer]:
    pgbouncer = PgBouncer(db_url, pool_size=2)
    yield pgbouncer
    pgbouncer.stop()


def _message(event_id: str) -> Message:
    return Message(topic="org.changed", payload={"id": event_id}, event_id=event_id)


def _switch_server_connection(app: psycopg.Connection, other: psycopg.Connection, step) -> None:
    """Run ``step`` on ``app`` while ``other`` holds the server connection ``app`` used last: PgBouncer hands the
    most recently used one first, so ``other`` gets it and ``app`` the other one."""
    with other.transaction():
        other.execute("SELECT 1")
        step()


def test_on_psycopgs_defaults_the_applications_own_statement_fails_on_the_next_server_connection(bouncer):
    """The hazard, shown: a statement run six times is prepared on one server connection, then missing."""
    with psycopg.connect(bouncer.url) as app, psycopg.connect(bouncer.url, prepare_threshold=None) as other:
        for n in range(6):
            with app.transaction():
                app.execute("SELECT %s::int", (n,))
        with pytest.raises(psycopg.errors.InvalidSqlStatementName, match=MISSING):
            _switch_server_connection(app, other, lambda: _in_transaction(app, "SELECT %s::int", (9,)))


def _in_transaction(app: psycopg.Connection, statement: str, params: tuple) -> None:
    with app.transaction():
        app.execute(statement, params)


def test_enqueue_on_psycopgs_defaults_runs_unprepared_and_says_once_what_the_application_needs(bouncer, conn, caplog):
    caplog.set_level(logging.WARNING, logger="outbox_pipelines.pooler")
    with psycopg.connect(bouncer.url) as app, psycopg.connect(bouncer.url, prepare_threshold=None) as other:
        for n in range(8):  # past psycopg's threshold: its own statements would be prepared by now
            with app.transaction():
                OUTBOX.enqueue(app, _message(f"one-{n}"))
        _switch_server_connection(
            app, other, lambda: OUTBOX.enqueue(app, _message("switched"), outside_transaction=True)
        )
        for n in range(8):
            with app.transaction():
                OUTBOX.enqueue_many(app, [_message(f"many-{n}-{i}") for i in range(3)])  # one INSERT
        _switch_server_connection(app, other, lambda: _many(app, "switched-many", 3))
        _switch_server_connection(app, other, lambda: _many(app, "switched-copy", 30))  # COPY
    assert statuses(conn, TABLE) == {"pending": 8 + 1 + 8 * 3 + 3 + 30}
    said = [r.getMessage() for r in caplog.records if "prepare_threshold=None" in r.getMessage()]
    assert len(said) == 1 and "transaction pooler" in said[0]


def _many(app: psycopg.Connection, prefix: str, count: int) -> None:
    with app.transaction():
        OUTBOX.enqueue_many(app, [_message(f"{prefix}-{i}") for i in range(count)])


def test_2000_transactions_of_clients_sharing_the_pool_on_psycopgs_defaults_lose_none(bouncer, conn):
    clients, per_client = 4, 500
    failures: list[str] = []

    def client(number: int) -> None:
        with psycopg.connect(bouncer.url) as app:  # psycopg's defaults: prepare_threshold=5
            for n in range(per_client):
                try:
                    with app.transaction():
                        if n % 10 == 9:
                            OUTBOX.enqueue_many(app, [_message(f"c{number}-{n}-{i}") for i in range(2)])
                        else:
                            OUTBOX.enqueue(app, _message(f"c{number}-{n}"))
                except psycopg.Error as exc:
                    failures.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=client, args=(number,)) for number in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert statuses(conn, TABLE) == {"pending": clients * (per_client + per_client // 10)}


def test_asyncpg_that_caches_statements_is_refused_with_the_setting_and_without_the_cache_it_goes_through(
    bouncer, conn
):
    async def enqueue(statement_cache_size: int | None, event_id: str) -> None:
        options = {} if statement_cache_size is None else {"statement_cache_size": statement_cache_size}
        app = await asyncpg.connect(bouncer.url, **options)
        try:
            for n in range(8):
                async with app.transaction():
                    await OUTBOX.enqueue_async(app, _message(f"{event_id}-{n}"))
        finally:
            await app.close()

    with pytest.raises(ConfigError) as refused:
        asyncio.run(enqueue(None, "cached"))
    assert "statement_cache_size=0" in str(refused.value) and "nothing was written" in str(refused.value)
    assert statuses(conn, TABLE) == {}
    asyncio.run(enqueue(0, "uncached"))
    assert statuses(conn, TABLE) == {"pending": 8}


def test_sqlalchemy_on_asyncpg_is_refused_until_its_statements_are_named_apart_and_not_cached(bouncer, conn):
    from sqlalchemy.ext.asyncio import create_async_engine

    url = bouncer.url.replace("postgresql://", "postgresql+asyncpg://")
    pgbouncer_ready = {
        "statement_cache_size": 0,
        "prepared_statement_cache_size": 0,
        "prepared_statement_name_func": lambda: f"__asyncpg_{uuid.uuid4()}__",
    }

    async def enqueue(connect_args: dict, prefix: str) -> None:
        engine = create_async_engine(url, connect_args=connect_args)
        try:
            for n in range(8):
                async with engine.begin() as app:
                    await OUTBOX.enqueue_async(app, _message(f"{prefix}-{n}"))
        finally:
            await engine.dispose()

    with pytest.raises(ConfigError) as refused:
        asyncio.run(enqueue({}, "defaults"))
    assert "prepared_statement_name_func" in str(refused.value) and "nothing was written" in str(refused.value)
    assert statuses(conn, TABLE) == {}
    asyncio.run(enqueue(pgbouncer_ready, "ready"))
    assert statuses(conn, TABLE) == {"pending": 8}
