"""How the engine's named statements run: the rows they return, the error for a missing table, and
``TableStatements``, the base of each family of ``OutboxTable``'s statements (one outbox table, one connection).

The families are the ``table_*`` modules (composed in core/storage/table.py); ``SharedTables`` runs the rest
(core/storage/shared_tables.py). Only these engine modules name queries of sql/queries.
"""

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from outbox_pipelines.core.errors import NotAnOutboxTable, UnknownTable
from outbox_pipelines.core.names import validate_table_name
from outbox_pipelines.core.storage.queries import shared_query, table_query

Row = dict[str, Any]
Statement = str | sql.SQL | sql.Composed


# What a statement on a name that is no outbox table raises: the table is missing (42P01), or it is there without
# an outbox's columns (42703: a business table's name, declared or passed by mistake; or a schema older than this
# code). Caught where a statement runs, and told as UnknownTable by ``unknown_table``.
NOT_AN_OUTBOX = (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn)
NOT_AN_OUTBOX_SQLSTATES = frozenset({"42P01", "42703"})


def sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver's error (psycopg, asyncpg), or of the driver error SQLAlchemy wraps."""
    for error in (exc, getattr(exc, "orig", None), exc.__cause__):
        code = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        if isinstance(code, str):
            return code
    return None


def unknown_table(table_name: str, exc: BaseException | None = None) -> UnknownTable:
    """What to do about a statement on ``table_name`` that raised one of NOT_AN_OUTBOX (None: it is missing)."""
    if exc is not None and sqlstate_of(exc) == "42703":
        driver_error = getattr(exc, "orig", None) or exc  # the server's words, not SQLAlchemy's statement dump
        lines = str(driver_error).strip().splitlines()
        server = lines[0] if lines else "a column is missing"
        return NotAnOutboxTable(
            f"table {table_name!r} is not an outbox table ({server}): name an outbox table, or declare a new name "
            "in outbox.toml and run 'outbox-pipelines db upgrade' (which also brings an older outbox schema up to "
            "date)"
        )
    return UnknownTable(
        f"outbox table {table_name!r} does not exist: run 'outbox-pipelines db upgrade', "
        f"or 'outbox-pipelines db create-table {table_name}' for a new table"
    )


def _execute(
    conn: psycopg.Connection, statement: Statement, params: dict[str, Any], prepare: bool | None = None
) -> psycopg.Cursor[Row]:
    cur = conn.cursor(row_factory=dict_row)
    cur.execute(statement, params, prepare=prepare)
    return cur


def _fetch(
    conn: psycopg.Connection, statement: Statement, params: dict[str, Any], prepare: bool | None = None
) -> list[Row]:
    with _execute(conn, statement, params, prepare) as cur:
        return cur.fetchall() if cur.description else []


def _prepare(reuse_plan: bool) -> bool | None:
    """``reuse_plan``: prepare the statement now (its plan kept for the session; PostgreSQL may make it
    generic). Otherwise the connection's own rule (the relay's sessions: never prepared, planned anew)."""
    return True if reuse_plan else None


class TableStatements:
    """One outbox table through one psycopg connection, and how its statements run.

    The table's name is validated here, where it enters the engine; the statements
    of every family quote it as an identifier and do not check it again.
    """

    def __init__(self, conn: psycopg.Connection, table_name: str) -> None:
        self.conn = conn
        self.table_name = validate_table_name(table_name)
        # Ordering keys a settle could not release because a writer was committing a message of the key
        # (migration 0010): the relay releases them again once its own transaction is over.
        self.contended_keys: set[str] = set()
        # The rows the last claim found behind their keys' heads and left waiting (sql/'s claim_key_behind).
        self.left_waiting = 0

    def _note_contended(self, keys: Sequence[str] | None) -> None:
        if keys:
            self.contended_keys.update(keys)

    def _run(self, query: str, params: dict[str, Any], *, reuse_plan: bool = False) -> list[Row]:
        try:
            return _fetch(
                self.conn,
                table_query(query, self.table_name),
                {"table_name": self.table_name, **params},
                _prepare(reuse_plan),
            )
        except NOT_AN_OUTBOX as exc:
            raise unknown_table(self.table_name, exc) from None

    def _run_shared(self, query: str, params: dict[str, Any]) -> list[Row]:
        """A statement of the shared tables about this table (its lock, its audit rows)."""
        return _fetch(self.conn, shared_query(query), {"table_name": self.table_name, **params})
