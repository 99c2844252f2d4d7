"""Prometheus metrics with the seeds' names (docs/explanation/on-call.md, "Metrics").

Counters and histograms are counted in telemetry/counts.py where things happen and read from there when
scraped; the per-table gauges (pending, locked, lag) are read from the database when scraped. Only a
process that exposes them imports prometheus_client (this module).
"""

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from outbox_pipelines.core.telemetry import counts
from outbox_pipelines.core.telemetry.counts import (  # noqa: F401 (the names this module always had)
    DEAD,
    DEQUEUED,
    DISPATCH_LATENCY,
    DISPATCHED,
    ENQUEUED,
    RETRY_COUNT,
    TENANT_LABEL_ENV,
    TENANT_LIMIT,
    TOPIC_LIMIT,
    BatchTally,
    BoundedLabels,
    TableRelayMetrics,
    count_claim,
    count_enqueued,
    count_enqueued_one,
    tenant_label,
    topic_label,
)

REGISTRY = CollectorRegistry(auto_describe=True)


def family_metric(family: counts.Family) -> Any:
    """One family as prometheus_client's own Counter, Gauge or Histogram of that name exposes it."""
    if isinstance(family, counts.CounterFamily):
        counter = CounterMetricFamily(family.name, family.documentation, labels=family.labelnames)
        for values, child in family.children():
            counter.add_metric(values, child.value, created=child.created)
        return counter
    if isinstance(family, counts.GaugeFamily):
        gauge = GaugeMetricFamily(family.name, family.documentation, labels=family.labelnames)
        for values, child in family.children():
            gauge.add_metric(values, child.value)
        return gauge
    histogram = HistogramMetricFamily(family.name, family.documentation, labels=family.labelnames)
    for values, child in family.children():
        cumulative, buckets = 0, []
        for bound, n in zip(child.bounds, child.buckets, strict=True):
            cumulative += n
            buckets.append((floatToGoString(bound), float(cumulative)))  # type: ignore[no-untyped-call]
        histogram.add_metric(values, buckets, child.sum)
    return histogram


class Counted(Collector):
    """What this process counted (telemetry/counts.py), read at each scrape."""

    def collect(self) -> Iterator[Any]:
        enqueued = CounterMetricFamily("outbox_enqueue", "Messages enqueued", labels=["table", "topic"])
        for labels, count in ENQUEUED.counts():
            enqueued.add_metric(labels, count)
        yield enqueued
        for family in counts.FAMILIES:
            yield family_metric(family)


REGISTRY.register(Counted())


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
