"""A local HTTP sink on 127.0.0.1 (real sockets) that records every request.

It runs an aiohttp server on its own thread. ``script`` decides the answer per
request: a function of (idempotency key, attempt number for that key, body)
returning (status, headers, body bytes) — or None for 200 with a JSON ack.
"""

import asyncio
import json
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Answer = tuple[int, dict[str, str], bytes]
Script = Callable[[str, int, Any], "Answer | None"]


@dataclass
class Received:
    key: str
    body: Any
    headers: dict[str, str]


@dataclass
class HttpSink:
    script: Script | None = None
    delay_s: float = 0.0
    received: list[Received] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    url: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> "HttpSink":
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def handle(request: web.Request) -> web.StreamResponse:
            raw = await request.read()
            try:
                body: Any = json.loads(raw) if raw else None
            except ValueError:
                body = raw
            key = request.headers.get("Idempotency-Key", "")
            with self._lock:
                self.counts[key] += 1
                attempt = self.counts[key]
                self.received.append(Received(key, body, dict(request.headers)))
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            answer = self.script(key, attempt, body) if self.script else None
            if answer is None:
                return web.json_response({"status": "accepted", "id": f"ref-{key}"})
            status, headers, payload = answer
            return web.Response(status=status, headers=headers, body=payload)

        async def serve() -> None:
            app = web.Application(client_max_size=8 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", handle)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.url = f"http://127.0.0.1:{port}/"
            ready.set()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(serve())
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="http-sink", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("HTTP sink did not start")
        return self

    def stop(self) -> None:
        async def shutdown() -> None:
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def keys(self) -> list[str]:
        with self._lock:
            return [r.key for r in self.received]
