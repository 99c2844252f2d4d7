"""A receiver's check of a Standard Webhooks delivery: one ``v1`` signature of ``id.timestamp.body`` (the id and
timestamp as sent, the raw body) matches one of its secrets, then ``webhook-timestamp`` is within the tolerance.
Standard library and core only: an application installs it without Dagster or an HTTP client.
How to use it: docs/how-to/verify-webhooks.md."""

import base64
import binascii
import hashlib
import hmac
import re
import time
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import unquote

from outbox_pipelines.core.errors import OutboxError
from outbox_pipelines.core.settings.signing_secret import PREFIX, signing_keys, v1_signature

TOLERANCE = timedelta(minutes=5)  # what the Standard Webhooks libraries allow, either side of the receiver's clock
ID, TIMESTAMP, SIGNATURE = "webhook-id", "webhook-timestamp", "webhook-signature"
_SECONDS = re.compile(r"[0-9]{1,12}", re.ASCII)  # whole Unix seconds (12 digits reach the year 33658)
_ENTRY = re.compile(r"([A-Za-z0-9]+),([A-Za-z0-9+/=_-]+)")  # "v1,<base64>", "v1a,<base64>"
_DIGEST_BYTES = hashlib.sha256().digest_size


class WebhookVerificationError(OutboxError, ValueError):
    """A delivery that did not verify: do not act on it, answer 400. The message says why and never holds a
    secret or a signature."""


class WebhookHeaderMissing(WebhookVerificationError):
    """``webhook-id``, ``webhook-timestamp`` or ``webhook-signature`` is absent or empty."""


class WebhookTimestampMalformed(WebhookVerificationError):
    """``webhook-timestamp`` is not whole Unix seconds."""


class WebhookTimestampTooOld(WebhookVerificationError):
    """A genuine signature, but older than the tolerance: a replay, or a delivery held up past it."""


class WebhookTimestampTooNew(WebhookVerificationError):
    """A genuine signature, but dated ahead of the receiver's clock by more than the tolerance."""


class WebhookSignatureMalformed(WebhookVerificationError):
    """``webhook-signature`` is not a space-separated list of ``version,base64`` entries."""


class WebhookSignatureMismatch(WebhookVerificationError):
    """No ``v1`` signature matches any of the receiver's secrets: another secret, or bytes changed after signing."""


class WebhookSecretInvalid(WebhookVerificationError):
    """The receiver's own secret is not ``whsec_`` and base64 of at least 16 bytes (raised before any delivery)."""


class WebhookVerifier:
    """The keys of one or several secrets (a rotation: a list, or one string with the secrets separated by
    spaces, as ``signing_secret_env`` holds them), parsed once; ``verify`` checks a delivery against them."""

    def __init__(self, secret: str | Iterable[str], *, tolerance: timedelta = TOLERANCE) -> None:
        if isinstance(secret, bytes | bytearray) or not isinstance(secret, str | Iterable):
            raise WebhookSecretInvalid(f"pass the webhook secret as text ({PREFIX}...), not {type(secret).__name__}")
        texts = [secret] if isinstance(secret, str) else list(secret)
        if not all(isinstance(text, str) for text in texts):
            raise WebhookSecretInvalid(f"pass each webhook secret as text ({PREFIX}...)")
        try:
            self._keys = signing_keys(" ".join(texts))
        except ValueError as exc:  # the message names what is wrong, never the secret
            raise WebhookSecretInvalid(str(exc)) from None
        if tolerance < timedelta(0):
            raise ValueError(f"the timestamp tolerance must not be negative (got {tolerance})")
        self.tolerance = tolerance

    def __repr__(self) -> str:
        return f"WebhookVerifier(<{len(self._keys)} key(s)>, tolerance={self.tolerance})"

    def verify(self, headers: Any, body: bytes, *, now: datetime | None = None) -> str:
        """The message's id if the delivery is genuine and fresh, else raise the ``WebhookVerificationError`` saying
        why. ``headers``: the request's (any mapping or ``(name, value)`` pairs; names in any case); ``body``: its
        raw bytes, before any JSON parsing; ``now``: the receiver's clock (timezone-aware; default the system's).

        The id is the message's ``event_id`` as the relay wrote it into ``webhook-id`` and decoded back (a header
        carries it percent-encoded outside printable ASCII and "."): what ``Inbox.receive`` records, at most 255
        characters, the same id a broker consumer reads for the message."""
        if now is not None and now.tzinfo is None:
            raise ValueError("now must be timezone-aware (datetime.now(timezone.utc))")
        if not isinstance(body, bytes | bytearray | memoryview):
            raise TypeError(
                f"verify the raw request body as bytes (Starlette: await request.body(); Django, Flask: "
                f"request.body / request.get_data()), not {type(body).__name__}: a re-serialized body never verifies"
            )
        found = _three_headers(headers)
        signatures = _v1_signatures(found[SIGNATURE])
        sent_at = _seconds(found[TIMESTAMP])
        if not signatures:
            raise WebhookSignatureMismatch(
                "webhook-signature holds no v1 (HMAC-SHA256) signature; this verifier checks the symmetric "
                f"signatures a {PREFIX} secret makes"
            )
        timestamp = found[TIMESTAMP].encode("ascii")
        if not self._matches(_id_bytes(found[ID]), timestamp, bytes(body), signatures):
            raise WebhookSignatureMismatch(
                f"none of the {len(signatures)} v1 signature(s) in webhook-signature matches the receiver's "
                f"{len(self._keys)} secret(s): the sender signs with another secret, or the body, the id or the "
                "timestamp changed after signing (verify the raw body bytes, before any parsing)"
            )
        self._check_time(sent_at, now)
        return message_id_of(found[ID])

    def _matches(self, ids: Iterable[bytes], timestamp: bytes, body: bytes, signatures: list[bytes]) -> bool:
        for sent_id in ids:
            for key in self._keys:
                expected = v1_signature(key, sent_id, timestamp, body)
                # Every comparison in constant time: compare_digest, never ==.
                if any(hmac.compare_digest(expected, signature) for signature in signatures):
                    return True
        return False

    def _check_time(self, sent_at: int, now: datetime | None) -> None:
        clock = time.time() if now is None else now.timestamp()
        age = clock - sent_at
        limit = self.tolerance.total_seconds()
        if age > limit:
            raise WebhookTimestampTooOld(
                f"webhook-timestamp {sent_at} is {age:.0f} s old, past the {limit:.0f} s tolerance: a replayed "
                "delivery, or one held up on the way (each attempt is signed afresh); or this receiver's clock is ahead"
            )
        if -age > limit:
            raise WebhookTimestampTooNew(
                f"webhook-timestamp {sent_at} is {-age:.0f} s ahead of this receiver's clock, past the {limit:.0f} s "
                "tolerance: one of the two clocks is wrong (check NTP on both)"
            )


def verify_webhook(
    secret: str | Iterable[str],
    headers: Any,
    body: bytes,
    *,
    tolerance: timedelta = TOLERANCE,
    now: datetime | None = None,
) -> str:
    """Verify one delivery: ``WebhookVerifier(secret, tolerance=tolerance).verify(headers, body, now=now)``, and
    its message id. A receiver that verifies many builds the ``WebhookVerifier`` once."""
    return WebhookVerifier(secret, tolerance=tolerance).verify(headers, body, now=now)


def message_id_of(sent_id: str) -> str:
    """The event_id a ``webhook-id`` (or ``Idempotency-Key``) header carries: percent-decoded as the relay encoded
    it (core/destinations/signing.py, ``header_id``). An id that does not decode as UTF-8 (another sender's) is
    returned as it came."""
    try:
        return unquote(sent_id, errors="strict")
    except UnicodeDecodeError:
        return sent_id


def _three_headers(headers: Any) -> dict[str, str]:
    """The three headers' values, stripped, found whatever the case of their names; the first of a repeated one
    (what Starlette, Django, Flask and http.server's ``get`` give)."""
    pairs = headers.items() if hasattr(headers, "items") else headers
    found: dict[str, str] = {}
    for name, value in pairs:
        key = (name if isinstance(name, str) else bytes(name).decode("latin-1")).lower()
        if key in (ID, TIMESTAMP, SIGNATURE) and key not in found:
            found[key] = (value if isinstance(value, str) else bytes(value).decode("latin-1")).strip()
    missing = [name for name in (ID, TIMESTAMP, SIGNATURE) if not found.get(name)]
    if missing:
        raise WebhookHeaderMissing(
            f"the request has no {', '.join(missing)} header (or an empty one): not a Standard Webhooks delivery, "
            "or a proxy dropped it; pass the request's headers as the framework gives them (request.headers)"
        )
    return found


def _v1_signatures(value: str) -> list[bytes]:
    """The decoded ``v1`` signatures of a ``webhook-signature`` value; other versions (``v1a``) are skipped."""
    signatures = []
    for position, entry in enumerate(value.split(), start=1):
        match = _ENTRY.fullmatch(entry)
        if match is None:
            raise WebhookSignatureMalformed(
                f"entry {position} of webhook-signature is not version,base64 (as in v1,K5oZ...=); entries are "
                "separated by single spaces"
            )
        if match.group(1) != "v1":
            continue
        try:
            signature = base64.b64decode(match.group(2), validate=True)
        except (binascii.Error, ValueError):
            raise WebhookSignatureMalformed(f"entry {position} of webhook-signature is not valid base64") from None
        if len(signature) != _DIGEST_BYTES:
            raise WebhookSignatureMalformed(
                f"entry {position} of webhook-signature decodes to {len(signature)} bytes; a v1 (HMAC-SHA256) "
                f"signature is {_DIGEST_BYTES}: cut short on the way?"
            )
        signatures.append(signature)
    return signatures


def _seconds(value: str) -> int:
    if _SECONDS.fullmatch(value) is None:
        hint = " (that looks like milliseconds)" if value.isascii() and value.isdigit() and len(value) == 13 else ""
        raise WebhookTimestampMalformed(
            f"webhook-timestamp {value[:24]!r} is not whole Unix seconds{hint}, as Standard Webhooks writes it"
        )
    return int(value)


def _id_bytes(sent_id: str) -> list[bytes]:
    """The id's bytes as the sender signed them. Ours is ASCII; another sender's non-ASCII id is tried as UTF-8
    (what the spec's libraries sign) and as the Latin-1 a WSGI or ASGI server decoded the raw bytes with."""
    if sent_id.isascii():
        return [sent_id.encode("ascii")]
    candidates = [sent_id.encode("utf-8")]
    try:
        candidates.append(sent_id.encode("latin-1"))
    except UnicodeEncodeError:
        pass
    return candidates
