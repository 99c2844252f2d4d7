"""Enqueue into an outbox table, in the caller's transaction."""

import os
import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import psycopg

from outbox_pipelines.core.canonical import DEFAULT_MAX_PAYLOAD_BYTES, check_structure, checked_canonical_payload
from outbox_pipelines.core.errors import InvalidMessage
from outbox_pipelines.core.metrics import count_enqueued
from outbox_pipelines.core.models import EnqueueResult, Message, check_header_values, check_printable
from outbox_pipelines.core.names import validate_table_name
from outbox_pipelines.core.table import OutboxTable

MAX_PAYLOAD_ENV = "OUTBOX_MAX_PAYLOAD_BYTES"


def driver_connection(conn: Any) -> psycopg.Connection:
    """The psycopg connection behind a SQLAlchemy Connection, or ``conn`` itself.

    Enqueue runs on the caller's connection so that it joins the caller's
    transaction: a rollback removes the message with the business write.
    """
    if isinstance(conn, psycopg.Connection):
        return conn
    dbapi = getattr(getattr(conn, "connection", None), "driver_connection", None)
    if isinstance(dbapi, psycopg.Connection):
        return dbapi
    raise TypeError(
        "enqueue needs a psycopg 3 connection or a SQLAlchemy Connection on the psycopg driver "
        f"(postgresql+psycopg://), got {type(conn).__name__}"
    )


def _max_payload_bytes() -> int:
    raw = os.environ.get(MAX_PAYLOAD_ENV)
    return int(raw) if raw else DEFAULT_MAX_PAYLOAD_BYTES


def _prepare(message: Message, max_bytes: int) -> dict[str, Any]:
    if not isinstance(message, Message):
        raise InvalidMessage(f"expected a Message, got {type(message).__name__}")
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
    if not isinstance(message.headers, dict):
        raise InvalidMessage("headers must be a JSON object")
    if message.available_at is not None and not isinstance(message.available_at, datetime):
        raise InvalidMessage("available_at must be a datetime")
    if message.available_at is not None and message.available_at.tzinfo is None:
        raise InvalidMessage("available_at must be timezone-aware (database time is UTC-based)")
    payload_text, payload_sha = checked_canonical_payload(message.payload, max_bytes)
    if message.headers:
        # Shape first (depth, string keys: bounded work), then every header text printable.
        check_structure(message.headers, "headers")
        check_header_values(message.headers)
        headers_text = checked_canonical_payload(message.headers, max_bytes, what="headers")[0]
    else:
        headers_text = "{}"
    return {
        "event_id": event_id,
        "tenant_id": message.tenant_id,
        "topic": message.topic,
        "payload": payload_text,
        "payload_sha": payload_sha,
        "headers": headers_text,
        "available_at": message.available_at,
    }


def check_message(message: Message, max_payload_bytes: int | None = None) -> None:
    """Raise InvalidMessage if ``message`` could not be enqueued; writes nothing (the CLI checks before connecting)."""
    _prepare(message, max_payload_bytes or _max_payload_bytes())


class Outbox:
    """One outbox table, as the application writing into it sees it.

    >>> outbox = Outbox("outbox_events")
    >>> with engine.begin() as conn:
    ...     conn.execute(...)  # the business write
    ...     outbox.enqueue(conn, Message(topic="org.changed", payload={...}, event_id="..."))
    """

    def __init__(self, table: str, *, max_payload_bytes: int | None = None) -> None:
        self.table = validate_table_name(table)
        self.max_payload_bytes = max_payload_bytes or _max_payload_bytes()

    def enqueue(self, conn: Any, message: Message, *, now: datetime | None = None) -> EnqueueResult:
        """Insert ``message`` in the caller's transaction; a duplicate event_id returns the stored row."""
        params = _prepare(message, self.max_payload_bytes)
        event_id = params["event_id"]
        table = OutboxTable(driver_connection(conn), self.table)
        row_id = table.insert(**params, now=now)
        if row_id is not None:
            count_enqueued(self.table, [params["topic"]])
            return EnqueueResult(id=row_id, event_id=event_id, duplicate=False)
        # Another transaction holds this event_id; read it (READ COMMITTED sees it now).
        existing = table.find_by_event_ids([event_id]).get(event_id)
        if existing is None:
            raise InvalidMessage(
                f"event_id {event_id!r} conflicts with a row this transaction cannot see "
                "(use READ COMMITTED isolation for enqueue)"
            )
        existing_id, existing_sha = existing
        return EnqueueResult(existing_id, event_id, True, same_payload=existing_sha == params["payload_sha"])

    def enqueue_many(
        self, conn: Any, messages: Iterable[Message], *, now: datetime | None = None
    ) -> list[EnqueueResult]:
        """Insert many messages in one statement; results are in input order.

        Every message is checked before anything is written: one bad message
        raises InvalidMessage and writes nothing.
        """
        prepared = [_prepare(m, self.max_payload_bytes) for m in messages]
        if not prepared:
            return []
        # An event_id repeated in this call is written once, as its first occurrence; the
        # later ones are duplicates of it, compared with its payload (not with each other).
        first_of: dict[str, dict[str, Any]] = {}
        for p in prepared:
            first_of.setdefault(p["event_id"], p)
        unique = list(first_of.values())
        columns: dict[str, list[Any]] = {
            "event_ids": [p["event_id"] for p in unique],
            "tenant_ids": [p["tenant_id"] for p in unique],
            "topics": [p["topic"] for p in unique],
            "payloads": [p["payload"] for p in unique],
            "payload_shas": [p["payload_sha"] for p in unique],
            "headers": [p["headers"] for p in unique],
            "available_ats": [p["available_at"] for p in unique],
        }
        table = OutboxTable(driver_connection(conn), self.table)
        inserted = table.insert_many(**columns, now=now)
        missing = [e for e in columns["event_ids"] if e not in inserted]
        existing = table.find_by_event_ids(missing) if missing else {}
        count_enqueued(self.table, {p["event_id"]: p["topic"] for p in unique if p["event_id"] in inserted}.values())
        results = []
        for p in prepared:
            event_id = p["event_id"]
            first = first_of[event_id]
            if event_id in inserted:
                if p is first:
                    results.append(EnqueueResult(inserted[event_id], event_id, False))
                else:  # the same event_id again in this call: a duplicate of the one just written
                    results.append(EnqueueResult(inserted[event_id], event_id, True,
                                                 same_payload=p["payload_sha"] == first["payload_sha"]))
            elif event_id in existing:
                row_id, sha = existing[event_id]
                results.append(EnqueueResult(row_id, event_id, True, same_payload=sha == p["payload_sha"]))
            else:
                raise InvalidMessage(
                    f"event_id {event_id!r} conflicts with a row this transaction cannot see "
                    "(use READ COMMITTED isolation for enqueue)"
                )
        return results
