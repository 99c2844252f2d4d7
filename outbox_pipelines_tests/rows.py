"""Row factories: put outbox rows in the state a test starts from (dead, sent, stuck, aged, due now) without
running the relay through it, in one statement each, the table a quoted identifier.

Each factory changes the rows named by ``ids`` (one id or many) or ``event_ids``, every row of the table when
neither is given, and returns how many rows it changed. Times are database time (``now()``), so a test never
sleeps through a backoff or a retention period: it moves the rows instead.
"""

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

Ids = int | Iterable[int] | None

MAKE_DEAD = """
UPDATE {table} SET status = 'dead', last_error_code = %(code)s, last_error = coalesce(%(error)s, last_error),
    attempts = coalesce(%(attempts)s, attempts), updated_at = coalesce(%(at)s::timestamptz, updated_at)
WHERE {rows}"""

MAKE_SENT = """
UPDATE {table} SET status = 'sent', attempts = coalesce(%(attempts)s, attempts),
    published_at = coalesce(%(published_at)s::timestamptz, now() - %(age)s::interval)
WHERE {rows}"""

MAKE_STUCK = """
UPDATE {table} SET status = 'sending', locked_by = %(worker)s, attempts = %(attempts)s,
    lease_expires_at = now() + %(lease_left)s::interval
WHERE {rows}"""

AGE_ROWS = """
UPDATE {table} SET created_at = coalesce(now() - %(created)s::interval, created_at),
    available_at = coalesce(now() - %(available)s::interval, available_at)
WHERE {rows}"""

MAKE_DUE = """
UPDATE {table} SET available_at = now()
WHERE status = 'pending' AND {rows}"""

EXPIRE_LEASES = """
UPDATE {table} SET lease_expires_at = now() - %(by)s::interval
WHERE status = 'sending' AND {rows}"""


def _run(
    conn: psycopg.Connection[Any], statement: str, table: str, ids: Ids, event_ids: Iterable[str] | None, **params: Any
) -> int:
    """``statement`` on ``table`` for the chosen rows (ids, event ids, or all of them)."""
    chosen: list[sql.Composable] = []
    if ids is not None:
        params["ids"] = [ids] if isinstance(ids, int) else list(ids)
        chosen.append(sql.SQL("id = ANY(%(ids)s)"))
    if event_ids is not None:
        params["event_ids"] = list(event_ids)
        chosen.append(sql.SQL("event_id = ANY(%(event_ids)s)"))
    rows = sql.SQL(" AND ").join(chosen) if chosen else sql.SQL("true")
    return conn.execute(sql.SQL(statement).format(table=sql.Identifier(table), rows=rows), params).rowcount


def make_dead(
    conn: psycopg.Connection[Any],
    table: str,
    ids: Ids = None,
    *,
    code: str | None = "BAD_REQUEST",
    error: str | None = None,
    attempts: int | None = None,
    at: datetime | None = None,
    event_ids: Iterable[str] | None = None,
) -> int:
    """Dead letters, as the relay leaves a message it gave up on: ``code`` its last error code (None: no code,
    as a row buried by hand), with ``error`` its text, ``attempts`` and ``at`` (updated_at) where given."""
    return _run(conn, MAKE_DEAD, table, ids, event_ids, code=code, error=error, attempts=attempts, at=at)


def make_sent(
    conn: psycopg.Connection[Any],
    table: str,
    ids: Ids = None,
    *,
    age: timedelta = timedelta(0),
    published_at: datetime | None = None,
    attempts: int | None = None,
    event_ids: Iterable[str] | None = None,
) -> int:
    """Delivered rows, published ``age`` ago (or at ``published_at``): what retention and lag read."""
    return _run(conn, MAKE_SENT, table, ids, event_ids, age=age, published_at=published_at, attempts=attempts)


def make_stuck(
    conn: psycopg.Connection[Any],
    table: str,
    ids: Ids = None,
    *,
    worker: str = "gone",
    attempts: int = 1,
    lease_left: timedelta = timedelta(minutes=-1),
    event_ids: Iterable[str] | None = None,
) -> int:
    """In flight (``sending``) with ``worker``, as a claim leaves rows; its lease ends ``lease_left`` from now,
    by default a minute ago: stuck rows of a worker that died, for requeue and the stuck check."""
    return _run(conn, MAKE_STUCK, table, ids, event_ids, worker=worker, attempts=attempts, lease_left=lease_left)


def age_rows(
    conn: psycopg.Connection[Any],
    table: str,
    ids: Ids = None,
    *,
    created: timedelta | None = None,
    available: timedelta | None = None,
    event_ids: Iterable[str] | None = None,
) -> int:
    """Rows written ``created`` ago and due since ``available`` ago (each left as it is when not given): an
    old backlog, without waiting for it to grow old."""
    return _run(conn, AGE_ROWS, table, ids, event_ids, created=created, available=available)


def make_due(conn: psycopg.Connection[Any], table: str, ids: Ids = None, event_ids: Iterable[str] | None = None) -> int:
    """Skip the backoff: pending rows are due now (the relay claims rows whose available_at <= now())."""
    return _run(conn, MAKE_DUE, table, ids, event_ids)


def expire_leases(
    conn: psycopg.Connection[Any],
    table: str,
    ids: Ids = None,
    *,
    by: timedelta = timedelta(seconds=1),
    event_ids: Iterable[str] | None = None,
) -> int:
    """In-flight rows whose lease ran out ``by`` ago: another worker may take them again."""
    return _run(conn, EXPIRE_LEASES, table, ids, event_ids, by=by)
