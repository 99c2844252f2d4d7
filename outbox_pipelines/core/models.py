"""The values every part of the outbox shares."""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

# What users and the CLI see (DESIGN.md §3.2).
STATES = ("pending", "retrying", "sending", "sent", "dead")

AUDIT_SUCCESS = "outbox_flush_success"
AUDIT_RETRY = "outbox_flush_retry"
AUDIT_DEAD = "outbox_flush_dead"
AUDIT_CONFLICT = "outbox_flush_conflict"
AUDIT_DEDUP_HIT = "outbox_flush_dedup_hit"
AUDIT_DB_TIMEOUT = "outbox_flush_db_timeout"
AUDIT_DB_ERROR = "outbox_flush_db_error"

# Error codes (DESIGN.md §3.4).
CONFLICT_PROCESSED = "CONFLICT_PROCESSED"
RATE_LIMITED = "RATE_LIMITED"
BROKER_5XX = "BROKER_5XX"
NETWORK_TIMEOUT = "NETWORK_TIMEOUT"
BAD_REQUEST = "BAD_REQUEST"
UNAUTHORIZED = "UNAUTHORIZED"
UNKNOWN = "UNKNOWN"
NO_SUBSCRIBERS = "NO_SUBSCRIBERS"
HANDLER_ERROR = "HANDLER_ERROR"
MAX_ATTEMPTS = "MAX_ATTEMPTS"
DEDUP_HIT = "DEDUP_HIT"

ERROR_TEXT_LIMIT = 2000


def storable_text(text: str | None) -> str | None:
    """PostgreSQL text cannot hold NUL; a message's error must still be recorded."""
    return text.replace("\x00", "\\u0000") if text is not None and "\x00" in text else text


def cap_error(text: str | None) -> str | None:
    """Error text as stored: NUL escaped, at most 2000 characters."""
    text = storable_text(text)
    if text is None:
        return None
    return text if len(text) <= ERROR_TEXT_LIMIT else text[: ERROR_TEXT_LIMIT - 1] + "…"


@dataclass(frozen=True)
class Message:
    """A message to enqueue. ``payload`` is a JSON object (dict, or JSON text)."""

    topic: str
    payload: Any
    event_id: str | None = None
    tenant_id: str | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    available_at: datetime | None = None


@dataclass(frozen=True)
class EnqueueResult:
    id: int
    event_id: str
    duplicate: bool
    # False when a duplicate event_id carried a different payload than the stored row.
    same_payload: bool = True


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

    @property
    def trace_id(self) -> str | None:
        value = self.headers.get("trace_id") if isinstance(self.headers, dict) else None
        return str(value) if value is not None else None


OutcomeKind = Literal["sent", "retry", "dead"]


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
        return cls("sent", code=code, ref=ref)

    @classmethod
    def retry(cls, code: str, error: str | None = None, delay_s: float | None = None) -> "Outcome":
        return cls("retry", code=code, error=cap_error(error), delay_s=delay_s)

    @classmethod
    def dead(cls, code: str, error: str | None = None) -> "Outcome":
        return cls("dead", code=code, error=cap_error(error))
