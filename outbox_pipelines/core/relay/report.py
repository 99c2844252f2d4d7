"""What a relay invocation did: its report, each batch's counts, and the delivery-lag sample."""

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

T = TypeVar("T")


class RunOutcome(StrEnum):
    """What a relay's (or a relay group's) time amounted to, in one word: its run's ``outbox/outcome`` tag."""

    DESTINATION_FAILING = "destination_failing"
    DEAD_LETTERS = "dead_letters"
    TABLE_PROBLEMS = "table_problems"
    DELIVERED = "delivered"
    IDLE = "idle"


class LagSample:
    """A bounded uniform sample (reservoir) of created → delivered seconds, for percentiles.

    Once full, the next value to keep is drawn ahead (Li's "Algorithm L"): the values in between are only
    counted, so a relay pays for a random draw per kept value, not per message.
    """

    def __init__(self, capacity: int = 20_000, rng: random.Random | None = None) -> None:
        self.capacity, self.count = capacity, 0
        self.values: list[float] = []
        self._rng = rng or random.Random(7)
        self._weight = 1.0
        self._next_kept = 0  # the count at which the next value replaces a random one (when full)

    def add(self, value: float) -> None:
        self.add_each((value,), float)

    def add_each(self, items: Sequence[T], value_of: Callable[[T], float]) -> None:
        """Add ``value_of(item)`` for each item; once the sample is full, only the values kept are computed."""
        room = self.capacity - len(self.values)
        if room > 0:
            head = items[:room]
            self.values.extend(map(value_of, head))
            self.count += len(head)
            if len(self.values) < self.capacity:
                return
            items = items[room:]
            if self._next_kept == 0:
                self._draw_next_kept()
        start, end = self.count, self.count + len(items)
        while self._next_kept <= end:
            self.values[self._rng.randrange(self.capacity)] = value_of(items[self._next_kept - start - 1])
            self._draw_next_kept()
        self.count = end

    def _draw_next_kept(self) -> None:
        self._weight *= math.exp(math.log(self._uniform()) / self.capacity)
        skip = math.floor(math.log(self._uniform()) / math.log1p(-self._weight)) if self._weight < 1.0 else 0
        self._next_kept = max(self._next_kept, self.count) + skip + 1

    def _uniform(self) -> float:
        """In (0, 1): a logarithm is taken."""
        return self._rng.random() or 5e-324

    def percentiles(self) -> dict[str, float | None]:
        ordered = sorted(self.values)

        def at(q: float) -> float | None:
            return ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else None

        return {
            "lag_p50_s": at(0.50),
            "lag_p95_s": at(0.95),
            "lag_p99_s": at(0.99),
            "lag_max_s": ordered[-1] if ordered else None,
        }


def by_code(counts: dict[str, int]) -> str:
    """``CODE=n, ...`` in code order ('' when empty), as reports and run metadata show counts by code."""
    return ", ".join(f"{code}={n}" for code, n in sorted(counts.items()))


@dataclass
class BatchCounts:
    """How one settled batch ended, counted as it is settled and added to the report in one step."""

    sent: int = 0
    retried: int = 0
    dead: int = 0
    conflicts: int = 0
    dedup_hits: int = 0
    rate_limited: int = 0
    dead_by_code: dict[str, int] = field(default_factory=dict)
    # Only for the batch's log line beyond the retries logged one by one (counting.LOGGED_PER_BATCH).
    retried_by_code: dict[str, int] = field(default_factory=dict)
    destination_failures: dict[str, int] = field(default_factory=dict)
    # The longest Retry-After among the batch's throttled messages: the whole table waits that long.
    slow_down_s: float = 0.0


@dataclass
class RelayReport:
    table: str
    worker: str
    claimed: int = 0
    sent: int = 0
    retried: int = 0
    dead: int = 0
    conflicts: int = 0
    dedup_hits: int = 0
    requeued: int = 0
    batches: int = 0
    # claim = "auto": batches whose dispatch outlasted `hold`, so their leases were written.
    leased_after_hold: int = 0
    db_errors: int = 0
    rate_limited: int = 0
    seconds: float = 0.0
    lock_held: bool = True
    stopped_because: str = ""
    dead_by_code: dict[str, int] = field(default_factory=dict)
    # Deliveries that failed because the destination did (timeouts, 5xx, 401), by code.
    destination_failures: dict[str, int] = field(default_factory=dict)
    # created → delivered of the messages this relay delivered.
    lag: LagSample = field(default_factory=lambda: LagSample())
    # The table's circuit breaker as this relay last saw it, and the probes it sent while open.
    circuit: str = "closed"
    probes: int = 0

    @property
    def settled(self) -> int:
        return self.sent + self.retried + self.dead

    @property
    def throughput(self) -> float:
        return self.settled / self.seconds if self.seconds > 0 else 0.0

    @property
    def outcome(self) -> RunOutcome:
        """What this relay's time amounted to, in one word (Dagster tags runs with it)."""
        if self.destination_failures and not self.sent:
            return RunOutcome.DESTINATION_FAILING
        if self.dead:
            return RunOutcome.DEAD_LETTERS
        if self.sent:
            return RunOutcome.DELIVERED
        return RunOutcome.IDLE

    def progress_line(self) -> str:
        """The running counts, as the CLI's progress and the Dagster run log show them."""
        return (
            f"sent {self.sent}, retried {self.retried}, dead {self.dead}, conflicts {self.conflicts} "
            f"({self.throughput:.0f} msg/s)"
        )

    def add_batch(self, counts: BatchCounts) -> None:
        self.batches += 1
        self.sent += counts.sent
        self.retried += counts.retried
        self.dead += counts.dead
        self.conflicts += counts.conflicts
        self.dedup_hits += counts.dedup_hits
        self.rate_limited += counts.rate_limited
        for code, n in counts.dead_by_code.items():
            self.dead_by_code[code] = self.dead_by_code.get(code, 0) + n
        for code, n in counts.destination_failures.items():
            self.destination_failures[code] = self.destination_failures.get(code, 0) + n

    def merge(self, other: "RelayReport") -> None:
        """Add another invocation of the same table's relay (a relay group's activations): counts, seconds and
        lag add up; the circuit and the stop reason are the latest's."""
        for name in (
            "claimed",
            "sent",
            "retried",
            "dead",
            "conflicts",
            "dedup_hits",
            "requeued",
            "batches",
            "leased_after_hold",
            "db_errors",
            "rate_limited",
            "probes",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.seconds += other.seconds
        for mine, theirs in (
            (self.dead_by_code, other.dead_by_code),
            (self.destination_failures, other.destination_failures),
        ):
            for code, n in theirs.items():
                mine[code] = mine.get(code, 0) + n
        self.lag.add_each(other.lag.values, float)
        self.circuit, self.stopped_because, self.lock_held = other.circuit, other.stopped_because, other.lock_held

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("lag")
        data.update(self.lag.percentiles())
        data["outcome"] = self.outcome
        data["throughput_per_s"] = round(self.throughput, 1)
        return data
