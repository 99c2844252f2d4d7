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

    def __init__(
        self, per_minute: int, *, max_clients: int = 100_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
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


class FailureLimiter:
    """Failed authentications per client address: at most ``per_minute`` of them, leaking away evenly.

    ``blocked(client)`` (0, or the seconds to wait) is asked BEFORE the token is
    looked at, so a client over the limit learns nothing and costs nothing, right
    token or not; ``failed(client)`` counts one failure. A blocked request adds no
    failure (the block ends on time whatever the client keeps sending).
    """

    def __init__(
        self, per_minute: int, *, max_clients: int = 100_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit = float(per_minute)
        self.rate = per_minute / 60.0
        self.max_clients = max_clients
        self.clock = clock
        self._levels: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def _level(self, client: str, now: float) -> float:
        level, last = self._levels.get(client, (0.0, now))
        return max(0.0, level - (now - last) * self.rate)

    def blocked(self, client: str) -> int:
        if self.limit <= 0:
            return 0
        now = self.clock()
        with self._lock:
            if client not in self._levels:
                return 0
            level = self._level(client, now)
        if level + 1.0 <= self.limit:
            return 0
        return max(1, math.ceil((level + 1.0 - self.limit) / self.rate))

    def failed(self, client: str) -> None:
        if self.limit <= 0:
            return
        now = self.clock()
        with self._lock:
            level = self._level(client, now)
            self._levels.pop(client, None)
            self._levels[client] = (level + 1.0, now)
            while len(self._levels) > self.max_clients:
                self._levels.popitem(last=False)
