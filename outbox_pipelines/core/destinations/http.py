"""HTTP destination: one pooled keep-alive client per destination.

Every attempt of a message carries the same ``Idempotency-Key`` (its event_id),
so the destination can execute it once however often it is delivered.

Transports (chosen by measurement, see bench/results.md), all on one pooled
keep-alive client per destination and all mapping answers and failures alike:
- ``aiohttp-native``: an aiohttp ClientSession on a private event-loop thread
  (the default: about 3x the requests/s of the best httpx option here);
- ``aiohttp``: httpx's API over the httpx-aiohttp transport;
- ``httpx-async``: httpx.AsyncClient with its own pool;
- ``httpx-sync``: httpx.Client from a thread pool.

Credentials: ``token`` is sent as ``Authorization: Bearer <token>``; a URL with
user-info (``http://user:password@host/...``) is sent as Basic auth instead, with
the user-info taken out of the URL, so no transport, log or name shows it. Both
at once is a configuration error. Redirects are not followed (a 3xx is an
unexpected answer), so the credential goes only to the URL it was configured for.
The destination is named by its origin (``scheme://host[:port]``): its path and
query may be a secret too. Every text built from an answer (error snippets,
exception messages, references) has the destination's credentials scrubbed
(``redaction.Scrubber``), so an answer that echoes request headers cannot carry
them into ``last_error``, the audit, the ledger, alerts or run metadata.

An answer's body is read up to ``MAX_BODY_BYTES``: the rest is never read, so a
destination that streams without end cannot exhaust the relay's memory.

A request the HTTP client refuses to send (a control character in a header, an
invalid URL built from the message) is dead at once as ``BAD_REQUEST``: sending
it again cannot succeed.
"""

import asyncio
import json
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httpx

from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.destinations.http_outcomes import (
    STRICT_ALREADY_PROCESSED,
    AlreadyProcessed,
    classify_response,
)
from outbox_pipelines.core.destinations.signing import WebhookSigner
from outbox_pipelines.core.destinations.trace_context import trace_headers
from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.models import ClaimedMessage, Outcome
from outbox_pipelines.core.redaction import (
    Scrubber,
    hide_url_paths_in_http_client_logs,
    redact_text,
    redact_url,
    split_credentials,
    url_origin,
)

TRANSPORTS = ("aiohttp-native", "aiohttp", "httpx-async", "httpx-sync")
DEFAULT_TRANSPORT = "aiohttp-native"
# The most of an answer's body that is read (classification reads its first 4 KiB; a reference or an
# ExecResult is far smaller): 32 requests in flight then hold at most 32 MiB, whatever a destination sends.
MAX_BODY_BYTES = 1024 * 1024


@dataclass(frozen=True)
class HttpRequest:
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None
    path: str = ""


def default_request(message: ClaimedMessage) -> HttpRequest:
    """POST the payload as JSON; metadata travels in headers."""
    headers = {"X-Outbox-Topic": message.topic, "X-Outbox-Attempt": str(message.attempts), **trace_headers(message)}
    if message.trace_id:
        headers["X-Trace-Id"] = message.trace_id
    if message.tenant_id:
        headers["X-Tenant-Id"] = message.tenant_id
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

# Control characters (CR, LF, NUL ...; TAB is allowed in header values) that no HTTP client sends in a header
# or a request target. Refused here, the same way on every transport, before anything goes on the wire.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# What a bearer token may hold: visible ASCII (RFC 6750's b64token, and then some), no space, no control.
_TOKEN = re.compile(r"^[\x21-\x7e]+$")


def _check_request(url: str, headers: dict[str, str]) -> None:
    """ValueError naming what the HTTP client would refuse to send."""
    for name, value in headers.items():
        if _CONTROL.search(name) or "\t" in name or not name:
            raise ValueError(f"header name {name[:64]!r} holds a control character (CR, LF, NUL ...) or is empty")
        if _CONTROL.search(value):
            raise ValueError(f"header {name!r} holds a control character (CR, LF, NUL ...): {value[:64]!r}")
    if _CONTROL.search(url):
        raise ValueError(f"the request URL holds a control character (CR, LF, NUL ...): {redact_url(url)[:200]!r}")


def _unwrap(exc: BaseException) -> BaseException:
    """The one exception inside (nested) single-member exception groups (anyio raises those)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _as_httpx_error(exc: BaseException) -> BaseException:
    """The httpx error an aiohttp failure stands for, so every transport reports the same outcome.

    httpx-aiohttp maps every aiohttp connection error to ConnectTimeout (a refused
    connection, a server that hung up) and lets a bad status line through unmapped;
    classify by aiohttp's own exception instead, as httpx's native pools do.
    """
    cause = exc if isinstance(exc, aiohttp.ClientError) else exc.__cause__
    if not isinstance(cause, aiohttp.ClientError):
        return exc
    text = f"{type(cause).__name__}: {cause}"
    if isinstance(cause, aiohttp.ServerTimeoutError):
        return exc if isinstance(exc, httpx.TimeoutException) else httpx.ReadTimeout(text)
    if isinstance(cause, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientResponseError)):
        return httpx.RemoteProtocolError(text)  # httpx: "Server disconnected…", "peer closed…", "illegal status line"
    if isinstance(cause, aiohttp.ClientConnectionError):
        return httpx.ConnectError(text)
    return exc


# Exceptions by which an HTTP client refuses to send a request: nothing reached the destination, and
# sending the same request again fails the same way (checked after the network errors, which come first).
CLIENT_REFUSALS: tuple[type[BaseException], ...] = (
    httpx.LocalProtocolError,  # h11: "Illegal header value b'a\\r\\nb'"
    httpx.InvalidURL,
    httpx.UnsupportedProtocol,
    aiohttp.InvalidURL,
    # aiohttp: "Forbidden control character detected in headers"; UnicodeEncodeError (httpx: non-ASCII header)
    ValueError,
    TypeError,
)


def _exception_outcome(exc: BaseException, timeout_s: float) -> tuple[Outcome, str]:
    """The outcome of an attempt that got no answer, and the Attempt.failure it stands for."""
    exc = _as_httpx_error(_unwrap(exc))
    text = redact_text(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, httpx.TimeoutException):
        return Outcome.retry(m.NETWORK_TIMEOUT, f"no answer within {timeout_s:g} s ({type(exc).__name__})"), "timeout"
    if isinstance(exc, (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.CloseError)):
        return Outcome.retry(m.NETWORK_TIMEOUT, f"connection failed: {text}"), "connection"
    if isinstance(exc, CLIENT_REFUSALS):
        return Outcome.dead(m.BAD_REQUEST, f"the HTTP client refused to send the request: {text}"), "refused"
    if isinstance(exc, httpx.HTTPError):
        return Outcome.retry(m.UNKNOWN, f"unusable answer: {text}"), "protocol"
    return Outcome.retry(m.UNKNOWN, text), "error"


class _CappedBody:
    """An answer's body up to MAX_BODY_BYTES, and whether there was more (left unread)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, chunk: bytes) -> bool:
        """Keep ``chunk``; True once the cap is passed (stop reading)."""
        self.parts.append(chunk)
        self.size += len(chunk)
        return self.size > MAX_BODY_BYTES

    def read(self) -> tuple[bytes, bool]:
        return b"".join(self.parts)[:MAX_BODY_BYTES], self.size > MAX_BODY_BYTES


async def _read_capped(chunks: AsyncIterator[bytes]) -> tuple[bytes, bool]:
    body = _CappedBody()
    async for chunk in chunks:
        if body.add(chunk):
            break
    return body.read()


def _read_capped_sync(chunks: Iterator[bytes]) -> tuple[bytes, bool]:
    body = _CappedBody()
    for chunk in chunks:
        if body.add(chunk):
            break
    return body.read()


class HttpDestination(Destination):
    # Deliveries wait on the network: the relay claims and settles other batches meanwhile.
    pipelined = True

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
        raw_url, shown = url, redact_url(url)
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"destination URL must start with http:// or https://, got {shown!r}")
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
            raise ConfigError("the bearer token (OUTBOX_BROKER_TOKEN) holds spaces, control or non-ASCII characters; "
                              "it cannot travel in an Authorization header")
        # The name shows in logs, Dagster run logs and alerts: the origin only, never a credential or a path.
        origin = url_origin(url)
        self.name = redact_text(name.replace(raw_url, origin).replace(shown, origin)) if name else origin
        self.scrub = Scrubber(url, token=token, credentials=credentials)
        try:  # Standard Webhooks signatures (signing_secret_env); the secret itself is never kept or shown
            self.signer = WebhookSigner(signing_secret) if signing_secret else None
        except ValueError as exc:
            raise ConfigError(f"destination {url_origin(url)}: {exc}") from None
        hide_url_paths_in_http_client_logs()  # the httpx transports log each request's full URL at INFO
        self.already_processed = already_processed
        self.url = url.rstrip("/") if build_request is not default_request else url
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
        limits = httpx.Limits(max_connections=self.max_in_flight, max_keepalive_connections=self.max_in_flight)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        if transport == "httpx-sync":
            self._client: Any = httpx.Client(limits=limits, timeout=timeout_s)
            self._pool = ThreadPoolExecutor(self.max_in_flight, thread_name_prefix="outbox-http")
        else:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="outbox-http-loop", daemon=True)
            self._thread.start()
            self._client = asyncio.run_coroutine_threadsafe(self._make_async_client(limits), self._loop).result()

    async def _make_async_client(self, limits: httpx.Limits) -> Any:
        if self.transport == "aiohttp-native":
            connector = aiohttp.TCPConnector(limit=self.max_in_flight, keepalive_timeout=30)
            return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        if self.transport == "aiohttp":
            # Imported for this transport only: httpx_aiohttp costs ~0.2 s at import (-X importtime).
            from httpx_aiohttp import AiohttpTransport

            return httpx.AsyncClient(transport=AiohttpTransport(limits=limits), timeout=self.timeout_s)
        return httpx.AsyncClient(limits=limits, timeout=self.timeout_s)

    def _prepare(self, message: ClaimedMessage) -> tuple[str, bytes, dict[str, str], float]:
        request = self.build_request(message)
        # Header names are case-insensitive: a builder's "content-type" replaces the default
        # rather than adding a second one, and nothing can change the Idempotency-Key.
        headers = dict(self._base_lower)
        for name, value in request.headers.items():
            headers[name.lower()] = value
        headers["idempotency-key"] = message.event_id
        body = json.dumps(request.body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if self.signer is not None:  # signs the exact bytes sent; nothing a builder sets can replace them
            headers.update(self.signer.headers(message.event_id, body))
        path = request.path
        if path and not path.startswith(("/", "?")):
            path = "/" + path  # self.url has no trailing "/" here: "orders" must not become ":8080orders"
        _check_request(self.url + path, headers)
        return self.url + path, body, headers, request.timeout_s or self.timeout_s

    def _answered(self, message: ClaimedMessage, status: int, headers: Any, body: bytes, truncated: bool) -> Outcome:
        """The outcome of an answer (``body`` read up to MAX_BODY_BYTES; ``truncated``: there was more)."""
        outcome = classify_response(status, headers, body, already_processed=self.already_processed,
                                    truncated=truncated)
        return self._result(message, outcome, body, Attempt(status=status))

    def _failed(self, message: ClaimedMessage, exc: BaseException, timeout: float) -> Outcome:
        """The outcome of an attempt that got no usable answer."""
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
            if self.transport == "aiohttp-native":
                return await self._send_native(message, url, body, headers, timeout)
            try:
                request = self._client.build_request("POST", url, content=body, headers=headers, timeout=timeout)
                response = await self._client.send(request, stream=True)
                try:
                    content, truncated = await _read_capped(response.aiter_bytes())
                finally:
                    await response.aclose()
            except Exception as exc:
                return self._failed(message, exc, timeout)
        return self._answered(message, response.status_code, response.headers, content, truncated)

    async def _send_native(self, message: ClaimedMessage, url: str, body: bytes, headers: dict[str, str],
                           timeout: float) -> Outcome:
        try:
            async with self._client.post(url, data=body, headers=headers, allow_redirects=False,
                                         timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                content, truncated = await _read_capped(response.content.iter_chunked(64 * 1024))
                status, answer_headers = response.status, response.headers
        except TimeoutError:
            return self._failed(message, httpx.ReadTimeout("no answer"), timeout)
        except Exception as exc:
            return self._failed(message, exc, timeout)
        return self._answered(message, status, answer_headers, content, truncated)

    async def _deliver_async(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        gate = asyncio.Semaphore(self.max_in_flight)
        return list(await asyncio.gather(*(self._send_async(msg, gate) for msg in messages)))

    def _send_sync(self, message: ClaimedMessage) -> Outcome:
        try:
            url, body, headers, timeout = self._prepare(message)
        except Exception as exc:
            return self._unbuildable(message, exc)
        try:
            with self._client.stream("POST", url, content=body, headers=headers, timeout=timeout) as response:
                content, truncated = _read_capped_sync(response.iter_bytes())
        except Exception as exc:
            return self._failed(message, exc, timeout)
        return self._answered(message, response.status_code, response.headers, content, truncated)

    def deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        if not messages:
            return []
        if self._pool is not None:
            return list(self._pool.map(self._send_sync, messages))
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(self._deliver_async(messages), self._loop).result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._client.close()
            return
        if self._loop is not None and self._loop.is_running():
            closing = self._client.close() if self.transport == "aiohttp-native" else self._client.aclose()
            asyncio.run_coroutine_threadsafe(closing, self._loop).result(timeout=5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._loop.close()
