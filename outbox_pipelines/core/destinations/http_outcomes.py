"""The mapping of HTTP answers to outcomes (docs/design.md §3.4, seed 000 §5 and §7). Pure functions.

| answer | outcome | code |
|---|---|---|
| 2xx | sent (ref: the broker's id, else the body's digest) | - |
| 2xx declaring JSON with a body that is not JSON | retry | UNKNOWN |
| 409 "already processed" | sent | CONFLICT_PROCESSED |
| 409 other (a duplicate rejection) | dead | BAD_REQUEST |
| 429 | retry not before Retry-After | RATE_LIMITED |
| 408 | retry | NETWORK_TIMEOUT |
| 401, 403 | dead | UNAUTHORIZED |
| any other 4xx (400, 404, 405, 410, 413, 422 ...) | dead | BAD_REQUEST |
| 5xx | retry (not before Retry-After if given) | BROKER_5XX |
| anything else (1xx, 3xx, > 599) | retry, bounded by max attempts | UNKNOWN |
"""

import email.utils
import hashlib
import json
import time
from collections.abc import Mapping
from datetime import UTC

from outbox_pipelines.core import models as m
from outbox_pipelines.core.models import Outcome

# Bodies of a 409 that mean "this idempotency key was already executed".
ALREADY_PROCESSED_MARKERS = ("already processed", "already_processed", "alreadyprocessed", "duplicate")
REF_KEYS = ("broker_order_id", "memory_id", "order_id", "id")


def _http_date_epoch(value: str) -> float:
    """Epoch seconds of an HTTP date. HTTP dates are UTC (RFC 9110 §5.6.7): the asctime
    form and a ``-0000`` zone parse as naive datetimes, which must not be read as local time."""
    when = email.utils.parsedate_to_datetime(value)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def parse_retry_after(value: str | None, *, now_epoch: float | None = None,
                      date_header: str | None = None) -> float | None:
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


def _body_text(body: bytes) -> str:
    return body[:4096].decode("utf-8", errors="replace")


def _is_already_processed(body: bytes) -> bool:
    text = _body_text(body).lower()
    return any(marker in text for marker in ALREADY_PROCESSED_MARKERS)


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
) -> Outcome:
    """Map one HTTP answer to sent / retry / dead. ``headers`` keys are lower-case."""
    snippet = _body_text(body)[:200]
    if 200 <= status < 300:
        if body and _json_declared(headers):
            try:
                json.loads(body)
            except ValueError:
                return Outcome.retry(m.UNKNOWN,
                                     f"HTTP {status} with a body that is not the JSON it declares: {snippet!r}")
        return Outcome.sent(ref=_reference(body) if body else None)
    if status == 409:
        if _is_already_processed(body):
            return Outcome.sent(ref=_reference(body), code=m.CONFLICT_PROCESSED)
        # Seed 000 §5: a duplicate rejection is not retried (only "already processed" counts as sent).
        return Outcome.dead(m.BAD_REQUEST, f"HTTP 409 without 'already processed': {snippet!r}")
    retry_after = parse_retry_after(headers.get("retry-after"), now_epoch=now_epoch, date_header=headers.get("date"))
    if status == 429:
        return Outcome.retry(m.RATE_LIMITED, f"HTTP 429: {snippet!r}", delay_s=retry_after)
    if status == 408:
        return Outcome.retry(m.NETWORK_TIMEOUT, f"HTTP 408 request timeout: {snippet!r}")
    if status in (401, 403):
        # No body snippet: an answer to a refused credential may echo it.
        return Outcome.dead(m.UNAUTHORIZED, f"HTTP {status}: check the destination's credentials "
                                            "(OUTBOX_BROKER_TOKEN, or user:password in its URL)")
    if 400 <= status < 500:
        # Seed 000 §5: every other 4xx (400, 404, 405, 410, 413, 422 ...) is final: retrying cannot help.
        return Outcome.dead(m.BAD_REQUEST, f"HTTP {status}: {snippet!r}")
    if 500 <= status < 600:
        return Outcome.retry(m.BROKER_5XX, f"HTTP {status}: {snippet!r}", delay_s=retry_after)
    return Outcome.retry(m.UNKNOWN, f"unexpected HTTP {status}: {snippet!r}")
