"""What died and what it holds back, row by row: a table's dead messages, the dead heads that block ordering keys,
and a message found by its event id, ordering key or tenant across tables. The on-call page lists them; the
counts and verdicts stay the checks' (table_status.py, checks.py).

Each list is bounded (its limit) and read through the table's indexes (sql/queries/message_rows.sql); the
payload is never read, and an error's text is shown with its credentials masked (core/redaction.py).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from outbox_pipelines.core.errors import UnknownTable
from outbox_pipelines.core.names import table_identifier
from outbox_pipelines.core.redaction import mask_credentials
from outbox_pipelines.core.storage.queries import named_queries, table_query
from outbox_pipelines.core.storage.statements import NOT_AN_OUTBOX, unknown_table

# The most rows one list returns, whatever limit is asked for: a page, not an export.
MAX_LIMIT = 1000


@dataclass(frozen=True)
class MessageRow:
    table: str
    id: int
    event_id: str
    topic: str
    ordering_key: str | None
    tenant_id: str | None
    status: str
    attempts: int
    error_code: str | None
    error: str | None
    at: datetime  # when it died / was last changed (updated_at)
    # For a dead head of a blocked ordering key: how many later messages of its key wait; else 0.
    waiting_behind: int


@lru_cache(maxsize=512)
def _statement(picker: str, table: str) -> str:
    """message_rows_of around the named picker, both bound to the quoted table; rendered once (psycopg then
    reuses its parse, as table_query's statements)."""
    ident = table_identifier(table)
    picked = sql.SQL(named_queries()[picker]).format(table=ident)
    return sql.SQL(named_queries()["message_rows_of"]).format(table=ident, picked=picked).as_string(None)


def _limit(limit: int, most: int = MAX_LIMIT) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive whole number, not {limit!r}")
    return min(limit, most)


def _rows(conn: psycopg.Connection[Any], table: str, picker: str, params: dict[str, Any]) -> list[MessageRow]:
    statement = _statement(picker, table)
    try:
        # A savepoint inside the caller's transaction: a missing table leaves that transaction usable.
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            found = cur.execute(statement, params).fetchall()
    except NOT_AN_OUTBOX as exc:
        raise unknown_table(table, exc) from None
    return [_row(table, r) for r in found]


def _row(table: str, r: dict[str, Any]) -> MessageRow:
    error = r["error"]
    return MessageRow(
        table=table,
        id=int(r["id"]),
        event_id=r["event_id"],
        topic=r["topic"],
        ordering_key=r["ordering_key"],
        tenant_id=r["tenant_id"],
        status=r["status"],
        attempts=int(r["attempts"]),
        error_code=r["error_code"],
        error=mask_credentials(error) if error is not None else None,
        at=r["at"],
        waiting_behind=int(r["waiting_behind"]),
    )


def dead_messages(conn: psycopg.Connection[Any], table: str, limit: int = 20) -> list[MessageRow]:
    """The table's dead messages, the newest death first."""
    return _rows(conn, table, "message_rows_dead", {"limit": _limit(limit)})


def blocked_messages(conn: psycopg.Connection[Any], table: str, limit: int = 20) -> list[MessageRow]:
    """The dead heads that block ordering keys (why each key is blocked: its error), the newest death first,
    each with how many later messages of its key wait behind it."""
    return _rows(conn, table, "message_rows_blocked", {"limit": _limit(limit)})


def find_messages(
    conn: psycopg.Connection[Any],
    tables: Sequence[str],
    *,
    event_id: str | None = None,
    ordering_key: str | None = None,
    tenant_id: str | None = None,
    limit: int = 50,
) -> list[MessageRow]:
    """Messages in any state matching every filter given (at least one), across ``tables``, newest first
    (the time of their last change). A table not in the database is passed over. By ordering key, a key's
    delivered messages are not listed (they are not indexed by key): its waiting, in-flight and dead ones are."""
    if event_id is None and ordering_key is None and tenant_id is None:
        raise ValueError("find_messages needs an event id, an ordering key or a tenant id")
    picker = (
        "message_rows_by_event_id"
        if event_id is not None
        else "message_rows_by_ordering_key"
        if ordering_key is not None
        else "message_rows_by_tenant"
    )
    most = _limit(limit)
    params = {"event_id": event_id, "ordering_key": ordering_key, "tenant_id": tenant_id, "limit": most}
    found: list[MessageRow] = []
    for table in dict.fromkeys(tables):
        try:
            found += _rows(conn, table, picker, params)
        except UnknownTable:
            continue
    found.sort(key=lambda row: (row.at, row.id), reverse=True)
    return found[:most]


def sent_count(conn: psycopg.Connection[Any], table: str, cap: int = 10_000) -> int:
    """How many sent rows the table keeps, counted up to ``cap`` (``cap`` means at least that many)."""
    try:
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(table_query("message_rows_sent_count", table), {"cap": _limit(cap, 1_000_000)}).fetchone()
    except NOT_AN_OUTBOX as exc:
        raise unknown_table(table, exc) from None
    return int(row["n"]) if row else 0
