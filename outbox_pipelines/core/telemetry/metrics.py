"""Prometheus metrics with the seeds' names (docs/explanation/on-call.md, "Metrics").

Counters and histograms are updated where things happen; the per-table
gauges (pending, locked, lag) are read from the database when scraped.
"""

import bisect
import collections
import hashlib
import operator
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from outbox_pipelines.core.models import OutcomeKind

REGISTRY = CollectorRegistry(auto_describe=True)

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


DEQUEUED = Counter(
    "outbox_dequeue_total",
    "Claims: messages claimed (result=success), claims that found nothing ready (result=empty)",
    ["table", "result"],
    registry=REGISTRY,
)
DISPATCHED = Counter(
    "outbox_dispatch_total",
    "Messages settled, by result: success, conflict_processed (409 already processed), "
    "dedup, retry, dead, conflict (lease lost)",
    ["table", "topic", "tenant", "result"],
    registry=REGISTRY,
)
DEAD = Counter("outbox_dead_total", "Messages that went to dead", ["table", "topic"], registry=REGISTRY)
DISPATCH_LATENCY = Histogram(
    "outbox_dispatch_latency_seconds",
    "Claim to settled of one message, by result",
    ["table", "topic", "result"],
    registry=REGISTRY,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
RETRY_COUNT = Histogram(
    "outbox_retry_count",
    "Attempts a message had used when it was settled",
    ["table"],
    registry=REGISTRY,
    buckets=(1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 25, 50),
)
DELIVERY_LATENCY = Histogram(
    "outbox_delivery_latency_seconds",
    "Created (the enqueuing transaction's start) to settled as delivered, by destination kind",
    ["table", "destination"],
    registry=REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)
_STATEMENT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
CLAIM_DURATION = Histogram(
    "outbox_claim_duration_seconds", "One claim statement", ["table"], registry=REGISTRY, buckets=_STATEMENT_BUCKETS
)
SETTLE_DURATION = Histogram(
    "outbox_settle_duration_seconds", "One batch's settle", ["table"], registry=REGISTRY, buckets=_STATEMENT_BUCKETS
)
DESTINATION_INFO = Gauge(
    "outbox_destination_info",
    "1 for the destination kind a relay delivers the table to",
    ["table", "destination"],
    registry=REGISTRY,
)
# OpenTelemetry's messaging metrics (messaging.client.sent.messages, messaging.client.operation.duration) under
# their Prometheus names; the table stands for the destination name, which may hold ids (a subject, a URL path).
SENT_MESSAGES = Counter(
    "messaging_client_sent_messages",
    "Messages the relay handed to the destination; error_type: the outcome code of those not delivered",
    ["messaging_system", "messaging_operation_name", "table", "error_type"],
    registry=REGISTRY,
)
OPERATION_DURATION = Histogram(
    "messaging_client_operation_duration_seconds",
    "One call to the destination (a batch)",
    ["messaging_system", "messaging_operation_name", "table"],
    registry=REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10),
)


class EnqueueCounts(Collector):
    """outbox_enqueue_total{table,topic}: the messages this process enqueued, added up in a dict under a
    lock and read when scraped.

    Not a prometheus_client Counter: the one-row enqueue counts inside the application's transaction,
    after a round trip, where a Counter's labelled child costs 5.5 µs an increment (four calls before
    its lock) against about 2.5 µs for this (bench/results.md).
    """

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

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily("outbox_enqueue", "Messages enqueued", labels=["table", "topic"])
        with self._lock:
            counts = sorted(self._counts.items())
        for labels, count in counts:
            family.add_metric(labels, count)
        yield family


ENQUEUED = EnqueueCounts()
REGISTRY.register(ENQUEUED)


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


def observe_many(child: Any, values: Sequence[float]) -> None:
    """Each of ``values`` observed, the buckets and the sum added to once each (as ``observe_repeated``)."""
    bounds, buckets, total = (getattr(child, name, None) for name in ("_upper_bounds", "_buckets", "_sum"))
    if bounds is None or buckets is None or total is None:
        for value in values:
            child.observe(value)
        return
    if not values:
        return
    total.inc(sum(values))
    # Sorted once (in C), each bucket's count is two bisections: no Python step per value.
    ordered, below = sorted(values), 0
    for bound, bucket in zip(bounds, buckets, strict=True):
        upto = bisect.bisect_right(ordered, bound)
        if upto > below:
            bucket.inc(upto - below)
            below = upto


def observe_repeated(child: Any, value: float, times: int) -> None:
    """``times`` observations of ``value`` in one step (the relay's batch of 1,000 otherwise spends as long
    in Histogram.observe as in its settle statement). prometheus_client has no bulk observe: this adds to
    the sum and to the first bucket the value fits, as ``observe`` does, and falls back to ``observe``
    should a version of the library keep its histogram otherwise."""
    bounds, buckets, total = (getattr(child, name, None) for name in ("_upper_bounds", "_buckets", "_sum"))
    if bounds is None or buckets is None or total is None or times == 1:
        for _ in range(times):
            child.observe(value)
        return
    total.inc(value * times)
    for bound, bucket in zip(bounds, buckets, strict=True):
        if value <= bound:
            bucket.inc(times)
            return


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
                observe_repeated(child, value, times)
        if self._attempts:
            child = RETRY_COUNT.labels(self.table_name)
            for attempts, times in self._attempts.items():
                observe_repeated(child, attempts, times)


_error_types = BoundedLabels(TOPIC_LIMIT)


class TableRelayMetrics:
    """A relay's metrics of its table bound once (a ``labels`` lookup costs microseconds), each observed once
    per claim, settle or destination call; ``destination``: the destination's kind (its messaging_system)."""

    def __init__(self, table_name: str, destination: str) -> None:
        self.table_name, self.destination = table_name, destination
        self.claim = CLAIM_DURATION.labels(table_name)
        self.settle = SETTLE_DURATION.labels(table_name)
        self.operation = OPERATION_DURATION.labels(destination, "send", table_name)
        self.delivery = DELIVERY_LATENCY.labels(table_name, destination)
        self._sent = SENT_MESSAGES.labels(destination, "send", table_name, "")
        DESTINATION_INFO.labels(table_name, destination).set(1)

    def settled(self, delivered: int, latencies: Sequence[float], *failed_by_code: dict[str, int]) -> None:
        """A settled batch: how many were delivered and their latencies (created → settled, where known), the
        messages not delivered by outcome code."""
        observe_many(self.delivery, latencies)
        if delivered:
            self._sent.inc(delivered)
        for code, n in (item for counts in failed_by_code for item in counts.items()):
            error_type = _error_types(self.table_name, code)
            SENT_MESSAGES.labels(self.destination, "send", self.table_name, error_type).inc(n)


def exposition() -> bytes:
    return generate_latest(REGISTRY)


def serve(port: int, host: str = "127.0.0.1") -> None:
    """Expose /metrics on a port of its own (the relay worker's --metrics-port; an application's own process,
    whose ``outbox_enqueue_total`` counts what it enqueued)."""
    start_http_server(port, addr=host, registry=REGISTRY)


class _Forward(Collector):
    """The outbox's metrics, as part of another registry's scrape (read at each collect, nothing copied)."""

    def collect(self) -> Iterator[Any]:
        yield from REGISTRY.collect()


_forwarded: set[int] = set()
_forward_lock = threading.Lock()


def expose_in(registry: CollectorRegistry) -> None:
    """Add the outbox's metrics (``outbox_enqueue_total`` among them) to an application's own registry, e.g.
    prometheus_client's default one that its /metrics already serves; once per registry."""
    with _forward_lock:
        if id(registry) in _forwarded:
            return
        registry.register(_Forward())
        _forwarded.add(id(registry))


class Stopwatch:
    def __init__(self) -> None:
        self.started = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started
