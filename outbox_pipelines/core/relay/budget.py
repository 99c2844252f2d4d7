"""What one relay invocation may spend: a time budget, an entry budget, one drain, until a stop request."""

import math
import time
from dataclasses import dataclass

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.relay.stop import StopReason, StopRequest


def check_budget(max_seconds: float | None, max_entries: int | None = None) -> None:
    """ConfigError for a budget that would never end or means nothing (nan, inf, negative): a relay refuses it
    at start instead of running unbounded (``nan`` compares false with every time, so it never ran out)."""
    if max_seconds is not None and (
        isinstance(max_seconds, bool)
        or not isinstance(max_seconds, int | float)
        or not math.isfinite(max_seconds)
        or max_seconds < 0
    ):
        raise ConfigError(
            f"the time budget (--max-seconds, max_seconds) must be a finite number of seconds, 0 or more; "
            f"got {max_seconds!r}"
        )
    if max_entries is not None and (
        isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1
    ):
        raise ConfigError(
            f"the entry budget (--max-entries, max_entries) must be a whole number, 1 or more; got {max_entries!r}"
        )


@dataclass(frozen=True)
class Budget:
    deadline: float | None  # time.monotonic() at which the time budget is used; None: no time budget
    max_entries: int | None  # claims allowed in all; None: no entry budget
    once: bool  # drain what is ready now, then end
    stop: StopRequest  # requested by a SIGTERM or Dagster's termination (relay/stop.py)

    @classmethod
    def starting_now(
        cls, stop: StopRequest, *, max_seconds: float | None = None, max_entries: int | None = None, once: bool = False
    ) -> "Budget":
        check_budget(max_seconds, max_entries)
        deadline = time.monotonic() + max_seconds if max_seconds is not None else None
        return cls(deadline, max_entries, once, stop)

    @property
    def stop_requested(self) -> bool:
        return self.stop.requested

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def time_left(self) -> float:
        return float("inf") if self.deadline is None else max(self.deadline - time.monotonic(), 0.0)

    def used_up(self, claimed: int) -> str | None:
        """Why the time or entry budget ends the invocation now, or None."""
        if self.out_of_time():
            return StopReason.TIME_BUDGET
        if self.max_entries is not None and claimed >= self.max_entries:
            return StopReason.ENTRY_BUDGET
        return None

    def claim_limit(self, batch_size: int, claimed: int) -> int:
        """How many messages the next claim may take: none once stopped or out of time."""
        if self.stop_requested or self.out_of_time():
            return 0
        if self.max_entries is None:
            return batch_size
        return min(batch_size, self.max_entries - claimed)
