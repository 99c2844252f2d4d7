"""Prometheus metrics with the seeds' names (DESIGN.md §4.5).

Counters and histograms are updated where things happen; the per-table
gauges (pending, locked, lag) are read from the database when scraped.
"""

import time
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry(auto_describe=True)

ENQUEUED = Counter("outbox_enqueue_total", "Messages enqueued", ["table"], registry=REGISTRY)
DISPATCHED = Counter("outbox_dispatch_total", "Deliveries settled, by result", ["table", "result"], registry=REGISTRY)
DEAD = Counter("outbox_dead_total", "Messages that went to dead", ["table"], registry=REGISTRY)
DISPATCH_LATENCY = Histogram(
    "outbox_dispatch_latency_seconds", "Time to dispatch one claimed batch", ["table"], registry=REGISTRY,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
ORDER_REQUESTS = Counter("order_requests_total", "Order API requests, by HTTP status", ["status"], registry=REGISTRY)
ORDER_CONFLICTS = Counter("order_idempotency_conflicts_total", "Same key, different body (409)", registry=REGISTRY)
ORDER_BROKER_LATENCY = Histogram(
    "order_broker_latency_ms", "Broker round trip of one order, milliseconds", registry=REGISTRY,
    buckets=(1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000),
)


class OutboxStateCollector(Collector):
    """outbox_pending_count, outbox_locked_count and outbox_lag_seconds, read at scrape time."""

    def __init__(self, url: str, tables: Iterable[str]) -> None:
        self.url, self.tables = url, list(tables)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from outbox_pipelines.core.db import connect
        from outbox_pipelines.core.health import read_status
        from outbox_pipelines.core.table import OutboxTable

        pending = GaugeMetricFamily("outbox_pending_count", "Messages waiting (pending or retrying)", labels=["table"])
        locked = GaugeMetricFamily("outbox_locked_count", "Messages held by a relay (sending)", labels=["table"])
        lag = GaugeMetricFamily("outbox_lag_seconds", "created → delivered over the last hour, waiting messages "
                                "counted with their age so far", labels=["table", "quantile"])
        circuit = GaugeMetricFamily("outbox_circuit_open", "1 while the table's circuit breaker is open",
                                    labels=["table"])
        paused = GaugeMetricFamily("outbox_paused_seconds", "how much longer the destination asked the table to "
                                   "hold off (429)", labels=["table"])
        try:
            with connect(self.url) as conn:
                for table in self.tables:
                    status = read_status(OutboxTable(conn, table))
                    pending.add_metric([table], status.backlog)
                    locked.add_metric([table], status.counts.get("sending", 0))
                    for quantile, value in (("0.5", status.lag_p50_s), ("0.95", status.lag_p95_s), ("0.99", status.lag_p99_s)):
                        if value is not None:
                            lag.add_metric([table, quantile], value)
                    health = status.destination
                    circuit.add_metric([table], 1.0 if health and health.circuit_opened_at else 0.0)
                    paused.add_metric([table], health.paused_for_s if health and health.paused else 0.0)
        except Exception:  # a scrape must not fail because the database is briefly away
            return
        yield pending
        yield locked
        yield lag
        yield circuit
        yield paused


def watch_tables(url: str, tables: Iterable[str]) -> None:
    """Add the per-table gauges to this process's /metrics (once)."""
    if not any(isinstance(c, OutboxStateCollector) for c in list(REGISTRY._collector_to_names)):  # noqa: SLF001
        REGISTRY.register(OutboxStateCollector(url, tables))


def exposition() -> bytes:
    return generate_latest(REGISTRY)


def serve(port: int, host: str = "127.0.0.1") -> None:
    """Expose /metrics on a port of its own (the relay worker's --metrics-port)."""
    from prometheus_client import start_http_server

    start_http_server(port, addr=host, registry=REGISTRY)


class Stopwatch:
    def __init__(self) -> None:
        self.started = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started
