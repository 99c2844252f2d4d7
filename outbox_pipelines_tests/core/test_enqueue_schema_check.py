"""The first enqueue of a process on a database checks that the database has every engine migration the code
needs: on every stack (psycopg, SQLAlchemy, Django's connection, and the asyncio ones) an older schema is refused
with one sentence naming the versions and the fix, and nothing is written; a producer login, which may not read
the migrations' record, is told the same; and the check runs once per database and process, not per message."""

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.errors import MigrationError
from outbox_pipelines.core.storage import migrate, roles, schema_version
from outbox_pipelines.core.storage.db import sqlalchemy_url
from outbox_pipelines_tests.core.storage.test_roles import granted, login_as  # noqa: F401 (fixtures)
from outbox_pipelines_tests.core.test_enqueue_async import STACKS
from outbox_pipelines_tests.core.test_enqueue_django import _run as run_django

OUTBOX = Outbox("outbox_events")
NEWEST, NEWEST_NAME = schema_version.needed()[-1]
PREVIOUS = schema_version.needed()[-2][0]
BEHIND = (
    f"the database schema is at {PREVIOUS}, this version needs {NEWEST} ({NEWEST_NAME} not applied): "
    "run 'outbox-pipelines db upgrade'"
)


def _message(event_id: str) -> Message:
    return Message(topic="t", payload={"n": 1}, event_id=event_id)


@pytest.fixture
def older_schema(conn) -> Iterator[dict[str, Any]]:
    """The database as the previous version's upgrade left it: its newest migration not applied. Restored as
    ``db upgrade`` would record it."""
    row = conn.execute("DELETE FROM outbox_schema_migrations WHERE version = %s RETURNING *", (NEWEST,)).fetchone()
    yield row
    _restore(conn, row)


def _restore(conn, row: dict[str, Any]) -> None:
    conn.execute(
        "INSERT INTO outbox_schema_migrations (version, name, checksum) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
        (row["version"], row["name"], row["checksum"]),
    )


def _stored(conn) -> list[str]:
    return [row["event_id"] for row in conn.execute("SELECT event_id FROM outbox_events ORDER BY id")]


def _psycopg_enqueue(url: str, event_id: str) -> None:
    with psycopg.connect(url) as app, app.transaction():
        OUTBOX.enqueue(app, _message(event_id))


def _sqlalchemy_enqueue_many(url: str, event_id: str) -> None:
    engine = sa.create_engine(sqlalchemy_url(url))
    try:
        with engine.begin() as app:
            OUTBOX.enqueue_many(app, [_message(f"{event_id}-{n}") for n in range(30)])  # COPY's size
    finally:
        engine.dispose()


SYNC = {"psycopg": _psycopg_enqueue, "sqlalchemy-enqueue_many": _sqlalchemy_enqueue_many}


@pytest.mark.parametrize("path", SYNC)
def test_a_sync_enqueue_on_an_older_schema_is_refused_with_the_versions_and_the_fix(db_url, conn, older_schema, path):
    for attempt in range(2):  # refused each time, as long as the schema is behind: nothing is remembered
        with pytest.raises(MigrationError) as refused:
            SYNC[path](db_url, f"refused-{attempt}")
        assert str(refused.value) == f"enqueue refused, nothing was written: {BEHIND}"
    assert _stored(conn) == []
    _restore(conn, older_schema)  # db upgrade: the same process's next enqueue goes through
    SYNC[path](db_url, "after-upgrade")
    assert _stored(conn) != []


@pytest.mark.parametrize("stack", STACKS)
def test_an_asyncio_enqueue_on_an_older_schema_is_refused_alike(db_url, conn, older_schema, stack):
    conn.execute("CREATE TABLE business (id int PRIMARY KEY)")

    async def scenario() -> str:
        with pytest.raises(MigrationError) as refused:
            async with STACKS[stack](db_url, commit=True) as (handle, write):
                await write(1)
                await OUTBOX.enqueue_async(handle, _message("refused"))
        return str(refused.value)

    assert asyncio.run(scenario()) == f"enqueue refused, nothing was written: {BEHIND}"
    assert _stored(conn) == []
    assert conn.execute("SELECT count(*) AS n FROM business").fetchone()["n"] == 0


def test_on_djangos_connection_the_first_enqueue_is_refused_alike(db_url, conn, older_schema):
    result = run_django(
        db_url,
        """
        from outbox_pipelines.core.errors import MigrationError
        try:
            with transaction.atomic():
                outbox.enqueue(connection, Message(topic="t", payload={}, event_id="django"))
        except MigrationError as exc:
            print(exc)
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"enqueue refused, nothing was written: {BEHIND}"
    assert _stored(conn) == []


def test_a_producer_login_that_may_not_read_the_migrations_is_told_too(db_url, conn, login_as):  # noqa: F811
    producer = login_as(roles.PRODUCER)
    with psycopg.connect(producer) as app, pytest.raises(psycopg.errors.InsufficientPrivilege):
        app.execute("SELECT version FROM outbox_schema_migrations")
    row = conn.execute("DELETE FROM outbox_schema_migrations WHERE version = %s RETURNING *", (NEWEST,)).fetchone()
    with pytest.raises(MigrationError, match=f"at {PREVIOUS}, this version needs {NEWEST}"):
        _psycopg_enqueue(producer, "behind")
    # A database from before the view every login reads (0015): its absence alone says the schema is behind.
    conn.execute("DROP VIEW outbox_schema_version")
    with pytest.raises(MigrationError) as before_the_view:
        _psycopg_enqueue(producer, "before-the-view")
    assert f"the database schema is at a version before {schema_version.VIEW_VERSION}, " in str(before_the_view.value)
    assert "run 'outbox-pipelines db upgrade'" in str(before_the_view.value)
    assert _stored(conn) == []
    conn.execute(next(m.sql for m in migrate.discover() if m.version == schema_version.VIEW_VERSION))
    _restore(conn, row)
    _psycopg_enqueue(producer, "current")
    assert _stored(conn) == ["current"]


def test_the_schema_is_checked_once_per_database_and_process(db_url, conn, pg_server):
    _psycopg_enqueue(db_url, "first")
    # The schema changes behind the process's back: its later enqueues do not ask again (no query per message)...
    row = conn.execute("DELETE FROM outbox_schema_migrations WHERE version = %s RETURNING *", (NEWEST,)).fetchone()
    for n in range(20):
        _psycopg_enqueue(db_url, f"later-{n}")
    assert len(_stored(conn)) == 21
    _restore(conn, row)
    # ... while another database's first enqueue in the same process is checked on its own.
    name, other_url = pg_server.create_database()
    try:
        with psycopg.connect(other_url, autocommit=True) as other:
            other.execute("DELETE FROM outbox_schema_migrations WHERE version = %s", (NEWEST,))
        with pytest.raises(MigrationError, match=f"at {PREVIOUS}, this version needs {NEWEST}"):
            _psycopg_enqueue(other_url, "other")
    finally:
        pg_server.drop_database(name)
