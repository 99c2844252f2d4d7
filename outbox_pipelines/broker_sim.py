"""A local HTTP broker that executes each idempotency key once, with fault injection.

Used by the demo, drills and tests. A repeated key answers 409 "already
processed" with the original result, as a real idempotent broker would.
Faults are chosen per key and attempt, so runs are repeatable.
"""

import asyncio
import hashlib
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Faults:
    # The first N attempts of every key answer 503.
    fail_first: int = 0
    # Keys answered 503 on their first N attempts (per key).
    flaky_keys: dict[str, int] = field(default_factory=dict)
    # Keys answered 429 with Retry-After on their first attempt.
    rate_limited_keys: dict[str, float] = field(default_factory=dict)
    # Keys answered 400 (invalid order) every time.
    bad_keys: set[str] = field(default_factory=set)
    # Keys whose first attempt hangs past the client's timeout.
    slow_keys: dict[str, float] = field(default_factory=dict)
    # Keys whose first attempt has its connection dropped.
    drop_keys: set[str] = field(default_factory=set)
    # Every Nth request (1-based, over all keys) answers 503.
    every_nth_5xx: int = 0


class BrokerSim:
    def __init__(self, faults: Faults | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.faults = faults or Faults()
        self.host, self.port = host, port
        self.attempts: Counter = Counter()
        self.executed: dict[str, dict[str, Any]] = {}
        self.requests = 0
        self.url = ""
        self._lock = threading.Lock()

    def _answer(self, key: str, body: Any) -> web.StreamResponse | None:
        f = self.faults
        with self._lock:
            self.requests += 1
            self.attempts[key] += 1
            attempt = self.attempts[key]
            nth = self.requests
        if not key:
            return web.json_response({"error": "missing Idempotency-Key"}, status=400)
        if key in self.executed:
            return web.json_response({"status": "already_processed", **self.executed[key]}, status=409)
        if key in f.bad_keys:
            return web.json_response({"error": "invalid order"}, status=400)
        if key in f.rate_limited_keys and attempt == 1:
            return web.json_response({"error": "rate limited"}, status=429,
                                     headers={"Retry-After": f"{f.rate_limited_keys[key]:g}"})
        if attempt <= max(f.fail_first, f.flaky_keys.get(key, 0)):
            return web.json_response({"error": "broker unavailable"}, status=503)
        if f.every_nth_5xx and nth % f.every_nth_5xx == 0:
            return web.json_response({"error": "broker hiccup"}, status=503)
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        key = request.headers.get("Idempotency-Key", "")
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            return web.json_response({"error": "body is not JSON"}, status=400)
        if key in self.faults.drop_keys and self.attempts[key] == 0:
            self.attempts[key] += 1
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=500)
        if key in self.faults.slow_keys and self.attempts[key] == 0:
            self.attempts[key] += 1
            await asyncio.sleep(self.faults.slow_keys[key])
        answer = self._answer(key, body)
        if answer is not None:
            return answer
        result = {
            "broker_order_id": "brk-" + hashlib.sha256(key.encode()).hexdigest()[:16],
            "accepted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "status": "accepted",
            "fills": [],
            "idempotency_key": key,
        }
        with self._lock:
            self.executed.setdefault(key, result)
        return web.json_response(result, status=201)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=4 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    def start_in_thread(self) -> "BrokerSim":
        self._server = BackgroundServer(self.app(), self.host, self.port)
        self.url = self._server.start() + "orders"
        return self

    def stop(self) -> None:
        self._server.stop()


class BackgroundServer:
    """Serves an aiohttp app on its own event-loop thread (for the demo and tests)."""

    def __init__(self, app: web.Application, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app, self.host, self.port = app, host, port
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        """Start serving; return the base URL (ending in /)."""
        ready = threading.Event()
        bound: list[int] = []

        async def serve() -> None:
            self._runner = web.AppRunner(self.app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.host, self.port)
            await site.start()
            bound.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
            ready.set()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(serve())
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="http-server", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError(f"HTTP server on {self.host} did not start")
        return f"http://{self.host}:{bound[0]}/"

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
