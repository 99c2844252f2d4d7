"""The per-table gauges read at scrape time (pending, locked, lag quantiles, circuit, 429 pause), from the same
status the checks read; a process adds them to its /metrics with ``watch_tables`` (the relay worker, the Order
API). Apart from telemetry/metrics.py so that an application that only enqueues never imports the checks."""

from collections.abc import Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from outbox_pipelines.core.models import MessageState
from outbox_pipelines.core.oncall.health import read_status
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.table import OutboxTable
from outbox_pipelines.core.telemetry.metrics import REGISTRY


class OutboxStateCollector(Collector):
    """outbox_pending_count, outbox_locked_count and outbox_lag_seconds, read at scrape time."""

    def __init__(self, url: str, table_names: Iterable[str]) -> None:
        self.url, self.table_names = url, list(table_names)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        pending = GaugeMetricFamily("outbox_pending_count", "Messages waiting (pending or retrying)", labels=["table"])
        locked = GaugeMetricFamily("outbox_locked_count", "Messages held by a relay (sending)", labels=["table"])
        inflight = GaugeMetricFamily(
            "outbox_inflight", "Messages in sending (seed 000's name for locked)", labels=["table"]
        )
        lag = GaugeMetricFamily(
            "outbox_lag_seconds",
            "created → delivered over the last hour, waiting messages counted with their age so far",
            labels=["table", "quantile"],
        )
        circuit = GaugeMetricFamily(
            "outbox_circuit_open", "1 while the table's circuit breaker is open", labels=["table"]
        )
        paused = GaugeMetricFamily(
            "outbox_paused_seconds",
            "how much longer the destination asked the table to hold off (429)",
            labels=["table"],
        )
        try:
            with connect(self.url) as conn:
                for table_name in self.table_names:
                    status = read_status(OutboxTable(conn, table_name))
                    pending.add_metric([table_name], status.backlog)
                    locked.add_metric([table_name], status.counts.get(MessageState.SENDING, 0))
                    inflight.add_metric([table_name], status.counts.get(MessageState.SENDING, 0))
                    quantiles = (("0.5", status.lag_p50_s), ("0.95", status.lag_p95_s), ("0.99", status.lag_p99_s))
                    for quantile, value in quantiles:
                        if value is not None:
                            lag.add_metric([table_name, quantile], value)
                    health = status.destination
                    circuit.add_metric([table_name], 1.0 if health and health.circuit_opened_at else 0.0)
                    paused_for_s = health.paused_for_s if health and health.paused else None
                    paused.add_metric([table_name], paused_for_s or 0.0)
        except Exception:  # a scrape must not fail because the database is briefly away
            return
        yield pending
        yield locked
        yield inflight
        yield lag
        yield circuit
        yield paused


def watch_tables(url: str, table_names: Iterable[str]) -> None:
    """Add the per-table gauges to this process's /metrics (once)."""
    if not any(isinstance(c, OutboxStateCollector) for c in list(REGISTRY._collector_to_names)):
        REGISTRY.register(OutboxStateCollector(url, table_names))
