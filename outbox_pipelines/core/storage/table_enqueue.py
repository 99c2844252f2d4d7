"""Enqueue: the statements that write new messages into one outbox table (one row, a batch in one
statement, a batch by COPY) and find the rows an enqueue already stored."""

from collections.abc import Iterable, Sequence
from contextlib import nullcontext, suppress
from datetime import datetime
from typing import Any, NamedTuple

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

from outbox_pipelines.core.storage.connections import driver_connection, statement_cursor
from outbox_pipelines.core.storage.payload_limit import refusal
from outbox_pipelines.core.storage.queries import table_query
from outbox_pipelines.core.storage.statements import NOT_AN_OUTBOX, Row, TableStatements, _fetch, unknown_table


class NewRow(NamedTuple):
    """A message to insert, checked: payload and headers as canonical JSON text."""

    event_id: str
    tenant_id: str | None
    topic: str
    payload: str
    payload_sha: str
    headers: str
    available_at: datetime | None
    ordering_key: str | None = None


# COPY's text format, written here: psycopg's write_row takes 2 µs a row, a tenth of a batch enqueue.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
# Text per COPY message: small enough that the server stores a batch while the rest of it is still
# being encoded (a batch of 1,000 messages of 300 bytes went 1.3x faster with 8 kB than in one piece).
_COPY_CHUNK_CHARS = 8_192


def _copy_line(row_id: int, row: NewRow) -> str:
    """One row of ``outbox_copy_in``: id, event_id, tenant_id, topic, payload, payload_sha, headers.

    JSON text holds no control character (it escapes them with a backslash), so the common row, with
    no backslash anywhere, printable identifiers and no tenant, needs no escaping at all."""
    event_id, tenant_id, topic, payload, payload_sha, headers, _, _ = row
    if (
        tenant_id is None
        and "\\" not in payload
        and "\\" not in headers
        and "\\" not in event_id
        and "\\" not in topic
        and event_id.isprintable()
        and topic.isprintable()
    ):
        return f"{row_id}\t{event_id}\t\\N\t{topic}\t{payload}\t{payload_sha}\t{headers}\n"
    fields = [str(row_id), event_id, tenant_id, topic, payload, payload_sha, headers]
    return "\t".join("\\N" if field is None else field.translate(_COPY_ESCAPES) for field in fields) + "\n"


def insert_row_params(row: NewRow, now: datetime | None) -> tuple[str, tuple[Any, ...]]:
    """The statement that writes one message, and its positional parameters (sync and asyncio alike)."""
    # The row's first six fields (event_id to headers) in the statement's order, then when it is due.
    due = row.available_at if row.available_at is not None else now
    params: tuple[Any, ...] = (*row[:6], due)
    ordering_key = row.ordering_key
    if ordering_key is None:  # the unordered statement stays as it was: ordering costs it nothing
        return "outbox_insert", params
    return "outbox_insert_keyed", (*params, ordering_key)


def insert_many_params(columns: dict[str, list[Any]], now: datetime | None) -> tuple[str, dict[str, Any]]:
    """The statement that writes a batch (columns as parallel lists, ``enqueue._columns``) and its parameters."""
    params: dict[str, Any] = {**columns, "now": now}
    if any(key is not None for key in params.pop("ordering_keys", ())):
        return "outbox_insert_many_keyed", {**params, "ordering_keys": columns["ordering_keys"]}
    return "outbox_insert_many", params


def insert_row(
    conn: Any, table_name: str, row: NewRow, now: datetime | None = None, prepare: bool | None = None
) -> int | None:
    """Insert one message (payload and headers as canonical JSON text) into ``table_name`` (validated by
    the caller); its id, or None if its event_id exists. ``conn``: what the application passed to
    enqueue. On its own cursor (``statement_cursor``) the statement runs there, replacing the cursor's
    current result; on anything else, on a cursor of the connection behind it (``driver_connection``).

    A function, not an ``EnqueueStatements`` method: it runs inside the application's own transaction,
    once per message, where building the table's statement object and _run's dicts are part of what
    the enqueue adds to that transaction (bench/results.md). ``prepare``: psycopg's, False
    behind a transaction pooler (core/enqueue_guard.py)."""
    query, params = insert_row_params(row, now)
    statement = table_query(query, table_name)
    cursor = statement_cursor(conn)
    try:
        if cursor is not None:
            found = _run_on_cursor(cursor, statement, params, prepare)
        else:
            found = _run_on_connection(driver_connection(conn), statement, params, prepare)
    except NOT_AN_OUTBOX as exc:
        raise unknown_table(table_name, exc) from None
    except psycopg.errors.CheckViolation as exc:
        if (refused := refusal(exc, table_name)) is None:
            raise
        raise refused from None
    return int(found[0]) if found else None


# Where a connection keeps the cursor its one-row enqueues run on (in the connection's own __dict__: a cursor
# refers to its connection, so a map from connections to cursors would keep every connection alive).
KEPT_CURSOR = "_outbox_enqueue_cursor"


def _run_on_connection(pg: psycopg.Connection, statement: Any, params: tuple[Any, ...], prepare: bool | None) -> Any:
    """The statement's row, on the cursor this connection keeps for enqueues: a new cursor per call (its
    adapters, its dumpers and loaders looked up again, then closed) cost about 11 µs of client CPU a transaction
    (bench/results.md, "one-row enqueue against a plain INSERT"). Taken out while in use: a second thread on the
    same connection makes its own."""
    kept: dict[str, Any] | None = getattr(pg, "__dict__", None)
    cur = kept.pop(KEPT_CURSOR, None) if kept is not None else None
    if cur is None or cur.closed:
        cur = pg.cursor(row_factory=tuple_row)
    try:
        cur.execute(statement, params, prepare=prepare)
        return cur.fetchone()
    finally:
        if kept is not None:
            kept[KEPT_CURSOR] = cur


def _run_on_cursor(cur: psycopg.Cursor, statement: Any, params: tuple[Any, ...], prepare: bool | None) -> Any:
    """The statement's row, read as a tuple whatever rows the application's cursor makes (dicts, a class
    of its own), and the cursor left making them."""
    row_factory = cur.row_factory
    if row_factory is tuple_row:  # a cursor's default
        cur.execute(statement, params, prepare=prepare)
        return cur.fetchone()
    cur.row_factory = tuple_row
    try:
        cur.execute(statement, params, prepare=prepare)
        return cur.fetchone()
    finally:
        cur.row_factory = row_factory


class EnqueueStatements(TableStatements):
    """Enqueue into one outbox table."""

    # psycopg's ``prepare`` for these statements: False behind a transaction pooler (core/enqueue_guard.py).
    enqueue_prepare: bool | None = None

    def _run_enqueue(self, query: str, params: dict[str, Any]) -> list[Row]:
        try:
            return _fetch(
                self.conn,
                table_query(query, self.table_name),
                {"table_name": self.table_name, **params},
                self.enqueue_prepare,
            )
        except NOT_AN_OUTBOX as exc:
            raise unknown_table(self.table_name, exc) from None
        except psycopg.errors.CheckViolation as exc:
            if (refused := refusal(exc, self.table_name)) is None:
                raise
            raise refused from None

    def insert_many(self, columns: dict[str, list[Any]], now: datetime | None = None) -> dict[str, int]:
        """Insert the messages (columns as parallel lists) in one statement; the new ids by event_id."""
        query, params = insert_many_params(columns, now)
        rows = self._run_enqueue(query, params)
        return {row["event_id"]: int(row["id"]) for row in rows}

    def copy_new(self, rows: Iterable[NewRow], count: int) -> list[int] | None:
        """COPY ``count`` new messages in (due now: available_at is not written), under a savepoint; their
        ids in the rows' order, or None, having written nothing, when an event_id is already stored.

        ``rows`` is read as the COPY goes, a chunk at a time: the server stores one chunk while the next
        is made. An exception from it stops the COPY, undoes what was sent, and goes to the caller.

        On an autocommit connection outside a transaction the batch gets one of its own (all or
        nothing); otherwise it joins the caller's, which an idle connection outside autocommit opens.
        """
        conn = self.conn
        own_transaction = conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE
        with conn.transaction() if own_transaction else nullcontext():
            return self._copy_in_savepoint(rows, count)

    def _copy_in_savepoint(self, rows: Iterable[NewRow], count: int) -> list[int] | None:
        try:
            # Client-side binding: the savepoint and the id reservation cross as one message.
            with psycopg.ClientCursor(self.conn, row_factory=tuple_row) as opening:
                opening.execute(
                    table_query("outbox_copy_open", self.table_name), {"table_name": self.table_name, "count": count}
                )
                opening.nextset()
                ids_text = opening.fetchone()[0]  # type: ignore[index]
            ids = [int(row_id) for row_id in ids_text[1:-1].split(",")]
            with self.conn.cursor() as cur, cur.copy(table_query("outbox_copy_in", self.table_name)) as copy:
                lines, size = [], 0
                for row_id, row in zip(ids, rows, strict=True):
                    line = _copy_line(row_id, row)
                    lines.append(line)
                    size += len(line)
                    if size >= _COPY_CHUNK_CHARS:
                        copy.write("".join(lines))
                        lines, size = [], 0
                copy.write("".join(lines))
        except BaseException as exc:
            self._undo_copy()  # whatever stopped the COPY, nothing of it stays
            # A stored event_id; or a login that may not write ids (the producer role: db grant): INSERT instead.
            if isinstance(exc, (psycopg.errors.UniqueViolation, psycopg.errors.InsufficientPrivilege)):
                return None
            if isinstance(exc, NOT_AN_OUTBOX):
                raise unknown_table(self.table_name, exc) from None
            if (refused := refusal(exc, self.table_name)) is not None:
                raise refused from None
            raise
        self.conn.execute(table_query("outbox_copy_release", self.table_name), prepare=self.enqueue_prepare)
        return ids

    def _undo_copy(self) -> None:
        """Back to before ``outbox_copy_open``: the caller's transaction goes on. Where the savepoint was
        never made (the transaction had failed before, the connection is gone) this fails too, and the
        error that brought us here is the one to report."""
        with suppress(psycopg.Error):
            self.conn.execute(table_query("outbox_copy_undo", self.table_name), prepare=self.enqueue_prepare)

    def find_by_event_ids(self, event_ids: Sequence[str]) -> dict[str, tuple[int, str]]:
        """(id, payload_sha) of the stored rows with these event ids, by event_id."""
        rows = self._run_enqueue("outbox_find_by_event_ids", {"event_ids": list(event_ids)})
        return {row["event_id"]: (int(row["id"]), row["payload_sha"]) for row in rows}
