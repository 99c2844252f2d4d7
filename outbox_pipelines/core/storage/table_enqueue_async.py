"""Enqueue's statements on an asyncio connection (``AsyncTarget``): the same named statements as
table_enqueue.py's, with the same parameters, awaited on psycopg's AsyncConnection, asyncpg, or SQLAlchemy's
AsyncConnection; renumbered ``$1, $2`` for the drivers that take that style (``numbered_table_query``)."""

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from outbox_pipelines.core.storage.app_connections import AsyncTarget
from outbox_pipelines.core.storage.payload_limit import refusal
from outbox_pipelines.core.storage.queries import numbered_table_query, table_query
from outbox_pipelines.core.storage.statements import NOT_AN_OUTBOX_SQLSTATES, sqlstate_of, unknown_table
from outbox_pipelines.core.storage.table_enqueue import KEPT_CURSOR, NewRow, insert_many_params, insert_row_params

# The cursors a statement runs on as they are (as connections.statement_cursor's, for asyncio).
_STATEMENT_CURSORS = (psycopg.AsyncCursor, psycopg.AsyncClientCursor)


def _ordered(params: tuple[Any, ...] | dict[str, Any], order: tuple[str, ...] | int) -> tuple[Any, ...]:
    return tuple(params[name] for name in order) if isinstance(order, tuple) else tuple(params)  # type: ignore[call-overload]


async def _rows(
    target: AsyncTarget,
    query: str,
    table_name: str,
    params: tuple[Any, ...] | dict[str, Any],
    prepare: bool | None = None,
) -> Sequence[Sequence[Any]]:
    """The statement's rows; ``prepare``: psycopg's, False behind a transaction pooler (core/enqueue_guard.py)."""
    try:
        if target.driver == "psycopg":
            return await _psycopg_rows(target.conn, table_query(query, table_name), params, prepare)
        statement, order = numbered_table_query(query, table_name)
        args = _ordered(params, order)
        if target.driver == "asyncpg":
            return list(await target.conn.fetch(statement, *args))
        result = await target.conn.exec_driver_sql(statement, args)
        return list(result.all())
    except Exception as exc:
        if sqlstate_of(exc) in NOT_AN_OUTBOX_SQLSTATES:
            raise unknown_table(table_name, exc) from None
        if (refused := refusal(exc, table_name)) is not None:
            raise refused from None
        raise


async def _psycopg_rows(
    conn: psycopg.AsyncConnection[Any] | psycopg.AsyncCursor[Any], statement: str, params: Any, prepare: bool | None
) -> list[Any]:
    if type(conn) in _STATEMENT_CURSORS:  # the application's own cursor, left making its own rows
        cursor: Any = conn
        row_factory = cursor.row_factory
        cursor.row_factory = tuple_row
        try:
            await cursor.execute(statement, params, prepare=prepare)
            return await cursor.fetchall()  # type: ignore[no-any-return]
        finally:
            cursor.row_factory = row_factory
    pg = conn if isinstance(conn, psycopg.AsyncConnection) else conn.connection
    # The connection's kept cursor (table_enqueue._run_on_connection), taken out while in use: a coroutine
    # enqueueing on the same connection meanwhile makes its own.
    kept: dict[str, Any] | None = getattr(pg, "__dict__", None)
    cur = kept.pop(KEPT_CURSOR, None) if kept is not None else None
    if cur is None or cur.closed:
        cur = pg.cursor(row_factory=tuple_row)
    try:
        await cur.execute(statement, params, prepare=prepare)
        return await cur.fetchall()
    finally:
        if kept is not None:
            kept[KEPT_CURSOR] = cur


async def insert_row_async(
    target: AsyncTarget, table_name: str, row: NewRow, now: datetime | None, prepare: bool | None = None
) -> int | None:
    """``table_enqueue.insert_row`` on an asyncio connection: the new row's id, or None if its event_id exists."""
    query, params = insert_row_params(row, now)
    found = await _rows(target, query, table_name, params, prepare)
    return int(found[0][0]) if found else None


async def insert_many_async(
    target: AsyncTarget,
    table_name: str,
    columns: dict[str, list[Any]],
    now: datetime | None,
    prepare: bool | None = None,
) -> dict[str, int]:
    """``EnqueueStatements.insert_many`` on an asyncio connection: the new ids by event_id."""
    query, params = insert_many_params(columns, now)
    return {event_id: int(row_id) for row_id, event_id in await _rows(target, query, table_name, params, prepare)}


async def find_by_event_ids_async(
    target: AsyncTarget, table_name: str, event_ids: Sequence[str], prepare: bool | None = None
) -> dict[str, tuple[int, str]]:
    """(id, payload_sha) of the stored rows with these event ids, by event_id."""
    rows = await _rows(target, "outbox_find_by_event_ids", table_name, {"event_ids": list(event_ids)}, prepare)
    return {event_id: (int(row_id), sha) for row_id, event_id, sha in rows}
