"""An asyncio event loop on a thread of its own, for destinations whose client library is asyncio
(aiohttp, nats-py, aio-pika) while the relay that calls them is synchronous."""

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """One private loop: ``run`` submits a coroutine and waits for its result; ``stop`` ends the loop."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

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
