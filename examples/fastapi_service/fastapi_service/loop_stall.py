"""How late the event loop runs: a task sleeps 10 ms at a time and records by how much each sleep overran.

A synchronous call on the loop (a blocking driver, CPU work in a handler) shows up as a stall. So does a host
too busy to give the process a CPU when it is ready to run; on Linux the thread's wait in the kernel's run
queue (``/proc/thread-self/schedstat``) is measured too, and taken off, so that ``worst_stall_own_ms`` is what
the process did itself (to within the 10 ms tick), whatever else the host runs.
"""

import asyncio
import time
from typing import Any

SCHEDSTAT = "/proc/thread-self/schedstat"  # cpu time, run-queue wait, time slices (ns); Linux only


def run_queue_wait_s() -> float:
    """How long this thread has waited for a CPU while ready to run, in all (0.0 where the kernel does not say)."""
    try:
        with open(SCHEDSTAT) as stats:
            return int(stats.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


class LoopStallMonitor:
    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self.reset()

    def reset(self) -> None:
        self.worst_s = self.worst_own_s = 0.0
        self.ticks = 0
        self.since = time.monotonic()

    async def run(self) -> None:
        """Runs on the loop's thread until cancelled (the app's lifespan starts and stops it)."""
        while True:
            waited = run_queue_wait_s()
            started = time.perf_counter()
            await asyncio.sleep(self.interval_s)
            late = time.perf_counter() - started - self.interval_s
            queued = run_queue_wait_s() - waited
            self.ticks += 1
            self.worst_s = max(self.worst_s, late)
            self.worst_own_s = max(self.worst_own_s, late - queued)

    def report(self) -> dict[str, Any]:
        return {
            "worst_stall_ms": round(self.worst_s * 1000, 2),  # as the clock saw it
            "worst_stall_own_ms": round(self.worst_own_s * 1000, 2),  # less the waits for a CPU
            "ticks": self.ticks,
            "window_s": round(time.monotonic() - self.since, 2),
        }
