"""A local HTTP broker that executes each idempotency key once, with fault injection.

Used by the demo, drills, tests and soaks. A repeated key answers 409 "already processed" with the original
result; faults are chosen per key and attempt, so runs are repeatable. Control endpoints: ``CONTROL_HELP``;
options: ``python -m outbox_pipelines.orders.broker_sim --help``.
"""

import argparse
import asyncio
import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from aiohttp import web

# Re-exported: the simulator is used as `from outbox_pipelines.orders.broker_sim import BrokerSim, Faults`.
from outbox_pipelines.orders.broker_faults import CONTROL_HELP as CONTROL_HELP
from outbox_pipelines.orders.broker_faults import Faults as Faults
from outbox_pipelines.orders.broker_faults import add_fault_options, faults_from_args


class BrokerSim:
    def __init__(self, faults: Faults | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.faults = faults or Faults()
        self.host, self.port = host, port
        self.attempts: Counter[str] = Counter()
        self.executed: dict[str, dict[str, Any]] = {}
        self.requests = 0
        # Requests for a key already executed (answered 409): duplicate deliveries.
        self.repeats = 0
        self.repeated_keys: set[str] = set()
        self.answers: Counter[str] = Counter()
        self.started_at = time.time()
        self.first_request_at: float | None = None
        self.first_executed_at: float | None = None
        self.last_request_at: float | None = None
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

    def _answer(self, kind: str) -> None:
        with self._lock:
            self.answers[kind] += 1

    def _repeat(self, key: str) -> None:
        with self._lock:
            self.repeats += 1
            self.repeated_keys.add(key)
            self.answers["409"] += 1

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        key = request.headers.get("Idempotency-Key", "")
        now = time.time()
        with self._lock:
            self.requests += 1
            self.attempts[key] += 1
            attempt, nth = self.attempts[key], self.requests
            already = self.executed.get(key)
            if self.first_request_at is None:
                self.first_request_at = now
            self.last_request_at = now
        if not key:
            self._answer("400")
            return web.json_response({"error": "missing Idempotency-Key"}, status=400)
        try:
            json.loads(raw) if raw else None
        except ValueError:
            self._answer("400")
            return web.json_response({"error": "body is not JSON"}, status=400)
        if already is not None:
            self._repeat(key)
            return web.json_response({**already, "status": "already_processed"}, status=409)
        fault = self._fault(key, attempt, nth)
        if fault == "bad":
            self._answer("400")
            return web.json_response({"error": "invalid order"}, status=400)
        if fault == "drop":
            self._answer("dropped")
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=500)
        if fault == "hang":
            self._answer("hung")
            await asyncio.sleep(self.faults.hang_s)
        elif fault == "429":
            self._answer("429")
            retry_after = self.faults.rate_limited_keys.get(key, self.faults.retry_after_s)
            return web.json_response({"error": "rate limited"}, status=429, headers={"Retry-After": f"{retry_after:g}"})
        elif fault == "503":
            self._answer("503")
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
            if first is result:
                self.answers["201"] += 1
                if self.first_executed_at is None:
                    self.first_executed_at = time.time()
        if first is not result:
            self._repeat(key)  # a concurrent request for the same key executed it first
            return web.json_response({**first, "status": "already_processed"}, status=409)
        return web.json_response(first, status=201)

    # -- control -------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": self.requests,
                "executed": len(self.executed),
                "repeats": self.repeats,
                "keys_repeated": len(self.repeated_keys),
                "answers": dict(self.answers),
                "started_at": self.started_at,
                "first_request_at": self.first_request_at,
                "first_executed_at": self.first_executed_at,
                "last_request_at": self.last_request_at,
                "faults": self.faults.as_json(),
            }

    async def _stats(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self.stats())

    async def _executed(self, request: web.Request) -> web.StreamResponse:
        with self._lock:
            keys = list(self.executed)
        return web.json_response({"keys": keys})

    async def _set_faults(self, request: web.Request) -> web.StreamResponse:
        try:
            changes = await request.json()
            if not isinstance(changes, dict):
                raise TypeError("send a JSON object of fault fields")
            self.faults.update(changes)
        except (TypeError, ValueError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response(self.faults.as_json())

    def app(self) -> web.Application:
        app = web.Application(client_max_size=4 * 1024 * 1024)
        # The control endpoints first: every other path is an order.
        app.router.add_get("/_stats", self._stats)
        app.router.add_get("/_executed", self._executed)
        app.router.add_post("/_faults", self._set_faults)
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


# -- standalone: python -m outbox_pipelines.orders.broker_sim ---------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The simulator's options (the same as ``outbox-pipelines broker-sim``), with the control endpoints."""
    parser = argparse.ArgumentParser(
        prog="python -m outbox_pipelines.orders.broker_sim",
        description="A local broker that executes each idempotency key once, with fault injection. "
        "A repeated key answers 409 'already processed' with the original result.",
        epilog=CONTROL_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_fault_options(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    faults = faults_from_args(args)
    sim = BrokerSim(faults, host=args.host, port=args.port)
    print(
        f"broker simulator on http://{args.host}:{args.port}/orders (any path works; GET /_stats, POST /_faults; "
        f"Ctrl-C stops it); faults: {faults.describe()}",
        flush=True,
    )
    web.run_app(sim.app(), host=args.host, port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
