"""A local HTTP sink on 127.0.0.1 (real sockets) that records every request.

It runs an aiohttp server on its own thread. ``script`` decides the answer per
request: a function of (idempotency key, attempt number for that key, body)
returning (status, headers, body bytes) — or None for 200 with a JSON ack.
"""

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from outbox_pipelines.orders.broker_sim import BackgroundServer

Answer = tuple[int, dict[str, str], bytes]
Script = Callable[[str, int, Any], "Answer | None"]


@dataclass
class Received:
    key: str
    body: Any
    headers: dict[str, str]
    status: int = 200  # what the sink answered
    started: float = 0.0  # time.monotonic() when the request arrived, and when its answer was ready
    ended: float = 0.0


@dataclass
class HttpSink:
    script: Script | None = None
    delay_s: float = 0.0
    received: list[Received] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    url: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> "HttpSink":
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
                received = Received(key, body, dict(request.headers), started=time.monotonic())
                self.received.append(received)
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            answer = self.script(key, attempt, body) if self.script else None
            received.ended = time.monotonic()
            if answer is None:
                return web.json_response({"status": "accepted", "id": f"ref-{key}"})
            status, headers, payload = answer
            received.status = status
            return web.Response(status=status, headers=headers, body=payload)

        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", handle)
        self._server = BackgroundServer(app)
        self.url = self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def keys(self) -> list[str]:
        with self._lock:
            return [r.key for r in self.received]
