"""What the relay and the enqueue count, kept in plain Python until a scrape reads it (telemetry/metrics.py).

prometheus_client is imported only by the process that exposes the counts (its import costs a relay's start
~10 ms and pulls in http.server): these families mirror its Counter, Gauge and Histogram, names and all.
"""

import bisect
import collections
import contextlib
import hashlib
import math
import operator
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from outbox_pipelines.core.models import OutcomeKind

# Label values that come from messages are bounded: a table's first TOPIC_LIMIT topics (and
# TENANT_LIMIT tenants) get series of their own, later ones share "other", so a producer that
# puts ids into topics cannot blow up Prometheus.
TOPIC_LIMIT = 50
TENANT_LIMIT = 50
TENANT_LABEL_ENV = "OUTBOX_TENANT_LABEL"  # plain (default) | hash | off (tenants may be masked)


class BoundedLabels:
    """Remembers up to ``limit`` values per scope; the rest become ``other``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def __call__(self, scope: str, value: str) -> str:
        with self._lock:
            seen = self._seen.setdefault(scope, set())
            if value in seen:
                return value
            if len(seen) < self.limit:
                seen.add(value)
                return value
        return "other"


_topics = BoundedLabels(TOPIC_LIMIT)
_tenants = BoundedLabels(TENANT_LIMIT)


def topic_label(table_name: str, topic: str) -> str:
    return _topics(table_name, topic)


def tenant_label(table_name: str, tenant: str | None) -> str:
    """The tenant as metrics and logs show it: plain, hashed, or left out (OUTBOX_TENANT_LABEL)."""
    if not tenant:
        return ""
    mode = (os.environ.get(TENANT_LABEL_ENV) or "plain").lower()
    if mode == "off":
        return ""
    if mode == "hash":
        tenant = "t-" + hashlib.sha256(tenant.encode()).hexdigest()[:10]
    return _tenants(table_name, tenant)


class Family:
    """One metric: its name as prometheus_client's class would take it, its help, its label names, and one
    child per label values (made on first use, with its creation time, as prometheus_client's)."""

    kind = ""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, tuple(labelnames)
        self._children: dict[tuple[str, ...], Any] = {}
        self._lock = threading.Lock()

    def labels(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            with self._lock:
                child = self._children.setdefault(values, self._child())
        return child

    def children(self) -> list[tuple[tuple[str, ...], Any]]:
        with self._lock:
            return sorted(self._children.items())

    def _child(self) -> Any:
        raise NotImplementedError


class CounterChild:
    __slots__ = ("created", "value", "_lock")

    def __init__(self) -> None:
        self.value, self.created, self._lock = 0.0, time.time(), threading.Lock()

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value += amount


class CounterFamily(Family):
    kind = "counter"

    def _child(self) -> CounterChild:
        return CounterChild()


class GaugeChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = float(value)


class GaugeFamily(Family):
    kind = "gauge"

    def _child(self) -> GaugeChild:
        return GaugeChild()


class HistogramChild:
    """Counts per bucket (not cumulative: a value goes to the first bound it does not pass, +Inf last) and
    their sum, as prometheus_client's Histogram keeps them."""

    __slots__ = ("bounds", "buckets", "created", "sum", "_lock")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds, self.buckets = bounds, [0] * len(bounds)
        self.sum, self.created, self._lock = 0.0, time.time(), threading.Lock()

    def observe(self, value: float) -> None:
        self.observe_repeated(value, 1)

    def observe_repeated(self, value: float, times: int) -> None:
        """``times`` observations of ``value`` in one step (a batch of 1,000 shares one value)."""
        at = bisect.bisect_left(self.bounds, value)
        with self._lock:
            self.sum += value * times
            self.buckets[at] += times

    def observe_many(self, values: Sequence[float]) -> None:
        """Each of ``values`` observed: sorted once (in C), each bucket's count is two bisections."""
        if not values:
            return
        ordered, below, added = sorted(values), 0, []
        for bound in self.bounds:
            upto = bisect.bisect_right(ordered, bound)
            added.append(upto - below)
            below = upto
        with self._lock:
            self.sum += sum(values)
            self.buckets = [n + more for n, more in zip(self.buckets, added, strict=True)]

    @contextlib.contextmanager
    def time(self) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.observe(time.perf_counter() - started)


class HistogramFamily(Family):
    kind = "histogram"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]) -> None:
        super().__init__(name, documentation, labelnames)
        self.bounds = (*sorted(float(b) for b in buckets if b != math.inf), math.inf)

    def _child(self) -> HistogramChild:
        return HistogramChild(self.bounds)


DEQUEUED = CounterFamily(
    "outbox_dequeue_total",
    "Claims: messages claimed (result=success), claims that found nothing ready (result=empty)",
    ["table", "result"],
)
DISPATCHED = CounterFamily(
    "outbox_dispatch_total",
    "Messages settled, by result: success, conflict_processed (409 already processed), "
    "dedup, retry, dead, conflict (lease lost)",
    ["table", "topic", "tenant", "result"],
)
DEAD = CounterFamily("outbox_dead_total", "Messages that went to dead", ["table", "topic"])
DISPATCH_LATENCY = HistogramFamily(
    "outbox_dispatch_latency_seconds",
    "Claim to settled of one message, by result",
    ["table", "topic", "result"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
RETRY_COUNT = HistogramFamily(
    "outbox_retry_count",
    "Attempts a message had used when it was settled",
    ["table"],
    buckets=(1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 25, 50),
)
DELIVERY_LATENCY = HistogramFamily(
    "outbox_delivery_latency_seconds",
    "Created (the enqueuing transaction's start) to settled as delivered, by destination kind",
    ["table", "destination"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)
_STATEMENT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
CLAIM_DURATION = HistogramFamily("outbox_claim_duration_seconds", "One claim statement", ["table"], _STATEMENT_BUCKETS)
SETTLE_DURATION = HistogramFamily("outbox_settle_duration_seconds", "One batch's settle", ["table"], _STATEMENT_BUCKETS)
DESTINATION_INFO = GaugeFamily(
    "outbox_destination_info", "1 for the destination kind a relay delivers the table to", ["table", "destination"]
)
# OpenTelemetry's messaging metrics (messaging.client.sent.messages, messaging.client.operation.duration) under
# their Prometheus names; the table stands for the destination name, which may hold ids (a subject, a URL path).
SENT_MESSAGES = CounterFamily(
    "messaging_client_sent_messages",
    "Messages the relay handed to the destination; error_type: the outcome code of those not delivered",
    ["messaging_system", "messaging_operation_name", "table", "error_type"],
)
OPERATION_DURATION = HistogramFamily(
    "messaging_client_operation_duration_seconds",
    "One call to the destination (a batch)",
    ["messaging_system", "messaging_operation_name", "table"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10),
)
# In the order a scrape shows them.
FAMILIES: tuple[Family, ...] = (
    DEQUEUED,
    DISPATCHED,
    DEAD,
    DISPATCH_LATENCY,
    RETRY_COUNT,
    DELIVERY_LATENCY,
    CLAIM_DURATION,
    SETTLE_DURATION,
    DESTINATION_INFO,
    SENT_MESSAGES,
    OPERATION_DURATION,
)


class EnqueueCounts:
    """outbox_enqueue_total{table,topic}: the messages this process enqueued, added up in a dict under a lock
    (a labelled Counter's increment costs 5.5 µs inside the application's transaction, this about 2.5 µs)."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        # The bounded label of each (table, topic) as the application names them, so that a one-row
        # enqueue does not bound its label again; bounded itself: past the limit, looked up each time.
        self._labels: dict[tuple[str, str], tuple[str, str]] = {}

    def add(self, table_name: str, topic: str, count: int = 1) -> None:
        key = self._labels.get((table_name, topic))
        if key is None:
            key = (table_name, topic_label(table_name, topic))
            if len(self._labels) < TOPIC_LIMIT * 4:
                self._labels[(table_name, topic)] = key
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + count

    def counts(self) -> list[tuple[tuple[str, str], int]]:
        with self._lock:
            return sorted(self._counts.items())


ENQUEUED = EnqueueCounts()


def count_enqueued_one(table_name: str, topic: str) -> None:
    """``count_enqueued`` for one message."""
    ENQUEUED.add(table_name, topic)


def count_enqueued(table_name: str, topics: Iterable[str]) -> None:
    """outbox_enqueue_total{table,topic}: one add per topic of the statement."""
    for topic, n in collections.Counter(topics).items():
        ENQUEUED.add(table_name, topic, n)


def count_claim(table_name: str, claimed: int) -> None:
    if claimed:
        DEQUEUED.labels(table_name, "success").inc(claimed)
    else:
        DEQUEUED.labels(table_name, "empty").inc()


_TOPIC_AND_TENANT = operator.attrgetter("topic", "tenant_id")
_ATTEMPTS = operator.attrgetter("attempts")


class BatchTally:
    """A settled batch's counters, added once per label set (per-message label lookups cost too much)."""

    def __init__(self, table_name: str) -> None:
        self.table_name = table_name
        self._counts: dict[tuple[str, str, str], int] = {}
        # Observations as value -> how many times (a batch repeats the same values).
        self._latency: dict[tuple[str, str], dict[float, int]] = {}
        self._attempts: dict[int, int] = {}
        # A batch has few distinct topics and tenants: label each once, not once per message.
        self._labels: dict[tuple[str, str | None], tuple[str, str]] = {}

    def add(self, message: Any, result: str, in_dispatch_s: float | None, *, final: bool = False) -> None:
        self._add(message.topic, message.tenant_id, result, in_dispatch_s, 1)
        if final:
            self._attempts[message.attempts] = self._attempts.get(message.attempts, 0) + 1

    def add_all(self, messages: Sequence[Any], result: str, in_dispatch_s: float | None) -> None:
        """``add(message, result, in_dispatch_s, final=True)`` for each message, counted in one pass."""
        for (topic, tenant_id), n in collections.Counter(map(_TOPIC_AND_TENANT, messages)).items():
            self._add(topic, tenant_id, result, in_dispatch_s, n)
        for attempts, n in collections.Counter(map(_ATTEMPTS, messages)).items():
            self._attempts[attempts] = self._attempts.get(attempts, 0) + n

    def _add(self, topic_name: str, tenant_id: str | None, result: str, in_dispatch_s: float | None, n: int) -> None:
        labels = self._labels.get((topic_name, tenant_id))
        if labels is None:
            labels = (topic_label(self.table_name, topic_name), tenant_label(self.table_name, tenant_id))
            self._labels[(topic_name, tenant_id)] = labels
        topic, tenant = labels
        key = (topic, tenant, result)
        self._counts[key] = self._counts.get(key, 0) + n
        if in_dispatch_s is not None:
            # A batch is claimed and settled at one instant each: its messages share one value.
            values = self._latency.setdefault((topic, result), {})
            values[in_dispatch_s] = values.get(in_dispatch_s, 0) + n

    def flush(self) -> None:
        for (topic, tenant, result), n in self._counts.items():
            DISPATCHED.labels(self.table_name, topic, tenant, result).inc(n)
            if result == OutcomeKind.DEAD:
                DEAD.labels(self.table_name, topic).inc(n)
        for (topic, result), values in self._latency.items():
            child = DISPATCH_LATENCY.labels(self.table_name, topic, result)
            for value, times in values.items():
                child.observe_repeated(value, times)
        if self._attempts:
            child = RETRY_COUNT.labels(self.table_name)
            for attempts, times in self._attempts.items():
                child.observe_repeated(attempts, times)


_error_types = BoundedLabels(TOPIC_LIMIT)


class TableRelayMetrics:
    """A relay's metrics of its table bound once, each observed once per claim, settle or destination call;
    ``destination``: the destination's kind (its messaging_system)."""

    def __init__(self, table_name: str, destination: str) -> None:
        self.table_name, self.destination = table_name, destination
        self.claim: HistogramChild = CLAIM_DURATION.labels(table_name)
        self.settle: HistogramChild = SETTLE_DURATION.labels(table_name)
        self.operation: HistogramChild = OPERATION_DURATION.labels(destination, "send", table_name)
        self.delivery: HistogramChild = DELIVERY_LATENCY.labels(table_name, destination)
        self._sent: CounterChild = SENT_MESSAGES.labels(destination, "send", table_name, "")
        DESTINATION_INFO.labels(table_name, destination).set(1)

    def settled(self, delivered: int, latencies: Sequence[float], *failed_by_code: dict[str, int]) -> None:
        """A settled batch: how many were delivered and their latencies (created → settled, where known), the
        messages not delivered by outcome code."""
        self.delivery.observe_many(latencies)
        if delivered:
            self._sent.inc(delivered)
        for code, n in (item for counts in failed_by_code for item in counts.items()):
            error_type = _error_types(self.table_name, code)
            SENT_MESSAGES.labels(self.destination, "send", self.table_name, error_type).inc(n)
