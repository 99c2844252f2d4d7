"""Per-client rate limit: a token bucket per client, in memory (one API process)."""

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable


class RateLimiter:
    """``per_minute`` requests per client, with bursts up to the same number.

    ``allow(client)`` returns 0 when allowed, else the seconds to wait (for
    Retry-After). The number of clients tracked is bounded (least recent first out).
    """

    def __init__(self, per_minute: int, *, max_clients: int = 100_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0
        self.max_clients = max_clients
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def allow(self, client: str) -> int:
        if self.capacity <= 0:
            return 0
        now = self.clock()
        with self._lock:
            tokens, last = self._buckets.pop(client, (self.capacity, now))
            tokens = min(self.capacity, tokens + (now - last) * self.rate)
            if tokens >= 1.0:
                self._buckets[client] = (tokens - 1.0, now)
                wait = 0
            else:
                self._buckets[client] = (tokens, now)
                wait = max(1, math.ceil((1.0 - tokens) / self.rate))
            while len(self._buckets) > self.max_clients:
                self._buckets.popitem(last=False)
        return wait
