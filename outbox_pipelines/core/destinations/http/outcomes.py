"""The mapping of HTTP answers to outcomes (docs/explanation/outcomes.md, "Outcomes and error codes"). Pure functions.

``ROWS`` is the table: each answer ``classify_response`` tells apart, and the outcome and code it makes (an
attempt that got no answer is ``http/failures.py``'s). docs/reference/outcomes.md shows it, rendered by
``outcome_tables``.
"""

import email.utils
import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from datetime import UTC

from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations.outcome_rows import OutcomeRow
from outbox_pipelines.core.models import Outcome, OutcomeKind
from outbox_pipelines.core.settings.already_processed import (
    DEFAULT_ALREADY_PROCESSED,
    STRICT_ALREADY_PROCESSED,
    AlreadyProcessed,
    body_text,
)

REF_KEYS = ("broker_order_id", "memory_id", "order_id", "id")


def _one_of(words: Sequence[str]) -> str:
    quoted = [f"`{word}`" for word in words]
    return " or ".join(quoted) if len(quoted) < 3 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def _evidence(rules: Sequence[str]) -> str:
    """The docs' words for the default "already processed" rules."""
    fields = _one_of([rule for rule in rules if "=" in rule])
    phrases = _one_of([rule for rule in rules if "=" not in rule])
    return f"a JSON field as in {fields}, or a plain-text body that is just {phrases}"


# The table, in the docs' order. Each branch of classify_response answers with one of these rows.
SENT = OutcomeRow(
    "2xx",
    OutcomeKind.SENT,
    then=" (reference from the body's "
    + " / ".join(f"`{key}`" for key in REF_KEYS)
    + ", else the body's sha256 digest)",
)
NOT_THE_JSON_IT_DECLARES = OutcomeRow(
    "2xx declaring JSON with a body that is not JSON", OutcomeKind.RETRY, m.UNKNOWN, " (circuit)"
)
ALREADY_PROCESSED = OutcomeRow(
    '409 whose body says "already processed" explicitly: '
    + _evidence(DEFAULT_ALREADY_PROCESSED)
    + " (a table's `already_processed` names its destination's own evidence instead)",
    OutcomeKind.SENT,
    m.CONFLICT_PROCESSED,
)
CONFLICT = OutcomeRow(
    '409 otherwise (a duplicate rejection, "duplicate rejected: different order", anything unclear)',
    OutcomeKind.DEAD,
    m.BAD_REQUEST,
    " at once",
)
REQUEST_TIMEOUT = OutcomeRow("408", OutcomeKind.RETRY, m.NETWORK_TIMEOUT, " (circuit)")
TOO_MANY_REQUESTS = OutcomeRow(
    "429",
    OutcomeKind.RETRY,
    m.RATE_LIMITED,
    " not before `Retry-After` (seconds or HTTP date, "
    "capped by `max_retry_after`), no attempt spent; every relay of the table pauses",
)
SERVER_ERROR = OutcomeRow(
    "5xx", OutcomeKind.RETRY, m.BROKER_5XX, " (circuit); with `Retry-After` not before it, no attempt spent"
)
UNAUTHORIZED = OutcomeRow("401, 403", OutcomeKind.DEAD, m.UNAUTHORIZED, " at once (circuit)")
CLIENT_ERROR = OutcomeRow(
    "any other 4xx (400, 404, 405, 410, 413, 422 …)",
    OutcomeKind.DEAD,
    m.BAD_REQUEST,
    " at once (a poison pill never blocks the rest)",
)
UNEXPECTED_STATUS = OutcomeRow(
    "an unexpected status (1xx, 3xx: redirects are not followed, so the credential goes nowhere else; > 599)",
    OutcomeKind.RETRY,
    m.UNKNOWN,
    " (circuit), bounded by max attempts",
)
ROWS = (
    SENT,
    NOT_THE_JSON_IT_DECLARES,
    ALREADY_PROCESSED,
    CONFLICT,
    REQUEST_TIMEOUT,
    TOO_MANY_REQUESTS,
    SERVER_ERROR,
    UNAUTHORIZED,
    CLIENT_ERROR,
    UNEXPECTED_STATUS,
)


def _http_date_epoch(value: str) -> float:
    """Epoch seconds of an HTTP date. HTTP dates are UTC (RFC 9110 §5.6.7): the asctime
    form and a ``-0000`` zone parse as naive datetimes, which must not be read as local time."""
    when = email.utils.parsedate_to_datetime(value)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def parse_retry_after(
    value: str | None, *, now_epoch: float | None = None, date_header: str | None = None
) -> float | None:
    """Seconds to wait from a Retry-After value: delta-seconds or an HTTP date.

    A date is measured against the response's own Date header when there is
    one, so a skewed local clock does not shorten or stretch the wait.
    """
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = None
    if seconds is not None:
        return seconds if seconds >= 0 and seconds == seconds and seconds != float("inf") else None
    try:
        when = _http_date_epoch(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    reference = now_epoch if now_epoch is not None else time.time()
    if date_header:
        try:
            reference = _http_date_epoch(date_header)
        except (TypeError, ValueError, IndexError, OverflowError):
            pass
    return max(0.0, when - reference)


def _reference(body: bytes) -> str:
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        for key in REF_KEYS:
            if isinstance(parsed.get(key), (str, int)):
                return str(parsed[key])
    return "sha256:" + hashlib.sha256(body).hexdigest()


def _json_declared(headers: Mapping[str, str]) -> bool:
    return "json" in (headers.get("content-type") or "").lower()


def classify_response(
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now_epoch: float | None = None,
    already_processed: AlreadyProcessed = STRICT_ALREADY_PROCESSED,
    truncated: bool = False,
) -> Outcome:
    """Map one HTTP answer to sent / retry / dead. ``headers`` keys are lower-case; ``truncated``: ``body`` is
    the first part of a longer answer (read up to a cap), whose JSON cannot be checked whole."""
    snippet = body_text(body)[:200]
    if 200 <= status < 300:
        if body and _json_declared(headers) and not truncated:
            try:
                json.loads(body)
            except ValueError:
                return NOT_THE_JSON_IT_DECLARES.outcome(
                    f"HTTP {status} with a body that is not the JSON it declares: {snippet!r}"
                )
        return SENT.outcome(ref=_reference(body) if body else None)
    if status == 409:
        if already_processed.says_so(body):
            return ALREADY_PROCESSED.outcome(ref=_reference(body))
        # A duplicate rejection is not retried (only "already processed" counts as sent).
        return CONFLICT.outcome(f"HTTP 409 that does not say already processed: {snippet!r}")
    retry_after = parse_retry_after(headers.get("retry-after"), now_epoch=now_epoch, date_header=headers.get("date"))
    if status == 429:
        return TOO_MANY_REQUESTS.outcome(f"HTTP 429: {snippet!r}", delay_s=retry_after)
    if status == 408:
        return REQUEST_TIMEOUT.outcome(f"HTTP 408 request timeout: {snippet!r}")
    if status in (401, 403):
        # No body snippet: an answer to a refused credential may echo it.
        return UNAUTHORIZED.outcome(
            f"HTTP {status}: check the credential this table sends (the variable its token_env names, "
            "OUTBOX_BROKER_TOKEN at the broker's origin, or user:password in its URL)"
        )
    if 400 <= status < 500:
        # Every other 4xx (400, 404, 405, 410, 413, 422 ...) is final: retrying cannot help.
        return CLIENT_ERROR.outcome(f"HTTP {status}: {snippet!r}")
    if 500 <= status < 600:
        return SERVER_ERROR.outcome(f"HTTP {status}: {snippet!r}", delay_s=retry_after)
    return UNEXPECTED_STATUS.outcome(f"unexpected HTTP {status}: {snippet!r}")
