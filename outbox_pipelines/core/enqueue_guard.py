"""The first enqueue of a process on a database: the schema checked, and how enqueue speaks through a pooler.

Once per database and process, before anything is written, ``judge`` refuses a schema older than the code (and
remembers nothing then); behind a transaction pooler enqueue's statements run unprepared.
Why: docs/explanation/enqueue.md, "The first enqueue".
"""

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from outbox_pipelines.core.errors import ConfigError, MigrationError
from outbox_pipelines.core.storage import pooler
from outbox_pipelines.core.storage.app_connections import AsyncTarget
from outbox_pipelines.core.storage.schema_version import (
    PROBE,
    AppliedVersions,
    applied_from,
    behind,
    read_applied,
    statement,
    versions_statement,
)


@dataclass(frozen=True)
class Endpoint:
    """A database as this process's enqueues reach it, once its schema was found current."""

    pooled: bool  # through a transaction pooler: enqueue prepares none of its statements

    @property
    def prepare(self) -> bool | None:
        """psycopg's ``prepare`` for enqueue's statements: never behind a pooler, else the connection's rule."""
        return False if self.pooled else None


_endpoints: dict[Hashable, Endpoint] = {}


def judge(key: Hashable, applied: AppliedVersions, client_pid: int | None) -> Endpoint:
    """The one decision of every enqueue path: MigrationError (nothing written, nothing remembered) when the
    database lacks a migration this code needs; otherwise the endpoint, remembered for the process."""
    problem = behind(applied)
    if problem is not None:
        raise MigrationError(f"enqueue refused, nothing was written: {problem}")
    endpoint = Endpoint(pooled=client_pid is not None and client_pid != applied.server_pid)
    _endpoints[key] = endpoint
    return endpoint


def forget() -> None:
    """Check every database again at its next enqueue (tests; a process never needs to)."""
    _endpoints.clear()


def sync_endpoint(target: Any) -> Endpoint:
    """The endpoint of a synchronous enqueue's target (a psycopg Connection or Cursor: app_connections.sync_target),
    checked on it the first time."""
    pg = target if isinstance(target, psycopg.Connection) else target.connection
    pgconn = pg.pgconn
    key = (pgconn.host, pgconn.port, pgconn.db)
    found = _endpoints.get(key)
    if found is None:
        found = judge(key, read_applied(pg), pgconn.backend_pid)
        if found.pooled:
            _say_psycopg_prepares(pg, key)
    return found


async def async_endpoint(target: AsyncTarget) -> Endpoint:
    """The endpoint of an asyncio enqueue's target, checked on it the first time; ConfigError, before anything is
    written, for an asyncpg connection that caches named statements through a transaction pooler."""
    key, client_pid = _async_key(target)
    found = _endpoints.get(key)
    if found is None:
        found = judge(key, await _read_applied_async(target), client_pid)
        if found.pooled and target.driver == "psycopg":
            _say_psycopg_prepares(_async_psycopg(target), key)
    if found.pooled and target.driver != "psycopg":
        _refuse_named_statements(target)
    return found


def _async_psycopg(target: AsyncTarget) -> Any:
    conn = target.conn
    return conn if isinstance(conn, psycopg.AsyncConnection) else conn.connection


def _asyncpg_of(target: AsyncTarget) -> Any:
    """The asyncpg connection under the target (asyncpg's own, or under SQLAlchemy's AsyncConnection)."""
    if target.driver == "asyncpg":
        return target.conn
    return target.conn.sync_connection.connection.driver_connection


def _async_key(target: AsyncTarget) -> tuple[Hashable, int | None]:
    if target.driver == "psycopg":
        pgconn = _async_psycopg(target).pgconn
        return (pgconn.host, pgconn.port, pgconn.db), pgconn.backend_pid
    conn = _asyncpg_of(target)
    # asyncpg keeps the address and the database it connected to (private, stable since 0.18); without them the
    # connection itself stands for its database.
    address, params = getattr(conn, "_addr", None), getattr(conn, "_params", None)
    database = getattr(params, "database", None)
    key: Hashable = ("asyncpg", str(address), database) if address and database else ("asyncpg", id(conn))
    return key, conn.get_server_pid()


async def _read_applied_async(target: AsyncTarget) -> AppliedVersions:
    probe = await _row(target, PROBE)
    name = versions_statement(probe)
    return applied_from(probe, list((await _row(target, name))[0]) if name else None)


async def _row(target: AsyncTarget, name: str) -> tuple[Any, ...]:
    text = statement(name)
    if target.driver == "psycopg":
        async with _async_psycopg(target).cursor(row_factory=tuple_row) as cur:
            await cur.execute(text, prepare=False)
            return await cur.fetchone()  # type: ignore[no-any-return]
    if target.driver == "asyncpg":
        return tuple(await target.conn.fetchrow(text))
    return tuple((await target.conn.exec_driver_sql(text)).one())


def _say_psycopg_prepares(pg: Any, key: Hashable) -> None:
    if pg.prepare_threshold is None:
        return
    pooler.say_once(
        f"prepared {key}",
        "enqueue goes through a transaction pooler (PgBouncer or its kind) and runs its own statements unprepared; "
        f"this psycopg connection still prepares the application's statements after {pg.prepare_threshold} runs "
        "(prepare_threshold), and a statement prepared on one server connection is missing on the "
        "next ('prepared statement \"_pg3_0\" does not exist'). Connect with prepare_threshold=None "
        '(SQLAlchemy: connect_args={"prepare_threshold": None}; Django: OPTIONS {"prepare_threshold": None}).',
    )


def _refuse_named_statements(target: AsyncTarget) -> None:
    conn = _asyncpg_of(target)
    caches = getattr(conn, "_stmt_cache_enabled", True)
    if target.driver == "asyncpg":
        if caches:
            raise ConfigError(
                "enqueue_async refused, nothing was written: this asyncpg connection goes through a transaction "
                "pooler (PgBouncer or its kind) and caches prepared statements, and a statement prepared on one "
                'server connection is missing on the next (\'prepared statement "__asyncpg_stmt_1__" does not '
                "exist'). Connect with statement_cache_size=0 (asyncpg.connect or asyncpg.create_pool)."
            )
        return
    adapted = target.conn.sync_connection.connection.dbapi_connection
    own_names = getattr(adapted, "_prepared_statement_name_func", None) != getattr(adapted, "_default_name_func", 0)
    if caches or getattr(adapted, "_prepared_statement_cache", None) is not None or not own_names:
        raise ConfigError(
            "enqueue_async refused, nothing was written: this SQLAlchemy engine on asyncpg goes through a transaction "
            "pooler (PgBouncer or its kind) and prepares named statements that the next server connection lacks "
            "or already has. Create the engine with connect_args={'statement_cache_size': 0, "
            "'prepared_statement_cache_size': 0, 'prepared_statement_name_func': lambda: "
            "f'__asyncpg_{uuid.uuid4()}__'} (SQLAlchemy's advice for PgBouncer)."
        )
