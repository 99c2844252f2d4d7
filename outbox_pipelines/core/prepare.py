"""A message checked and made into the row an enqueue inserts (``NewRow``): one preparation for every path,
sync and asyncio, one message or a batch. Pure: nothing here touches a connection."""

import os
import uuid
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from outbox_pipelines.core.canonical import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    checked_canonical_payload,
    digest_bytes,
    plain_canonical_bytes,
)
from outbox_pipelines.core.errors import InvalidMessage
from outbox_pipelines.core.models import (
    MAX_EVENT_ID_CHARS,
    MAX_ORDERING_KEY_CHARS,
    MAX_TENANT_ID_CHARS,
    MAX_TOPIC_CHARS,
    Message,
    check_header_values,
    check_printable,
    unprintable_problem,
)
from outbox_pipelines.core.settings.environment import env_int
from outbox_pipelines.core.storage.table_enqueue import NewRow
from outbox_pipelines.core.telemetry.creation import Creation

MAX_PAYLOAD_ENV = "OUTBOX_MAX_PAYLOAD_BYTES"


def payload_limit() -> int:
    """OUTBOX_MAX_PAYLOAD_BYTES, or ConfigError naming it when it is not a whole number of bytes."""
    return env_int(os.environ, MAX_PAYLOAD_ENV, DEFAULT_MAX_PAYLOAD_BYTES)


def _check_identifiers(message: Message, new_event_id: str | None = None) -> str:
    """The message's event_id (``new_event_id`` or a new UUID when it has none), once topic, event_id and
    tenant are valid."""
    if not isinstance(message.topic, str) or not message.topic.strip():
        raise InvalidMessage("message topic must be a non-empty string")
    if len(message.topic) > MAX_TOPIC_CHARS:
        raise InvalidMessage(f"message topic must be at most {MAX_TOPIC_CHARS} characters (got {len(message.topic)})")
    check_printable("topic", message.topic)
    event_id = message.event_id if message.event_id is not None else new_event_id or str(uuid.uuid4())
    if not isinstance(event_id, str) or not event_id or len(event_id) > MAX_EVENT_ID_CHARS:
        raise InvalidMessage(f"event_id must be a non-empty string of at most {MAX_EVENT_ID_CHARS} characters")
    check_printable("event_id", event_id)
    if message.tenant_id is not None:
        if not isinstance(message.tenant_id, str):
            raise InvalidMessage(f"tenant_id must be a string, got {type(message.tenant_id).__name__}")
        if len(message.tenant_id) > MAX_TENANT_ID_CHARS:
            raise InvalidMessage(
                f"tenant_id must be at most {MAX_TENANT_ID_CHARS} characters (got {len(message.tenant_id)})"
            )
        check_printable("tenant_id", message.tenant_id)
    _check_ordering_key(message.ordering_key)
    return event_id


def _check_ordering_key(key: Any) -> None:
    if key is None:
        return
    if not isinstance(key, str) or not key or len(key) > MAX_ORDERING_KEY_CHARS:
        raise InvalidMessage(
            f"ordering_key must be a non-empty string of at most {MAX_ORDERING_KEY_CHARS} characters "
            "(or None: no order)"
        )
    check_printable("ordering_key", key)


def _check_available_at(message: Message) -> None:
    if message.available_at is not None and not isinstance(message.available_at, datetime):
        raise InvalidMessage("available_at must be a datetime")
    if message.available_at is not None and message.available_at.tzinfo is None:
        raise InvalidMessage("available_at must be timezone-aware (database time is UTC-based)")


def _plain_headers_text(headers: dict[str, Any], max_bytes: int) -> str | None:
    """The headers' canonical JSON when they plainly pass every check (printable, within the limit);
    None when ``_headers_text`` must look closer."""
    if not headers:
        return "{}"
    data = plain_canonical_bytes(headers)
    if data is None or b"\\" in data or len(data) > max_bytes:
        return None
    # JSON escapes every control character below U+0020 with a backslash; DEL is the only other one
    # in ASCII, and the pattern finds the rest (C1 controls).
    text = data.decode("utf-8")
    printable = b"\x7f" not in data if data.isascii() else unprintable_problem(text) is None
    return text if printable else None


def _headers_text(headers: dict[str, Any], max_bytes: int) -> str:
    text = _plain_headers_text(headers, max_bytes)
    if text is not None:
        return text
    # Something may be wrong: the header-by-header walk names a header holding a control character
    # or a lone surrogate, then the full checks name anything else.
    check_header_values(headers)
    return checked_canonical_payload(headers, max_bytes, what="headers")[0]


def _prepare(
    message: Message, max_bytes: int, new_event_id: str | None = None, created: Creation | None = None
) -> NewRow:
    """The row to insert for ``message``, or InvalidMessage saying what is wrong; ``created``: the call's
    creation contexts (core/telemetry/creation.py), None when there is no trace to follow."""
    if not isinstance(message, Message):
        raise InvalidMessage(f"expected a Message, got {type(message).__name__}")
    event_id = _check_identifiers(message, new_event_id)
    if not isinstance(message.headers, dict):
        raise InvalidMessage("headers must be a JSON object")
    _check_available_at(message)
    payload_text, payload_sha = checked_canonical_payload(message.payload, max_bytes)
    headers = message.headers
    if created is not None:
        headers = created.headers(headers, message.topic, event_id, message.ordering_key)
    return NewRow(
        event_id,
        message.tenant_id,
        message.topic,
        payload_text,
        payload_sha,
        _headers_text(headers, max_bytes),
        message.available_at,
        message.ordering_key,
    )


def _plain_identifiers(values: Iterable[Any], max_length: int | None = None) -> bool:
    """Every value a non-empty string (of at most ``max_length`` characters), all printable: one pattern
    search over them all."""
    values = list(values)
    return (
        all(type(value) is str for value in values)
        and min(map(len, values), default=1) > 0
        and (max_length is None or max(map(len, values), default=0) <= max_length)
        and unprintable_problem("".join(values)) is None
    )


def _plain_event_ids(messages: list[Any]) -> list[str] | None:
    """The batch's event ids (new UUIDs where none is given) when every message is a Message due now
    whose identifiers plainly pass ``_prepare``'s checks; None at the first doubt.

    Message by message, those checks cost as much as the COPY that writes a batch: here they are
    made a column at a time, topics and tenants once each.
    """
    if not all(type(message) is Message and message.available_at is None for message in messages):
        return None
    event_ids = [message.event_id if message.event_id is not None else str(uuid.uuid4()) for message in messages]
    try:
        topics = {message.topic for message in messages}
        tenants = {message.tenant_id for message in messages if message.tenant_id is not None}
        keys = {message.ordering_key for message in messages if message.ordering_key is not None}
    except TypeError:  # an unhashable topic, tenant or key
        return None
    if (
        _plain_identifiers(event_ids, MAX_EVENT_ID_CHARS)
        and _plain_identifiers(topics, MAX_TOPIC_CHARS)
        and all(topic.strip() for topic in topics)
        and _plain_identifiers(tenants, MAX_TENANT_ID_CHARS)
        and _plain_identifiers(keys, MAX_ORDERING_KEY_CHARS)
    ):
        return event_ids
    return None


def _prepare_checked(message: Message, event_id: str, max_bytes: int, created: Creation | None = None) -> NewRow:
    """``_prepare`` for a message whose identifiers ``_plain_event_ids`` passed: payload and headers in
    one orjson call each when they plainly pass, or ``_prepare``'s full checks (and its error)."""
    headers, payload = message.headers, message.payload
    if type(headers) is dict and type(payload) is dict:
        if created is not None:
            headers = created.headers(headers, message.topic, event_id, message.ordering_key)
        headers_text = _plain_headers_text(headers, max_bytes)
        data = plain_canonical_bytes(payload)
        if data is not None and headers_text is not None and len(data) <= max_bytes:
            return NewRow(
                event_id,
                message.tenant_id,
                message.topic,
                data.decode("utf-8"),
                digest_bytes(data),
                headers_text,
                None,
                message.ordering_key,
            )
    return _prepare(message, max_bytes, event_id, created)


def _prepare_one(message: Any, max_bytes: int, created: Creation | None = None) -> NewRow:
    """``_prepare`` for the one-row enqueue: a Message due now whose identifiers are printable strings
    of the right lengths is checked in one test of their joined text and goes on to
    ``_prepare_checked``; any other message, and any doubt, gets ``_prepare``'s full checks and error.

    It runs in the application's transaction, after a round trip to the server, where each step of
    the walk costs several times what it costs in a loop: the full walk took 45 µs there against 26 µs
    for json.dumps and sha256 of the same message (bench/results.md)."""
    if type(message) is Message and message.available_at is None:
        topic, tenant_id, key = message.topic, message.tenant_id, message.ordering_key
        event_id = message.event_id if message.event_id is not None else str(uuid.uuid4())
        if (
            type(topic) is str
            and type(event_id) is str
            and (tenant_id is None or (type(tenant_id) is str and len(tenant_id) <= MAX_TENANT_ID_CHARS))
            and len(topic) <= MAX_TOPIC_CHARS
            and (key is None or (type(key) is str and 0 < len(key) <= MAX_ORDERING_KEY_CHARS))
            and 0 < len(event_id) <= MAX_EVENT_ID_CHARS
            and topic.strip()
            # isprintable() refuses every character check_printable refuses, and more (spaces other
            # than " "): what it refuses takes the full checks, which decide.
            and f"{topic}{event_id}{tenant_id or ''}{key or ''}".isprintable()
        ):
            return _prepare_checked(message, event_id, max_bytes, created)
    return _prepare(message, max_bytes, None, created)


def _prepared_rows(
    messages: list[Any], max_bytes: int, event_ids: list[str] | None, created: Creation | None = None
) -> Iterator[NewRow]:
    """Every message's row, in order, or InvalidMessage saying which message of the batch is bad, in the words
    ``enqueue`` would use for it alone. ``event_ids``: what ``_plain_event_ids`` found for the batch."""
    for index, message in enumerate(messages):
        try:
            if event_ids is None:
                yield _prepare(message, max_bytes, None, created)
            else:
                yield _prepare_checked(message, event_ids[index], max_bytes, created)
        except InvalidMessage as exc:
            event_id = getattr(message, "event_id", None)
            which = f"message at index {index} of the batch" + (
                f" (event_id {event_id[:80]!r})" if isinstance(event_id, str) else ""
            )
            raise InvalidMessage(f"{which}: {exc}") from None


def check_message(message: Message, max_payload_bytes: int | None = None) -> None:
    """Raise InvalidMessage if ``message`` could not be enqueued; writes nothing (the CLI checks before connecting)."""
    _prepare(message, max_payload_bytes or payload_limit())


class BatchPlan:
    """A batch's prepared rows (InvalidMessage for a bad one, before anything is written), and the rows to
    insert: an event_id repeated in the batch is written once, as its first occurrence; the later ones are
    duplicates of it, compared with its payload (not with each other)."""

    def __init__(
        self, batch: list[Any], max_bytes: int, event_ids: list[str] | None, created: Creation | None = None
    ) -> None:
        self.prepared = list(_prepared_rows(batch, max_bytes, event_ids, created))
        self.first_of: dict[str, NewRow] = {}
        for row in self.prepared:
            self.first_of.setdefault(row.event_id, row)
        self.unique = list(self.first_of.values()) if len(self.first_of) < len(self.prepared) else self.prepared

    def missing(self, inserted: dict[str, int]) -> list[str]:
        """The event ids the insert did not write: stored already, by this transaction or another."""
        return [event_id for event_id in self.first_of if event_id not in inserted]
