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
    # Keys answered 429 with Retry-After (seconds) on their first attempt.
    rate_limited_keys: dict[str, float] = field(default_factory=dict)
    # Keys answered 400 (invalid order) every time.
    bad_keys: set[str] = field(default_factory=set)
    # Every Nth request (1-based, over all keys) gets the fault; 0 = never.
    every_nth_5xx: int = 0
    every_nth_429: int = 0
    retry_after_s: float = 1.0
    every_nth_timeout: int = 0
    hang_s: float = 10.0
    every_nth_drop: int = 0

    def describe(self) -> str:
        parts = [f"{name}={value}" for name, value in vars(self).items()
                 if value and name not in ("retry_after_s", "hang_s")]
        return ", ".join(parts) or "none"


class BrokerSim:
    def __init__(self, faults: Faults | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.faults = faults or Faults()
        self.host, self.port = host, port
        self.attempts: Counter = Counter()
        self.executed: dict[str, dict[str, Any]] = {}
        self.requests = 0
        self.url = ""
        self._lock = threading.Lock()

    def _fault(self, key: str, attempt: int, nth: int) -> str | None:
        """Which fault this request gets, if any (deterministic by key, attempt and request number)."""
        f = self.faults

        def every(n: int) -> bool:
            return bool(n) and nth % n == 0

        if key in f.bad_keys:
            return "bad"
        if every(f.every_nth_drop):
            return "drop"
        if every(f.every_nth_timeout):
            return "hang"
        if (key in f.rate_limited_keys and attempt == 1) or every(f.every_nth_429):
            return "429"
        if attempt <= max(f.fail_first, f.flaky_keys.get(key, 0)) or every(f.every_nth_5xx):
            return "503"
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        key = request.headers.get("Idempotency-Key", "")
        with self._lock:
            self.requests += 1
            self.attempts[key] += 1
            attempt, nth = self.attempts[key], self.requests
            already = self.executed.get(key)
        if not key:
            return web.json_response({"error": "missing Idempotency-Key"}, status=400)
        try:
            json.loads(raw) if raw else None
        except ValueError:
            return web.json_response({"error": "body is not JSON"}, status=400)
        if already is not None:
            return web.json_response({**already, "status": "already_processed"}, status=409)
        fault = self._fault(key, attempt, nth)
        if fault == "bad":
            return web.json_response({"error": "invalid order"}, status=400)
        if fault == "drop":
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=500)
        if fault == "hang":
            await asyncio.sleep(self.faults.hang_s)
        elif fault == "429":
            retry_after = self.faults.rate_limited_keys.get(key, self.faults.retry_after_s)
            return web.json_response({"error": "rate limited"}, status=429, headers={"Retry-After": f"{retry_after:g}"})
        elif fault == "503":
            return web.json_response({"error": "broker unavailable"}, status=503)
        result = {
            "broker_order_id": "brk-" + hashlib.sha256(key.encode()).hexdigest()[:16],
            "accepted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "status": "accepted",
            "fills": [],
            "idempotency_key": key,
        }
        with self._lock:
            first = self.executed.setdefault(key, result)
        return web.json_response(first, status=201 if first is result else 409)

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
