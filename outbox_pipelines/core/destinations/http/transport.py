"""The HTTP destination's client: one pooled keep-alive client of the transport a table chose, the thread
(an event loop) or threads (a pool) it runs on, one POST, and an answer's body read up to MAX_BODY_BYTES.

Redirects are never followed. The transports and why ``aiohttp-native`` is the default:
docs/explanation/transports.md, "HTTP: the transports".
"""

from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import aiohttp
import httpx

from outbox_pipelines.core.destinations.loop_thread import LoopThread

T = TypeVar("T")
R = TypeVar("R")

TRANSPORTS = ("aiohttp-native", "aiohttp", "httpx-async", "httpx-sync")
DEFAULT_TRANSPORT = "aiohttp-native"
# The most of an answer's body that is read (classification reads its first 4 KiB; a reference or an
# ExecResult is far smaller): 32 requests in flight then hold at most 32 MiB, whatever a destination sends.
MAX_BODY_BYTES = 1024 * 1024

# An answer: its status, its headers, its body (up to MAX_BODY_BYTES) and whether there was more.
Answer = tuple[int, Any, bytes, bool]


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


class HttpClient:
    """One pooled keep-alive client of ``transport``: asynchronous on a private event loop, or (``httpx-sync``)
    synchronous from a pool of ``max_in_flight`` threads (``pooled``)."""

    def __init__(self, transport: str, *, timeout_s: float, max_in_flight: int) -> None:
        self.transport = transport
        self.timeout_s = timeout_s
        self.max_in_flight = max_in_flight
        limits = httpx.Limits(max_connections=max_in_flight, max_keepalive_connections=max_in_flight)
        self._loop: LoopThread | None = None
        self._pool: ThreadPoolExecutor | None = None
        if transport == "httpx-sync":
            self._client: Any = httpx.Client(limits=limits, timeout=timeout_s)
            self._pool = ThreadPoolExecutor(max_in_flight, thread_name_prefix="outbox-http")
        else:
            self._loop = LoopThread("outbox-http-loop")
            self._client = self._loop.run(self._make_async_client(limits))

    async def _make_async_client(self, limits: httpx.Limits) -> Any:
        if self.transport == "aiohttp-native":
            connector = aiohttp.TCPConnector(limit=self.max_in_flight, keepalive_timeout=30)
            return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        if self.transport == "aiohttp":
            # Imported for this transport only: httpx_aiohttp costs ~0.2 s at import (-X importtime).
            from httpx_aiohttp import AiohttpTransport

            return httpx.AsyncClient(transport=AiohttpTransport(limits=limits), timeout=self.timeout_s)
        return httpx.AsyncClient(limits=limits, timeout=self.timeout_s)

    @property
    def pooled(self) -> bool:
        """True when requests are sent from the thread pool (``map``), else on the event loop (``run``)."""
        return self._pool is not None

    def map(self, send: Callable[[T], R], items: Iterable[T]) -> list[R]:
        assert self._pool is not None
        return list(self._pool.map(send, items))

    def run(self, coro: Coroutine[Any, Any, R]) -> R:
        assert self._loop is not None
        return self._loop.run(coro)

    async def post(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> Answer:
        """POST ``body`` on the event loop; raises what the client raises when there is no answer."""
        if self.transport == "aiohttp-native":
            try:
                async with self._client.post(
                    url, data=body, headers=headers, allow_redirects=False, timeout=aiohttp.ClientTimeout(total=timeout)
                ) as response:
                    content, truncated = await _read_capped(response.content.iter_chunked(64 * 1024))
                    return response.status, response.headers, content, truncated
            except TimeoutError:
                raise httpx.ReadTimeout("no answer") from None  # as the httpx transports say it
        request = self._client.build_request("POST", url, content=body, headers=headers, timeout=timeout)
        response = await self._client.send(request, stream=True)
        try:
            content, truncated = await _read_capped(response.aiter_bytes())
        finally:
            await response.aclose()
        return response.status_code, response.headers, content, truncated

    def post_sync(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> Answer:
        """POST ``body`` from a pool thread; raises what the client raises when there is no answer."""
        with self._client.stream("POST", url, content=body, headers=headers, timeout=timeout) as response:
            content, truncated = _read_capped_sync(response.iter_bytes())
        return response.status_code, response.headers, content, truncated

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._client.close()
            return
        if self._loop is not None:
            self._loop.stop(self._client.close() if self.transport == "aiohttp-native" else self._client.aclose())
