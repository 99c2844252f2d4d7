"""An asyncio event loop on a thread of its own, for destinations whose client library is asyncio
(aiohttp, nats-py, aiormq) while the relay that calls them is synchronous."""

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

T = TypeVar("T")


def backstop_s(timeout_s: float) -> float:
    """How long a broker's batch may take before ``run_within`` gives up on it: its waits inside are each
    bounded by the table's timeout (connect, acks), so this only guards against a stuck loop."""
    return 3 * timeout_s + 10


class LoopThread:
    """One private loop: ``run`` submits a coroutine and waits for its result; ``stop`` ends the loop."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def run_within(self, coro: Coroutine[Any, Any, T], timeout: float) -> T | None:
        """``run``, but None when no result came within ``timeout`` (the coroutine is then cancelled)."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout=timeout)
        except FutureTimeout:
            future.cancel()
            return None

    def stop(self, closing: Coroutine[Any, Any, Any] | None = None, timeout: float = 5.0) -> None:
        """Run ``closing`` (the client's close) if given, then stop the loop and join its thread."""
        if not self.loop.is_running():
            if closing is not None:
                closing.close()
            return
        try:
            if closing is not None:
                self.run(closing, timeout)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=timeout)
            self.loop.close()
