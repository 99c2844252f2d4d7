"""Enqueue into an outbox table, in the caller's transaction."""

import os
import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from outbox_pipelines.core.canonical import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    canonical_json,
    check_structure,
    checked_canonical_payload,
)
from outbox_pipelines.core.db import driver_connection
from outbox_pipelines.core.errors import InvalidMessage
from outbox_pipelines.core.metrics import count_enqueued
from outbox_pipelines.core.models import (
    EnqueueResult,
    Message,
    check_header_values,
    check_printable,
    unprintable_problem,
)
from outbox_pipelines.core.names import validate_table_name
from outbox_pipelines.core.table import OutboxTable

MAX_PAYLOAD_ENV = "OUTBOX_MAX_PAYLOAD_BYTES"
# From this many new rows on, enqueue_many writes with COPY; below, one INSERT ... SELECT FROM
# unnest is faster (COPY costs three more round trips). Measured: bench/results.md, "enqueue_many".
COPY_MIN_ROWS = 20


def _max_payload_bytes() -> int:
    raw = os.environ.get(MAX_PAYLOAD_ENV)
    return int(raw) if raw else DEFAULT_MAX_PAYLOAD_BYTES


def _check_identifiers(message: Message) -> str:
    """The message's event_id (a new UUID when it has none), once topic, event_id and tenant are valid."""
    if not isinstance(message.topic, str) or not message.topic.strip():
        raise InvalidMessage("message topic must be a non-empty string")
    check_printable("topic", message.topic)
    event_id = message.event_id if message.event_id is not None else str(uuid.uuid4())
    if not isinstance(event_id, str) or not event_id or len(event_id) > 255:
        raise InvalidMessage("event_id must be a non-empty string of at most 255 characters")
    check_printable("event_id", event_id)
    if message.tenant_id is not None:
        if not isinstance(message.tenant_id, str):
            raise InvalidMessage(f"tenant_id must be a string, got {type(message.tenant_id).__name__}")
        check_printable("tenant_id", message.tenant_id)
    return event_id


def _check_available_at(message: Message) -> None:
    if message.available_at is not None and not isinstance(message.available_at, datetime):
        raise InvalidMessage("available_at must be a datetime")
    if message.available_at is not None and message.available_at.tzinfo is None:
        raise InvalidMessage("available_at must be timezone-aware (database time is UTC-based)")


def _headers_text(headers: dict[str, Any], max_bytes: int) -> str:
    if not headers:
        return "{}"
    check_structure(headers, "headers")
    text = canonical_json(headers)
    # JSON escapes every control character with a backslash, and the pattern finds the rest
    # (DEL, C1 controls, lone surrogates); text with neither is printable throughout, so the
    # header-by-header walk that names the culprit runs only when something may be wrong.
    if "\\" not in text and unprintable_problem(text) is None and len(text.encode("utf-8")) <= max_bytes:
        return text
    check_header_values(headers)
    return checked_canonical_payload(headers, max_bytes, what="headers")[0]


def _prepare(message: Message, max_bytes: int) -> dict[str, Any]:
    """The row to insert for ``message`` (its columns by name), or InvalidMessage saying what is wrong."""
    if not isinstance(message, Message):
        raise InvalidMessage(f"expected a Message, got {type(message).__name__}")
    event_id = _check_identifiers(message)
    if not isinstance(message.headers, dict):
        raise InvalidMessage("headers must be a JSON object")
    _check_available_at(message)
    payload_text, payload_sha = checked_canonical_payload(message.payload, max_bytes)
    return {
        "event_id": event_id,
        "tenant_id": message.tenant_id,
        "topic": message.topic,
        "payload": payload_text,
        "payload_sha": payload_sha,
        "headers": _headers_text(message.headers, max_bytes),
        "available_at": message.available_at,
    }


def check_message(message: Message, max_payload_bytes: int | None = None) -> None:
    """Raise InvalidMessage if ``message`` could not be enqueued; writes nothing (the CLI checks before connecting)."""
    _prepare(message, max_payload_bytes or _max_payload_bytes())


def _invisible_conflict(event_id: str) -> InvalidMessage:
    return InvalidMessage(
        f"event_id {event_id!r} conflicts with a row this transaction cannot see "
        "(use READ COMMITTED isolation for enqueue)"
    )


def _columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """The prepared rows as the parallel lists ``OutboxTable.insert_many`` takes."""
    return {
        "event_ids": [row["event_id"] for row in rows],
        "tenant_ids": [row["tenant_id"] for row in rows],
        "topics": [row["topic"] for row in rows],
        "payloads": [row["payload"] for row in rows],
        "payload_shas": [row["payload_sha"] for row in rows],
        "headers": [row["headers"] for row in rows],
        "available_ats": [row["available_at"] for row in rows],
    }


class Outbox:
    """One outbox table, as the application writing into it sees it.

    >>> outbox = Outbox("outbox_events")
    >>> with engine.begin() as conn:
    ...     conn.execute(...)  # the business write
    ...     outbox.enqueue(conn, Message(topic="org.changed", payload={...}, event_id="..."))
    """

    def __init__(self, table_name: str, *, max_payload_bytes: int | None = None) -> None:
        # Checked here, not at the first enqueue: a bad name is the application's bug, found at start-up.
        self.table_name = validate_table_name(table_name)
        self.max_payload_bytes = max_payload_bytes or _max_payload_bytes()

    def enqueue(self, conn: Any, message: Message, *, now: datetime | None = None) -> EnqueueResult:
        """Insert ``message`` in the caller's transaction; a duplicate event_id returns the stored row."""
        row = _prepare(message, self.max_payload_bytes)
        event_id = row["event_id"]
        outbox_table = OutboxTable(driver_connection(conn), self.table_name)
        row_id = outbox_table.insert(**row, now=now)
        if row_id is not None:
            count_enqueued(self.table_name, [row["topic"]])
            return EnqueueResult(id=row_id, event_id=event_id, duplicate=False)
        # Another transaction holds this event_id; read it (READ COMMITTED sees it now).
        existing = outbox_table.find_by_event_ids([event_id]).get(event_id)
        if existing is None:
            raise _invisible_conflict(event_id)
        existing_id, existing_sha = existing
        return EnqueueResult(existing_id, event_id, True, same_payload=existing_sha == row["payload_sha"])

    def enqueue_many(
        self, conn: Any, messages: Iterable[Message], *, now: datetime | None = None
    ) -> list[EnqueueResult]:
        """Insert many messages in one statement; results are in input order.

        Every message is checked before anything is written: one bad message
        raises InvalidMessage and writes nothing.
        """
        prepared = [_prepare(message, self.max_payload_bytes) for message in messages]
        if not prepared:
            return []
        # An event_id repeated in this call is written once, as its first occurrence; the
        # later ones are duplicates of it, compared with its payload (not with each other).
        first_of: dict[str, dict[str, Any]] = {}
        for row in prepared:
            first_of.setdefault(row["event_id"], row)
        unique = list(first_of.values())
        outbox_table = OutboxTable(driver_connection(conn), self.table_name)
        inserted = _copy_if_worth_it(outbox_table, unique, now)
        if inserted is None:
            inserted = outbox_table.insert_many(**_columns(unique), now=now)
        missing = [event_id for event_id in first_of if event_id not in inserted]
        existing = outbox_table.find_by_event_ids(missing) if missing else {}
        count_enqueued(self.table_name, [row["topic"] for row in unique if row["event_id"] in inserted])
        return [_result(row, first_of[row["event_id"]], inserted, existing) for row in prepared]


def _copy_if_worth_it(outbox_table: OutboxTable, rows: list[dict[str, Any]],
                      now: datetime | None) -> dict[str, int] | None:
    """The ids of ``rows`` written with COPY, or None when COPY does not fit: a small batch, a delayed
    message or a moved clock (COPY takes the server's now() for available_at), or an event_id already
    stored (then nothing was written, and the INSERT that skips duplicates runs instead)."""
    if len(rows) < COPY_MIN_ROWS or now is not None or any(row["available_at"] is not None for row in rows):
        return None
    columns = _columns(rows)
    del columns["available_ats"]
    return outbox_table.copy_new(**columns)


def _result(row: dict[str, Any], first: dict[str, Any], inserted: dict[str, int],
            existing: dict[str, tuple[int, str]]) -> EnqueueResult:
    """What ``enqueue_many`` reports for one prepared row; ``first`` is the row of its event_id written first."""
    event_id = row["event_id"]
    if event_id in inserted:
        if row is first:
            return EnqueueResult(inserted[event_id], event_id, False)
        # The same event_id again in this call: a duplicate of the one just written.
        same_payload = row["payload_sha"] == first["payload_sha"]
        return EnqueueResult(inserted[event_id], event_id, True, same_payload=same_payload)
    if event_id in existing:
        row_id, sha = existing[event_id]
        return EnqueueResult(row_id, event_id, True, same_payload=sha == row["payload_sha"])
    raise _invisible_conflict(event_id)
