"""The mapping of HTTP answers to outcomes (docs/design.md §3.4, seed 000 §5 and §7). Pure functions.

| answer | outcome | code |
|---|---|---|
| 2xx | sent (ref: the broker's id, else the body's digest) | - |
| 2xx declaring JSON with a body that is not JSON | retry | UNKNOWN |
| 409 whose body carries the table's evidence of "already processed" | sent | CONFLICT_PROCESSED |
| 409 other (a duplicate rejection, a conflict, anything unclear) | dead | BAD_REQUEST |
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
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from outbox_pipelines.core import models as m
from outbox_pipelines.core.models import Outcome

# What a 409's body must say to count as "this idempotency key was already executed" (seed 000 §5), unless a
# table names its destination's own words (``already_processed`` in outbox.toml). Each rule is either
# ``field=value`` (a JSON object's field, dotted for nesting, equal to the value) or a bare phrase (the whole
# body, as plain text, equal to it); compared without case, with spaces, hyphens and underscores alike and a
# trailing full stop ignored. Strict on purpose: a word found somewhere in the body ("duplicate rejected:
# different order", "not already processed") is a rejection, never a delivery.
DEFAULT_ALREADY_PROCESSED = ("status=already_processed", "code=already_processed", "error=already_processed",
                             "already processed")
_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*$")
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


def _normal(value: str) -> str:
    return re.sub(r"[\s_-]+", "_", value.strip().lower()).rstrip(".!")


@dataclass(frozen=True)
class AlreadyProcessed:
    """The evidence by which a 409 means "already processed": JSON fields with a value, or whole phrases."""

    fields: tuple[tuple[tuple[str, ...], str], ...] = ()
    phrases: tuple[str, ...] = ()

    @classmethod
    def parse(cls, rules: Sequence[str], where: str = "already_processed") -> "AlreadyProcessed":
        """From ``field=value`` and phrase rules; ValueError naming the rule that cannot be read."""
        fields, phrases = [], []
        for rule in rules:
            if not isinstance(rule, str) or not rule.strip():
                raise ValueError(f"{where}: each rule is a non-empty string, got {rule!r}")
            name, equals, value = rule.partition("=")
            if not equals:
                phrases.append(_normal(rule))
                continue
            if not _FIELD.fullmatch(name.strip()) or not value.strip():
                raise ValueError(f"{where}: {rule!r} is not field=value (a JSON field, dotted for nesting, "
                                 "and the value that means already processed)")
            fields.append((tuple(name.strip().split(".")), _normal(value)))
        return cls(tuple(fields), tuple(phrases))

    def says_so(self, body: bytes) -> bool:
        text = _body_text(body)
        try:
            parsed: Any = json.loads(text)
        except ValueError:
            return _normal(text) in self.phrases
        if isinstance(parsed, str):
            return _normal(parsed) in self.phrases
        return any(isinstance(found := _field(parsed, path), str) and _normal(found) == value
                   for path, value in self.fields)


def _field(document: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        if not isinstance(document, dict):
            return None
        document = document.get(name)
    return document


STRICT_ALREADY_PROCESSED = AlreadyProcessed.parse(DEFAULT_ALREADY_PROCESSED)


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
    snippet = _body_text(body)[:200]
    if 200 <= status < 300:
        if body and _json_declared(headers) and not truncated:
            try:
                json.loads(body)
            except ValueError:
                return Outcome.retry(m.UNKNOWN,
                                     f"HTTP {status} with a body that is not the JSON it declares: {snippet!r}")
        return Outcome.sent(ref=_reference(body) if body else None)
    if status == 409:
        if already_processed.says_so(body):
            return Outcome.sent(ref=_reference(body), code=m.CONFLICT_PROCESSED)
        # Seed 000 §5: a duplicate rejection is not retried (only "already processed" counts as sent).
        return Outcome.dead(m.BAD_REQUEST, f"HTTP 409 that does not say already processed: {snippet!r}")
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
