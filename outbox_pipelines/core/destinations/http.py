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
"""

import asyncio
import json
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx

from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations.http_outcomes import classify_response
from outbox_pipelines.core.models import ClaimedMessage, Outcome

TRANSPORTS = ("aiohttp-native", "aiohttp", "httpx-async", "httpx-sync")
DEFAULT_TRANSPORT = "aiohttp-native"


@dataclass(frozen=True)
class HttpRequest:
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None
    path: str = ""


def default_request(message: ClaimedMessage) -> HttpRequest:
    """POST the payload as JSON; metadata travels in headers."""
    headers = {"X-Outbox-Topic": message.topic, "X-Outbox-Attempt": str(message.attempts)}
    if message.trace_id:
        headers["X-Trace-Id"] = message.trace_id
    if message.tenant_id:
        headers["X-Tenant-Id"] = message.tenant_id
    return HttpRequest(body=message.payload, headers=headers)


RequestBuilder = Callable[[ClaimedMessage], HttpRequest]
# Called with (message, outcome, response body) after each answer; for adapters
# that record results elsewhere (the order ledger).
ResultHook = Callable[[ClaimedMessage, Outcome, bytes], Outcome]


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


def _exception_outcome(exc: BaseException, timeout_s: float) -> Outcome:
    exc = _as_httpx_error(exc)
    if isinstance(exc, httpx.TimeoutException):
        return Outcome.retry(m.NETWORK_TIMEOUT, f"no answer within {timeout_s:g} s ({type(exc).__name__})")
    if isinstance(exc, (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.CloseError)):
        return Outcome.retry(m.NETWORK_TIMEOUT, f"connection failed: {type(exc).__name__}: {exc}")
    if isinstance(exc, httpx.HTTPError):
        return Outcome.retry(m.UNKNOWN, f"unusable answer: {type(exc).__name__}: {exc}")
    return Outcome.retry(m.UNKNOWN, f"{type(exc).__name__}: {exc}")


class HttpDestination:
    # Deliveries wait on the network: the relay claims and settles other batches meanwhile.
    pipelined = True

    def __init__(
        self,
        url: str,
        *,
        name: str | None = None,
        timeout_s: float = 5.0,
        parallelism: int = 32,
        token: str | None = None,
        transport: str = DEFAULT_TRANSPORT,
        build_request: RequestBuilder = default_request,
        on_result: ResultHook | None = None,
    ) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"unknown HTTP transport {transport!r}; choose one of {', '.join(TRANSPORTS)}")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"destination URL must start with http:// or https://, got {url!r}")
        self.name = name or url
        self.url = url.rstrip("/") if build_request is not default_request else url
        self.timeout_s = timeout_s
        self.parallelism = max(1, parallelism)
        self.transport = transport
        self.build_request = build_request
        self.on_result = on_result
        self.base_headers = {"Content-Type": "application/json", "User-Agent": "outbox-pipelines"}
        if token:
            self.base_headers["Authorization"] = f"Bearer {token}"
        self._base_lower = {name.lower(): value for name, value in self.base_headers.items()}
        limits = httpx.Limits(max_connections=self.parallelism, max_keepalive_connections=self.parallelism)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        if transport == "httpx-sync":
            self._client: Any = httpx.Client(limits=limits, timeout=timeout_s)
            self._pool = ThreadPoolExecutor(self.parallelism, thread_name_prefix="outbox-http")
        else:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="outbox-http-loop", daemon=True)
            self._thread.start()
            self._client = asyncio.run_coroutine_threadsafe(self._make_async_client(limits), self._loop).result()

    async def _make_async_client(self, limits: httpx.Limits) -> Any:
        if self.transport == "aiohttp-native":
            connector = aiohttp.TCPConnector(limit=self.parallelism, keepalive_timeout=30)
            return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        if self.transport == "aiohttp":
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
        path = request.path
        if path and not path.startswith(("/", "?")):
            path = "/" + path  # self.url has no trailing "/" here: "orders" must not become ":8080orders"
        return self.url + path, body, headers, request.timeout_s or self.timeout_s

    def _finish(self, message: ClaimedMessage, response: httpx.Response | None, exc: BaseException | None, timeout: float) -> Outcome:
        if response is not None:
            body = response.content
            outcome = classify_response(response.status_code, response.headers, body)
        else:
            body = b""
            outcome = _exception_outcome(exc, timeout) if exc else Outcome.retry(m.UNKNOWN, "no response")
        return self.on_result(message, outcome, body) if self.on_result else outcome

    async def _send_async(self, message: ClaimedMessage, gate: asyncio.Semaphore) -> Outcome:
        try:
            url, body, headers, timeout = self._prepare(message)
        except Exception as exc:  # a request builder that cannot map this payload
            return Outcome.dead(m.BAD_REQUEST, f"cannot build the request: {type(exc).__name__}: {exc}")
        async with gate:
            if self.transport == "aiohttp-native":
                return await self._send_native(message, url, body, headers, timeout)
            try:
                response = await self._client.post(url, content=body, headers=headers, timeout=timeout)
            except Exception as exc:
                return self._finish(message, None, exc, timeout)
        return self._finish(message, response, None, timeout)

    async def _send_native(self, message: ClaimedMessage, url: str, body: bytes, headers: dict[str, str],
                           timeout: float) -> Outcome:
        try:
            async with self._client.post(url, data=body, headers=headers,
                                         timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                content = await response.read()
                outcome = classify_response(response.status, response.headers, content)
        except asyncio.TimeoutError:
            return self._finish(message, None, httpx.ReadTimeout("no answer"), timeout)
        except Exception as exc:
            return self._finish(message, None, exc, timeout)
        return self.on_result(message, outcome, content) if self.on_result else outcome

    async def _deliver_async(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        gate = asyncio.Semaphore(self.parallelism)
        return list(await asyncio.gather(*(self._send_async(msg, gate) for msg in messages)))

    def _send_sync(self, message: ClaimedMessage) -> Outcome:
        try:
            url, body, headers, timeout = self._prepare(message)
        except Exception as exc:
            return Outcome.dead(m.BAD_REQUEST, f"cannot build the request: {type(exc).__name__}: {exc}")
        try:
            response = self._client.post(url, content=body, headers=headers, timeout=timeout)
        except Exception as exc:
            return self._finish(message, None, exc, timeout)
        return self._finish(message, response, None, timeout)

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
