"""HTTP destination: one pooled keep-alive client per destination.

Every attempt of a message carries the same ``Idempotency-Key`` (its event_id). The relay calls
``HttpDestination``: it builds each request, sends it on the table's transport, and maps the answer. No
credential leaves the URL it was configured for, nor reaches any text stored or shown.
Why: docs/explanation/transports.md, "HTTP: credentials and refusals".
"""

import asyncio
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httpx

from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations.base import Destination, server_of
from outbox_pipelines.core.destinations.http.failures import check_request
from outbox_pipelines.core.destinations.http.failures import exception_outcome as _exception_outcome
from outbox_pipelines.core.destinations.http.outcomes import classify_response
from outbox_pipelines.core.destinations.http.transport import (
    DEFAULT_TRANSPORT,
    MAX_BODY_BYTES,
    TRANSPORTS,
    HttpClient,
)
from outbox_pipelines.core.destinations.signing import WebhookSigner, header_id
from outbox_pipelines.core.destinations.trace_context import context_headers
from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.models import ClaimedMessage, Outcome
from outbox_pipelines.core.redaction import (
    Scrubber,
    hide_url_paths_in_http_client_logs,
    mask_url,
    redact_text,
    split_credentials,
    unencoded_userinfo,
    url_origin,
)
from outbox_pipelines.core.settings.already_processed import STRICT_ALREADY_PROCESSED, AlreadyProcessed

# The transports' table and the body cap are http_transport's; imported from here as they always were.
__all__ = [
    "DEFAULT_TRANSPORT",
    "MAX_BODY_BYTES",
    "TRANSPORTS",
    "Attempt",
    "HttpDestination",
    "HttpRequest",
    "RequestBuilder",
    "ResultHook",
    "default_request",
]


@dataclass(frozen=True)
class HttpRequest:
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None
    path: str = ""


def default_request(message: ClaimedMessage) -> HttpRequest:
    """POST the payload as JSON; metadata travels in headers."""
    headers = {"X-Outbox-Topic": message.topic, "X-Outbox-Attempt": str(message.attempts), **context_headers(message)}
    return HttpRequest(body=message.payload, headers=headers)


@dataclass(frozen=True)
class Attempt:
    """What one delivery attempt was on the wire, beyond its outcome (the order ledger's error map needs it)."""

    # The HTTP status of the answer; None when there was no answer.
    status: int | None = None
    # Why there was no answer: "timeout", "connection" (refused, reset, unreachable), "protocol" (a broken
    # answer), "refused" (the HTTP client would not send the request), "error" (anything else).
    failure: str | None = None


RequestBuilder = Callable[[ClaimedMessage], HttpRequest]
# Called with (message, outcome, response body, attempt) after each attempt; for adapters
# that record results elsewhere (the order ledger).
ResultHook = Callable[[ClaimedMessage, Outcome, bytes, Attempt], Outcome]

# What a bearer token may hold: visible ASCII (RFC 6750's b64token, and then some), no space, no control.
_TOKEN = re.compile(r"^[\x21-\x7e]+$")


class HttpDestination(Destination):
    # Deliveries wait on the network: the relay claims and settles other batches meanwhile.
    pipelined = True
    messaging_system = "http"

    def __init__(
        self,
        url: str,
        *,
        name: str | None = None,
        timeout_s: float = 5.0,
        max_in_flight: int = 32,
        token: str | None = None,
        transport: str = DEFAULT_TRANSPORT,
        build_request: RequestBuilder = default_request,
        on_result: ResultHook | None = None,
        already_processed: AlreadyProcessed = STRICT_ALREADY_PROCESSED,
        signing_secret: str | None = None,
    ) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"unknown HTTP transport {transport!r}; choose one of {', '.join(TRANSPORTS)}")
        raw_url, shown = url, mask_url(url)
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"destination URL must start with http:// or https://, got {shown!r}")
        two_ways = unencoded_userinfo(url, "the destination URL")  # httpx would send to a host out of the password
        if two_ways is not None:
            raise ConfigError(two_ways)
        try:
            url, credentials = split_credentials(url)
            urlsplit(url).port  # noqa: B018  (a port out of range raises here, not at the first delivery)
            httpx.URL(url)
        except (ValueError, httpx.InvalidURL) as exc:
            raise ValueError(f"destination URL {shown!r} is not a valid URL: {redact_text(str(exc))}") from None
        if credentials is not None and token:
            raise ConfigError(
                f"destination {shown}: the URL carries user:password and a bearer token (OUTBOX_BROKER_TOKEN) is "
                "set too; a request can carry one credential: drop the user-info from the URL or unset the token"
            )
        if token and not _TOKEN.fullmatch(token):
            raise ConfigError(
                "the bearer token (OUTBOX_BROKER_TOKEN) holds spaces, control or non-ASCII characters; "
                "it cannot travel in an Authorization header"
            )
        # The name shows in logs, Dagster run logs and alerts: the origin only, never a credential or a path.
        origin = url_origin(url)
        self.name = redact_text(name.replace(raw_url, origin).replace(shown, origin)) if name else origin
        self.scrub = Scrubber(url, token=token, credentials=credentials, signing_secret=signing_secret)
        try:  # Standard Webhooks signatures (signing_secret_env); the secret itself is never kept or shown
            self.signer = WebhookSigner(signing_secret) if signing_secret else None
        except ValueError as exc:
            raise ConfigError(f"destination {url_origin(url)}: {exc}") from None
        hide_url_paths_in_http_client_logs()  # the httpx transports log each request's full URL at INFO
        self.already_processed = already_processed
        self.url = url.rstrip("/") if build_request is not default_request else url
        self.server = server_of(url, 443 if url.startswith("https://") else 80)
        self.timeout_s = timeout_s
        self.max_in_flight = max(1, max_in_flight)
        self.transport = transport
        self.build_request = build_request
        self.on_result = on_result
        self.base_headers = {"Content-Type": "application/json", "User-Agent": "outbox-pipelines"}
        if token:
            self.base_headers["Authorization"] = f"Bearer {token}"
        elif credentials is not None:
            # The same header on every transport (Basic auth, UTF-8 as RFC 7617 recommends).
            self.base_headers["Authorization"] = aiohttp.encode_basic_auth(*credentials, encoding="utf-8")
        self._base_lower = {name.lower(): value for name, value in self.base_headers.items()}
        self._client = HttpClient(transport, timeout_s=timeout_s, max_in_flight=self.max_in_flight)

    def _prepare(self, message: ClaimedMessage) -> tuple[str, bytes, dict[str, str], float]:
        request = self.build_request(message)
        # Header names are case-insensitive: a builder's "content-type" replaces the default
        # rather than adding a second one, and nothing can change the Idempotency-Key.
        headers = dict(self._base_lower)
        for name, value in request.headers.items():
            headers[name.lower()] = value
        headers["idempotency-key"] = header_id(message.event_id)  # ASCII as a header carries it (signing.py)
        body = json.dumps(request.body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if self.signer is not None:  # signs the exact bytes sent; nothing a builder sets can replace them
            headers.update(self.signer.headers(message.event_id, body))
        path = request.path
        if path and not path.startswith(("/", "?")):
            path = "/" + path  # self.url has no trailing "/" here: "orders" must not become ":8080orders"
        check_request(self.url + path, headers)
        return self.url + path, body, headers, request.timeout_s or self.timeout_s

    def _answered(self, message: ClaimedMessage, status: int, headers: Any, body: bytes, truncated: bool) -> Outcome:
        """The outcome of an answer (``body`` read up to MAX_BODY_BYTES; ``truncated``: there was more)."""
        outcome = classify_response(
            status, headers, body, already_processed=self.already_processed, truncated=truncated
        )
        return self._result(message, outcome, body, Attempt(status=status))

    def _failed(self, message: ClaimedMessage, exc: BaseException, timeout: float) -> Outcome:
        """The outcome of an attempt that got no usable answer (``_exception_outcome``: the name tests import)."""
        outcome, failure = _exception_outcome(exc, timeout)
        return self._result(message, outcome, b"", Attempt(failure=failure))

    def _result(self, message: ClaimedMessage, outcome: Outcome, body: bytes, attempt: Attempt) -> Outcome:
        if outcome.error:  # what the destination said, or an exception naming its URL: without its credentials
            outcome = replace(outcome, error=self.scrub(outcome.error))
        return self.on_result(message, outcome, body, attempt) if self.on_result else outcome

    def _unbuildable(self, message: ClaimedMessage, exc: Exception) -> Outcome:
        """A request that cannot be built from this message (a builder's error, a control character): dead."""
        outcome = Outcome.dead(m.BAD_REQUEST, redact_text(f"cannot build the request: {type(exc).__name__}: {exc}"))
        return self._result(message, outcome, b"", Attempt(failure="refused"))

    async def _send_async(self, message: ClaimedMessage, gate: asyncio.Semaphore) -> Outcome:
        try:
            url, body, headers, timeout = self._prepare(message)
        except Exception as exc:  # a request builder that cannot map this payload, a header no client sends
            return self._unbuildable(message, exc)
        async with gate:
            try:
                answer = await self._client.post(url, body, headers, timeout)
            except Exception as exc:
                return self._failed(message, exc, timeout)
        return self._answered(message, *answer)

    async def _deliver_async(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        gate = asyncio.Semaphore(self.max_in_flight)
        return list(await asyncio.gather(*(self._send_async(msg, gate) for msg in messages)))

    def _send_sync(self, message: ClaimedMessage) -> Outcome:
        try:
            url, body, headers, timeout = self._prepare(message)
        except Exception as exc:
            return self._unbuildable(message, exc)
        try:
            answer = self._client.post_sync(url, body, headers, timeout)
        except Exception as exc:
            return self._failed(message, exc, timeout)
        return self._answered(message, *answer)

    def deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        if not messages:
            return []
        if self._client.pooled:
            return self._client.map(self._send_sync, messages)
        return self._client.run(self._deliver_async(messages))

    def close(self) -> None:
        self._client.close()
