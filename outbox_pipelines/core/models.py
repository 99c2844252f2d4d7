"""The values every part of the outbox shares."""

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from outbox_pipelines.core.errors import InvalidMessage


class MessageState(StrEnum):
    """A message's state (docs/explanation/tables-and-states.md, "Stored and shown states"): as stored in its
    table's ``status`` column (``STORED_STATES``, what the migrations' CHECK constraint allows), and ``retrying``,
    a pending message after a failed attempt, as users and the CLI see it. A member is its stored text."""

    PENDING = "pending"
    RETRYING = "retrying"
    SENDING = "sending"
    SENT = "sent"
    DEAD = "dead"


# What users and the CLI see, in this order.
STATES = tuple(MessageState)
STORED_STATES = (MessageState.PENDING, MessageState.SENDING, MessageState.SENT, MessageState.DEAD)


class CheckSeverity(StrEnum):
    """How a health check grades a table (or the schema, or the database): passes, warns, or fails."""

    OK = "ok"
    WARN = "warn"
    ERROR = "error"


class TableHealth(StrEnum):
    """A table's health by its worst check, as the Dagster UI, the on-call page and the sensor's cursor name it."""

    HEALTHY = "healthy"
    WARNING = "warning"
    FAILING = "failing"


# Each grade's rank (the worse, the higher) and the health it gives a table whose worst check it is.
SEVERITY_RANK: dict[str, int] = {CheckSeverity.OK: 0, CheckSeverity.WARN: 1, CheckSeverity.ERROR: 2}
HEALTH_OF: dict[str, TableHealth] = {
    CheckSeverity.OK: TableHealth.HEALTHY,
    CheckSeverity.WARN: TableHealth.WARNING,
    CheckSeverity.ERROR: TableHealth.FAILING,
}


class AuditCode(StrEnum):
    """What a settle writes in the audit's ``code`` for a delivery's outcome."""

    SUCCESS = "outbox_flush_success"
    RETRY = "outbox_flush_retry"
    DEAD = "outbox_flush_dead"
    DEDUP_HIT = "outbox_flush_dedup_hit"
    DB_TIMEOUT = "outbox_flush_db_timeout"
    DB_ERROR = "outbox_flush_db_error"
    # Written by the settle statement itself when a lease was lost (sql/queries/outbox.sql).
    CONFLICT = "outbox_flush_conflict"


AUDIT_SUCCESS = AuditCode.SUCCESS
AUDIT_RETRY = AuditCode.RETRY
AUDIT_DEAD = AuditCode.DEAD
AUDIT_DEDUP_HIT = AuditCode.DEDUP_HIT
AUDIT_DB_TIMEOUT = AuditCode.DB_TIMEOUT
AUDIT_DB_ERROR = AuditCode.DB_ERROR


class ErrorCode(StrEnum):
    """An outcome's code, stored in ``last_error_code`` and the audit (docs/explanation/outcomes.md, "Outcomes
    and error codes")."""

    CONFLICT_PROCESSED = "CONFLICT_PROCESSED"
    RATE_LIMITED = "RATE_LIMITED"
    BROKER_5XX = "BROKER_5XX"
    # No answer (or no connection) within the timeout.
    NETWORK_TIMEOUT = "NETWORK_TIMEOUT"
    # Why a destination could not be reached, told apart where the client tells them apart
    # (core/destinations/network_failures.py): nothing listens, the name does not resolve, TLS failed, the
    # connection was reset or closed before the answer.
    CONNECTION_REFUSED = "CONNECTION_REFUSED"
    DNS_ERROR = "DNS_ERROR"
    TLS_ERROR = "TLS_ERROR"
    CONNECTION_LOST = "CONNECTION_LOST"
    BAD_REQUEST = "BAD_REQUEST"
    UNAUTHORIZED = "UNAUTHORIZED"
    UNKNOWN = "UNKNOWN"
    NO_SUBSCRIBERS = "NO_SUBSCRIBERS"
    HANDLER_ERROR = "HANDLER_ERROR"
    # An async handler still running at its table's timeout (cancelled; the message retries).
    HANDLER_TIMEOUT = "HANDLER_TIMEOUT"
    # Claimed past the table's max_attempts (it was lowered while the row waited): dead, not delivered again.
    MAX_ATTEMPTS = "MAX_ATTEMPTS"
    DEDUP_HIT = "DEDUP_HIT"
    # Written by the SQL that takes back a lapsed lease past max_attempts (sql/queries/outbox.sql).
    LEASE_EXPIRED = "LEASE_EXPIRED"
    # A settle the database refused (core/relay/settlement.py); PermanentError's default (core/errors.py).
    DB_ERROR = "DB_ERROR"
    PERMANENT = "PERMANENT"


# The codes by their names, as the modules that compare them import them.
CONFLICT_PROCESSED = ErrorCode.CONFLICT_PROCESSED
RATE_LIMITED = ErrorCode.RATE_LIMITED
BROKER_5XX = ErrorCode.BROKER_5XX
NETWORK_TIMEOUT = ErrorCode.NETWORK_TIMEOUT
CONNECTION_REFUSED = ErrorCode.CONNECTION_REFUSED
DNS_ERROR = ErrorCode.DNS_ERROR
TLS_ERROR = ErrorCode.TLS_ERROR
CONNECTION_LOST = ErrorCode.CONNECTION_LOST
NETWORK_FAILURES = frozenset({NETWORK_TIMEOUT, CONNECTION_REFUSED, DNS_ERROR, TLS_ERROR, CONNECTION_LOST})
BAD_REQUEST = ErrorCode.BAD_REQUEST
# What replay refuses unless forced (--force / force: true): the destination refused the message itself, so
# the same message would be refused again (sql/queries/outbox.sql outbox_replay_dead says it in SQL).
REPLAY_NEEDS_FORCE = (BAD_REQUEST,)
UNAUTHORIZED = ErrorCode.UNAUTHORIZED
UNKNOWN = ErrorCode.UNKNOWN
NO_SUBSCRIBERS = ErrorCode.NO_SUBSCRIBERS
HANDLER_ERROR = ErrorCode.HANDLER_ERROR
HANDLER_TIMEOUT = ErrorCode.HANDLER_TIMEOUT
MAX_ATTEMPTS = ErrorCode.MAX_ATTEMPTS
DEDUP_HIT = ErrorCode.DEDUP_HIT

ERROR_TEXT_LIMIT = 2000
# The longest event_id and ordering_key a message may carry, in characters: the one place these limits are
# written (core/prepare.py checks them on every enqueue path; a test holds that no other module writes 255).
MAX_EVENT_ID_CHARS = 255
MAX_ORDERING_KEY_CHARS = 255
# The longest topic and tenant id: a topic becomes a metrics label and a broker's topic or subject, a tenant a
# filter an operator types.
MAX_TOPIC_CHARS = 255
MAX_TENANT_ID_CHARS = 255
# The longest message id and consumer name an inbox records (core/inbox/receive.py: Inbox.receive).
MAX_INBOX_MESSAGE_ID_CHARS = 255
MAX_INBOX_CONSUMER_CHARS = 255


# Control characters (Unicode category Cc: U+0000-U+001F, U+007F-U+009F) and lone
# surrogates (text that is not valid Unicode). None belongs in an identifier or a header:
# CR/LF would split an HTTP header, and an HTTP client refuses to send them.
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def unprintable_problem(value: str) -> str | None:
    """What is wrong with ``value`` as an identifier or header text, or None if nothing is."""
    match = _UNPRINTABLE.search(value)
    if match is None:
        return None
    code = ord(match.group())
    kind = "a lone surrogate" if 0xD800 <= code <= 0xDFFF else "a control character"
    return f"{kind} (U+{code:04X}) at position {match.start()}"


def check_printable(field_name: str, value: str) -> str:
    """``value``, or InvalidMessage naming ``field_name`` if it holds a control character or lone surrogate."""
    problem = unprintable_problem(value)
    if problem is not None:
        raise InvalidMessage(
            f"{field_name} contains {problem}: identifiers and header values must be printable text "
            "(no CR/LF, tabs or other control characters); nothing was enqueued"
        )
    return value


def check_header_values(headers: dict[str, Any]) -> None:
    """Every header key and every string inside a header value printable (CR/LF would split an HTTP header)."""
    stack: list[tuple[str, Any]] = [(f"header {key!r}", value) for key, value in headers.items()]
    for key in headers:
        if isinstance(key, str):
            check_printable(f"header name {key!r}", key)
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            check_printable(where, value)
        elif isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str):
                    check_printable(f"{where} key {key!r}", key)
                stack.append((f"{where}.{key}", item))
        elif isinstance(value, (list, tuple)):
            stack.extend((f"{where}[{index}]", item) for index, item in enumerate(value))


def storable_text(text: str | None) -> str | None:
    """PostgreSQL text cannot hold NUL; a message's error must still be recorded."""
    return text.replace("\x00", "\\u0000") if text is not None and "\x00" in text else text


def cap_error(text: str | None) -> str | None:
    """Error text as stored: NUL escaped, at most 2000 characters."""
    text = storable_text(text)
    if text is None:
        return None
    return text if len(text) <= ERROR_TEXT_LIMIT else text[: ERROR_TEXT_LIMIT - 1] + "…"


@dataclass(frozen=True, init=False)
class Message:
    """A message to enqueue. ``payload`` is a JSON object (dict, or JSON text); ``headers`` None means none.

    ``ordering_key``: messages of one table with the same key are delivered one at a time, in the order
    they were enqueued (the aggregate they are about: an order, an org); None, the default, means no order.
    """

    topic: str
    payload: Any
    event_id: str | None = None
    tenant_id: str | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    available_at: datetime | None = None
    ordering_key: str | None = None

    def __init__(
        self,
        topic: str,
        payload: Any,
        event_id: str | None = None,
        tenant_id: str | None = None,
        headers: dict[str, Any] | None = None,
        available_at: datetime | None = None,
        ordering_key: str | None = None,
    ) -> None:
        # A frozen dataclass's own __init__ sets each field through object.__setattr__: 1 µs a
        # message, a twentieth of a batch enqueue's time. Enqueue checks the values, not this.
        self.__dict__.update(
            topic=topic,
            payload=payload,
            event_id=event_id,
            tenant_id=tenant_id,
            headers={} if headers is None else headers,
            available_at=available_at,
            ordering_key=ordering_key,
        )


@dataclass(frozen=True)
class EnqueueResult:
    id: int
    event_id: str
    duplicate: bool
    # False when a duplicate event_id carried a different payload than the stored row.
    same_payload: bool = True

    @classmethod
    def new(cls, row_id: int, event_id: str) -> "EnqueueResult":
        """A message written now (not a duplicate), at a fifth of the generated __init__'s cost: the
        instance's dict given whole (a literal), where an update would build a second one for its keywords."""
        result = object.__new__(cls)
        object.__setattr__(
            result, "__dict__", {"id": row_id, "event_id": event_id, "duplicate": False, "same_payload": True}
        )
        return result


@dataclass(frozen=True)
class ClaimedMessage:
    id: int
    event_id: str
    tenant_id: str | None
    topic: str
    payload: Any
    payload_sha: str
    headers: dict[str, Any]
    attempts: int
    created_at: datetime
    # The database's clock when this attempt was claimed (None where a row was read, not claimed).
    claimed_at: datetime | None = None
    # The message's ordering key (None: unordered); a destination may pass it on (a partition key, a header).
    ordering_key: str | None = None

    @property
    def trace_id(self) -> str | None:
        value = self.headers.get("trace_id") if isinstance(self.headers, dict) else None
        return str(value) if value is not None else None

    @classmethod
    def from_row(cls, values: Sequence[Any]) -> "ClaimedMessage":
        """A message from a claim's row (every field, in field order). A frozen dataclass's __init__ sets
        each field through object.__setattr__: 2 µs a message, as long as the settle statement takes
        per row; filling the instance's dict by key costs a seventh of that (measured: 0.29 µs, against
        0.84 µs for an update from zip). A row of the wrong length raises ValueError."""
        message = object.__new__(cls)
        d = message.__dict__
        (
            d["id"],
            d["event_id"],
            d["tenant_id"],
            d["topic"],
            d["payload"],
            d["payload_sha"],
            d["headers"],
            d["attempts"],
            d["created_at"],
            d["claimed_at"],
            d["ordering_key"],
        ) = values
        return message


class OutcomeKind(StrEnum):
    """What a destination made of one delivery: delivered, to try again, or never to be delivered."""

    SENT = "sent"
    RETRY = "retry"
    DEAD = "dead"


@dataclass(frozen=True)
class Outcome:
    """What a destination made of one delivery."""

    kind: OutcomeKind
    code: str | None = None
    error: str | None = None
    ref: str | None = None
    # Retry not before this many seconds from now (Retry-After); None = backoff.
    delay_s: float | None = None

    @classmethod
    def sent(cls, ref: str | None = None, code: str | None = None) -> "Outcome":
        return cls(OutcomeKind.SENT, code=code, ref=ref)

    @classmethod
    def retry(cls, code: str, error: str | None = None, delay_s: float | None = None) -> "Outcome":
        return cls(OutcomeKind.RETRY, code=code, error=cap_error(error), delay_s=delay_s)

    @classmethod
    def dead(cls, code: str, error: str | None = None) -> "Outcome":
        return cls(OutcomeKind.DEAD, code=code, error=cap_error(error))
