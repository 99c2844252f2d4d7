"""The payload limit the database holds for each outbox table (migration 0020), and enqueue's sentence when it refuses.

A trigger per table refuses a payload or headers over OUTBOX_MAX_PAYLOAD_BYTES (as JSON text), whoever writes;
enqueue checks first and gives the same InvalidMessage. ``apply`` sets each declared table's size at ``db upgrade``.
How: docs/explanation/storage.md, "The payload limit".
"""

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import psycopg
from psycopg.rows import dict_row

from outbox_pipelines.core.canonical import DEFAULT_MAX_PAYLOAD_BYTES
from outbox_pipelines.core.errors import InvalidMessage, MigrationError
from outbox_pipelines.core.storage.connections import connect
from outbox_pipelines.core.storage.migration_safety import LockWaits, run_with_lock_waits
from outbox_pipelines.core.storage.queries import shared_query

CONSTRAINT = re.compile(r"outbox_payload_max_(\d+)_bytes")
CHECK_VIOLATION = "23514"


def constraint_name(max_bytes: int) -> str:
    return f"outbox_payload_max_{max_bytes}_bytes"


def limit_named(name: object) -> int | None:
    """The limit a constraint of that name holds; None for any other constraint (or none)."""
    found = CONSTRAINT.fullmatch(name) if isinstance(name, str) else None
    return int(found[1]) if found else None


def _refused_constraint(exc: BaseException) -> str | None:
    """The constraint a check violation names, from psycopg's error (``diag``), asyncpg's, or the driver error
    SQLAlchemy wraps (``orig``, and asyncpg's behind SQLAlchemy's adapter)."""
    orig = getattr(exc, "orig", None)
    for error in (exc, orig, getattr(orig, "__cause__", None), exc.__cause__):
        if error is None:
            continue
        code = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        if code != CHECK_VIOLATION:
            continue
        diag = getattr(error, "diag", None)
        name = getattr(diag, "constraint_name", None) or getattr(error, "constraint_name", None)
        if isinstance(name, str):
            return name
    return None


def refusal(exc: BaseException, table_name: str) -> InvalidMessage | None:
    """The InvalidMessage for the database's refusal of a message over ``table_name``'s payload limit; None for any
    other error. Like every failed statement, the refusal ended the transaction it ran in (a COPY's savepoint
    excepted: enqueue undoes the COPY alone)."""
    limit = limit_named(_refused_constraint(exc))
    if limit is None:
        return None
    return InvalidMessage(
        f"payload or headers over the limit of {limit} bytes of outbox table {table_name!r}, refused by the "
        "database (it measures the JSON text as PostgreSQL writes it, a space after each ',' and ':'). Nothing "
        "was written. Set OUTBOX_MAX_PAYLOAD_BYTES and run 'outbox-pipelines db upgrade' to change the limit, or "
        "store the body elsewhere and enqueue a reference"
    )


def migration_settings(max_bytes: int, project: str) -> dict[str, str]:
    """What migration 0020 reads to give the tables that have no limit yet theirs: the size, and the project
    upgrading (a table another project owns is left to that project's upgrade)."""
    return {"outbox.max_payload_bytes": str(int(max_bytes)), "outbox.project": project}


def _rows(conn: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(shared_query(name), params)
        return cur.fetchall()


def current(conn: psycopg.Connection[Any], tables: Iterable[str]) -> dict[str, int | None]:
    """The limit each existing table of ``tables`` holds now (None: none, or no trigger, as before 0020)."""
    return {
        row["table_name"]: row["max_bytes"] for row in _rows(conn, "payload_limit_current", {"tables": list(tables)})
    }


def changes(conn: psycopg.Connection[Any], tables: Iterable[str], max_bytes: int) -> list[str]:
    """The existing tables of ``tables`` whose limit is not ``max_bytes`` (or that have no trigger yet)."""
    rows = _rows(conn, "payload_limit_changes", {"tables": list(tables), "max_bytes": max_bytes})
    return [row["table_name"] for row in rows]


def _statement(table: str, max_bytes: int) -> str:
    """What ``apply`` runs for ``table``, as text for a script (the name is a validated table name)."""
    return f"SELECT outbox_set_payload_limit('{table}', {int(max_bytes)});"


def plan_sql(url: str, tables: Iterable[str], max_bytes: int) -> list[str]:
    """The statements ``apply`` would run after the migrations, as text (``db upgrade --dry-run`` and ``--sql``):
    for each table of ``tables`` whose limit differs, and each not created yet when ``max_bytes`` is not the size
    outbox_create_table gives. Nothing is changed."""
    tables = list(tables)
    with connect(url) as conn:
        # Before 0020, its own step gives the tables that exist this size.
        existing = current(conn, tables) if _has_limits(conn) else dict.fromkeys(_existing(conn, tables), max_bytes)
    todo = [
        table
        for table in tables
        if (table in existing and existing[table] != max_bytes)
        or (table not in existing and max_bytes != DEFAULT_MAX_PAYLOAD_BYTES)
    ]
    return [_statement(table, max_bytes) for table in todo]


def _has_limits(conn: psycopg.Connection[Any]) -> bool:
    return bool(_rows(conn, "payload_limit_present", {})[0]["present"])


def _existing(conn: psycopg.Connection[Any], tables: list[str]) -> list[str]:
    return [row["name"] for row in _rows(conn, "schema_existing_tables", {"tables": tables})]


@dataclass
class PayloadLimitReport:
    """What ``apply`` did: the tables given ``max_bytes`` now, those that had it, those left (and why)."""

    max_bytes: int
    applied: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def apply(url: str, tables: Iterable[str], max_bytes: int, waits: LockWaits | None = None) -> PayloadLimitReport:
    """Give each existing table of ``tables`` the limit ``max_bytes``, one short transaction a table under the
    migration lock timeout (``waits``), retried behind a long transaction (only adding the trigger takes a lock). A
    table this login does not own, or one a transaction held past ``waits.give_up_after_s``, is skipped (said in
    ``skipped``), left as it was."""
    waits = waits or LockWaits.from_env()
    report = PayloadLimitReport(max_bytes)
    tables = list(tables)
    with connect(url, autocommit=True) as conn:
        todo = changes(conn, tables, max_bytes)
        report.unchanged = [table for table in _existing(conn, tables) if table not in todo]
        for table in todo:
            try:
                run_with_lock_waits(
                    conn,
                    f"payload limit of {table}",
                    partial(_set, conn, table, max_bytes),
                    waits,
                    clock=time.monotonic,
                )
            except psycopg.errors.InsufficientPrivilege:
                report.skipped[table] = "this login does not own it (the schema owner's db upgrade sizes it)"
            except MigrationError as exc:  # a transaction held the table all along: the next db upgrade sizes it
                report.skipped[table] = str(exc)
            else:
                report.applied.append(table)
    return report


def _set(conn: psycopg.Connection[Any], table: str, max_bytes: int) -> None:
    with conn.transaction():
        conn.execute(shared_query("payload_limit_set"), {"table_name": table, "max_bytes": max_bytes})
