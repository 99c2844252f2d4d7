"""Enqueue into an outbox table, in the caller's transaction: ``Outbox``, sync and asyncio. The message is
checked and made into its row by core/prepare.py, the connection resolved by core/storage/app_connections.py,
the row written by core/storage/table_enqueue.py (sync) and table_enqueue_async.py."""

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from outbox_pipelines.core.enqueue_guard import async_endpoint, sync_endpoint
from outbox_pipelines.core.errors import InvalidMessage
from outbox_pipelines.core.models import EnqueueResult, Message
from outbox_pipelines.core.names import validate_table_name
from outbox_pipelines.core.prepare import (  # noqa: F401 (_prepare: the tests and bench/ import it from here too)
    BatchPlan,
    _plain_event_ids,
    _prepare,
    _prepare_one,
    _prepared_rows,
    payload_limit,
)
from outbox_pipelines.core.storage.app_connections import async_target, sync_target
from outbox_pipelines.core.storage.connections import driver_connection
from outbox_pipelines.core.storage.table import NewRow, OutboxTable
from outbox_pipelines.core.storage.table_enqueue import insert_row
from outbox_pipelines.core.storage.table_enqueue_async import (
    find_by_event_ids_async,
    insert_many_async,
    insert_row_async,
)
from outbox_pipelines.core.telemetry.counts import count_enqueued, count_enqueued_one
from outbox_pipelines.core.telemetry.creation import Creation, creation, producer

# From this many new rows on, enqueue_many writes with COPY; below, one INSERT ... SELECT FROM
# unnest is faster (COPY costs three more round trips). Measured: bench/results.md, "enqueue_many".
COPY_MIN_ROWS = 20


def _invisible_conflict(event_id: str) -> InvalidMessage:
    return InvalidMessage(
        f"event_id {event_id!r} conflicts with a row this transaction cannot see "
        "(use READ COMMITTED isolation for enqueue)"
    )


def _columns(rows: list[NewRow]) -> dict[str, list[Any]]:
    """The prepared rows as the parallel lists ``OutboxTable.insert_many`` takes."""
    names = (
        "event_ids",
        "tenant_ids",
        "topics",
        "payloads",
        "payload_shas",
        "headers",
        "available_ats",
        "ordering_keys",
    )
    return {name: list(column) for name, column in zip(names, zip(*rows, strict=True), strict=True)}


class Outbox:
    """One outbox table, as the application writing into it sees it.

    >>> outbox = Outbox("billing_outbox")
    >>> with engine.begin() as conn:
    ...     conn.execute(...)  # the business write
    ...     outbox.enqueue(conn, Message(topic="org.changed", payload={...}, event_id="..."))

    ``enqueue`` and ``enqueue_many`` take the caller's synchronous connection (psycopg, SQLAlchemy, Django's);
    ``enqueue_async`` and ``enqueue_many_async`` its asyncio one (psycopg, SQLAlchemy, asyncpg). Each joins
    the caller's transaction; one with none open is refused unless the call says ``outside_transaction=True``
    (core/storage/app_connections.py).

    Inside an OpenTelemetry span, each message gets a ``create {topic}`` span, its context stored in the
    message's headers (docs/explanation/enqueue.md, "Trace context"); ``messaging_system`` names the broker
    the table feeds on those spans (default ``outbox``), ``tracer_provider`` their provider (default: the
    global one).
    """

    def __init__(
        self,
        table_name: str,
        *,
        max_payload_bytes: int | None = None,
        messaging_system: str | None = None,
        tracer_provider: Any = None,
    ) -> None:
        # Checked here, not at the first enqueue: a bad name is the application's bug, found at start-up.
        self.table_name = validate_table_name(table_name)
        self.max_payload_bytes = max_payload_bytes or payload_limit()
        self._producer = producer(self.table_name, messaging_system, tracer_provider)

    def enqueue(
        self, conn: Any, message: Message, *, now: datetime | None = None, outside_transaction: bool = False
    ) -> EnqueueResult:
        """Insert ``message`` in the caller's transaction; a duplicate event_id returns the stored row."""
        created = creation(self._producer)
        if created is None:
            return self._enqueue(conn, message, now, outside_transaction, None)
        with created:
            return self._enqueue(conn, message, now, outside_transaction, created)

    def _enqueue(
        self, conn: Any, message: Message, now: datetime | None, outside_transaction: bool, created: Creation | None
    ) -> EnqueueResult:
        row = _prepare_one(message, self.max_payload_bytes, created)
        target = sync_target(conn, outside_transaction=outside_transaction)
        prepare = sync_endpoint(target).prepare  # the schema checked at the process's first enqueue
        row_id = insert_row(target, self.table_name, row, now, prepare)
        if created is not None:
            created.written(() if row_id is None else (row.event_id,))
        if row_id is not None:
            count_enqueued_one(self.table_name, row.topic)
            return EnqueueResult.new(row_id, row.event_id)
        # Another transaction holds this event_id; read it (READ COMMITTED sees it now).
        outbox_table = OutboxTable(driver_connection(target), self.table_name)
        outbox_table.enqueue_prepare = prepare
        return _duplicate(row, outbox_table.find_by_event_ids([row.event_id]))

    async def enqueue_async(
        self, conn: Any, message: Message, *, now: datetime | None = None, outside_transaction: bool = False
    ) -> EnqueueResult:
        """``enqueue`` on the caller's asyncio connection, in its transaction, without blocking the event loop."""
        created = creation(self._producer)
        if created is None:
            return await self._enqueue_async(conn, message, now, outside_transaction, None)
        with created:
            return await self._enqueue_async(conn, message, now, outside_transaction, created)

    async def _enqueue_async(
        self, conn: Any, message: Message, now: datetime | None, outside_transaction: bool, created: Creation | None
    ) -> EnqueueResult:
        row = _prepare_one(message, self.max_payload_bytes, created)
        target = await async_target(conn, outside_transaction=outside_transaction)
        prepare = (await async_endpoint(target)).prepare
        row_id = await insert_row_async(target, self.table_name, row, now, prepare)
        if created is not None:
            created.written(() if row_id is None else (row.event_id,))
        if row_id is not None:
            count_enqueued_one(self.table_name, row.topic)
            return EnqueueResult.new(row_id, row.event_id)
        return _duplicate(row, await find_by_event_ids_async(target, self.table_name, [row.event_id], prepare))

    def enqueue_many(
        self,
        conn: Any,
        messages: Iterable[Message],
        *,
        now: datetime | None = None,
        outside_transaction: bool = False,
    ) -> list[EnqueueResult]:
        """Insert many messages at once; results are in input order.

        All or nothing: one bad message raises InvalidMessage and writes nothing.
        """
        batch = list(messages)
        created = creation(self._producer)
        if created is None:
            return self._enqueue_many(conn, batch, now, outside_transaction, None)
        with created:
            return self._enqueue_many(conn, batch, now, outside_transaction, created)

    def _enqueue_many(
        self,
        conn: Any,
        batch: list[Message],
        now: datetime | None,
        outside_transaction: bool,
        created: Creation | None,
    ) -> list[EnqueueResult]:
        target = sync_target(conn, outside_transaction=outside_transaction)
        outbox_table = OutboxTable(driver_connection(target), self.table_name)
        outbox_table.enqueue_prepare = sync_endpoint(target).prepare
        event_ids = _plain_event_ids(batch)
        # COPY writes no ordering key (a keyed message's place in its key is decided as it is inserted).
        if (
            event_ids is not None
            and len(batch) >= COPY_MIN_ROWS
            and now is None
            and len(set(event_ids)) == len(event_ids)
            and all(message.ordering_key is None for message in batch)
        ):
            copied = self._copy(outbox_table, batch, event_ids, created)
            if copied is not None:
                return copied
        plan = BatchPlan(batch, self.max_payload_bytes, event_ids, created)
        if not plan.prepared:
            return []
        inserted = outbox_table.insert_many(_columns(plan.unique), now=now)
        if created is not None:
            created.written(inserted)
        missing = plan.missing(inserted)
        return self._results(plan, inserted, outbox_table.find_by_event_ids(missing) if missing else {})

    async def enqueue_many_async(
        self,
        conn: Any,
        messages: Iterable[Message],
        *,
        now: datetime | None = None,
        outside_transaction: bool = False,
    ) -> list[EnqueueResult]:
        """``enqueue_many`` on the caller's asyncio connection: one statement for the batch, all or nothing."""
        batch = list(messages)
        created = creation(self._producer)
        if created is None:
            return await self._enqueue_many_async(conn, batch, now, outside_transaction, None)
        with created:
            return await self._enqueue_many_async(conn, batch, now, outside_transaction, created)

    async def _enqueue_many_async(
        self,
        conn: Any,
        batch: list[Message],
        now: datetime | None,
        outside_transaction: bool,
        created: Creation | None,
    ) -> list[EnqueueResult]:
        plan = BatchPlan(batch, self.max_payload_bytes, _plain_event_ids(batch), created)
        target = await async_target(conn, outside_transaction=outside_transaction)
        prepare = (await async_endpoint(target)).prepare
        if not plan.prepared:
            return []
        inserted = await insert_many_async(target, self.table_name, _columns(plan.unique), now, prepare)
        if created is not None:
            created.written(inserted)
        missing = plan.missing(inserted)
        existing = await find_by_event_ids_async(target, self.table_name, missing, prepare) if missing else {}
        return self._results(plan, inserted, existing)

    def _results(
        self, plan: "BatchPlan", inserted: dict[str, int], existing: dict[str, tuple[int, str]]
    ) -> list[EnqueueResult]:
        count_enqueued(self.table_name, [row.topic for row in plan.unique if row.event_id in inserted])
        return [_result(row, plan.first_of[row.event_id], inserted, existing) for row in plan.prepared]

    def _copy(
        self, outbox_table: OutboxTable, batch: list[Message], event_ids: list[str], created: Creation | None
    ) -> list[EnqueueResult] | None:
        """Write a batch of new messages, due now, with COPY; None, having written nothing, when an event_id
        is already stored (the INSERT that reports duplicates runs instead).

        Rows stream into the COPY as they are prepared, so that the server stores one part while the
        next is encoded (a bare COPY of rows made one by one gets the same overlap). A bad message
        stops the COPY and undoes it: nothing is written, and the error is the one ``_prepare`` gives.
        """
        ids = outbox_table.copy_new(_prepared_rows(batch, self.max_payload_bytes, event_ids, created), len(batch))
        if ids is None:
            return None
        if created is not None:
            created.written(event_ids)
        count_enqueued(self.table_name, [message.topic for message in batch])
        return [EnqueueResult.new(row_id, event_id) for row_id, event_id in zip(ids, event_ids, strict=True)]


def _duplicate(row: NewRow, existing: dict[str, tuple[int, str]]) -> EnqueueResult:
    """The one-row enqueue's answer when the insert wrote nothing: the stored row of its event_id."""
    found = existing.get(row.event_id)
    if found is None:
        raise _invisible_conflict(row.event_id)
    existing_id, existing_sha = found
    return EnqueueResult(existing_id, row.event_id, True, same_payload=existing_sha == row.payload_sha)


def _result(
    row: NewRow, first: NewRow, inserted: dict[str, int], existing: dict[str, tuple[int, str]]
) -> EnqueueResult:
    """What ``enqueue_many`` reports for one prepared row; ``first`` is the row of its event_id written first."""
    event_id = row.event_id
    if event_id in inserted:
        if row is first:
            return EnqueueResult(inserted[event_id], event_id, False)
        # The same event_id again in this call: a duplicate of the one just written.
        same_payload = row.payload_sha == first.payload_sha
        return EnqueueResult(inserted[event_id], event_id, True, same_payload=same_payload)
    if event_id in existing:
        row_id, sha = existing[event_id]
        return EnqueueResult(row_id, event_id, True, same_payload=sha == row.payload_sha)
    raise _invisible_conflict(event_id)
