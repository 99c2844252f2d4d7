"""The per-table gauges read at scrape time (state_up, pending, oldest age, dead, blocked keys, relays alive, lag,
circuit, 429 pause) from the status the checks read; a process adds them with ``watch_tables`` (the relay worker,
the Order API, ``outbox-pipelines metrics``). Apart from telemetry/metrics.py: an enqueuing app never imports checks.
Names, labels and alert rules: docs/how-to/prometheus.md."""

import logging
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from outbox_pipelines.core.models import MessageState
from outbox_pipelines.core.oncall.health import read_status
from outbox_pipelines.core.oncall.table_status import TableStatus
from outbox_pipelines.core.relay.liveness import REMOTE_SILENT_AFTER_S
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.table import OutboxTable, SharedTables
from outbox_pipelines.core.telemetry.metrics import REGISTRY

log = logging.getLogger("outbox_pipelines.metrics")


class _Families:
    """One scrape's gauge families, each labelled by table (lag also by quantile)."""

    def __init__(self) -> None:
        def gauge(name: str, documentation: str, *extra: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, documentation, labels=["table", *extra])

        self.up = gauge("outbox_state_up", "1 when this scrape read the table's state, 0 when the read failed")
        self.pending = gauge("outbox_pending_count", "Messages waiting (pending or retrying)")
        self.locked = gauge("outbox_locked_count", "Messages held by a relay (sending)")
        self.inflight = gauge("outbox_inflight", "Messages in sending (seed 000's name for locked)")
        self.oldest = gauge(
            "outbox_oldest_waiting_age_seconds", "Age of the oldest message not delivered yet (0: none)"
        )
        self.dead = gauge("outbox_dead_count", "Dead messages in the table now")
        self.blocked = gauge("outbox_blocked_keys", "Ordering keys held behind a dead message")
        self.alive = gauge("outbox_relays_alive", "Relays of the table heartbeating in the last minute")
        self.enabled = gauge("outbox_relay_enabled", "1 when the table's relay_enabled setting is on")
        self.lag = gauge(
            "outbox_lag_seconds",
            "created → delivered over the last hour, waiting messages counted with their age so far",
            "quantile",
        )
        self.circuit = gauge("outbox_circuit_open", "1 while the table's circuit breaker is open")
        self.paused = gauge(
            "outbox_paused_seconds", "how much longer the destination asked the table to hold off (429)"
        )

    def add(self, table_name: str, status: TableStatus, alive: int) -> None:
        sending = status.counts.get(MessageState.SENDING, 0)
        self.pending.add_metric([table_name], status.backlog)
        self.locked.add_metric([table_name], sending)
        self.inflight.add_metric([table_name], sending)
        self.oldest.add_metric([table_name], status.oldest_waiting_age_s or 0.0)
        self.dead.add_metric([table_name], status.counts.get(MessageState.DEAD, 0))
        self.blocked.add_metric([table_name], status.blocked_keys)
        self.alive.add_metric([table_name], alive)
        for quantile, value in (("0.5", status.lag_p50_s), ("0.95", status.lag_p95_s), ("0.99", status.lag_p99_s)):
            if value is not None:
                self.lag.add_metric([table_name, quantile], value)
        health = status.destination
        self.circuit.add_metric([table_name], 1.0 if health and health.circuit_opened_at else 0.0)
        paused_for_s = health.paused_for_s if health and health.paused else None
        self.paused.add_metric([table_name], paused_for_s or 0.0)

    def all(self) -> Iterator[GaugeMetricFamily]:
        yield from (self.up, self.pending, self.locked, self.inflight, self.oldest, self.dead, self.blocked)
        yield from (self.alive, self.enabled, self.lag, self.circuit, self.paused)


class OutboxStateCollector(Collector):
    """The table gauges, read at scrape time. ``outbox_state_up`` is always there, 0 for a table whose state
    could not be read (the database away, the table missing): an alert on it pages, where silence would not.
    ``enabled`` (table → relay_enabled) adds ``outbox_relay_enabled`` where the process knows the settings."""

    def __init__(self, url: str, table_names: Iterable[str], enabled: Mapping[str, bool] | None = None) -> None:
        self.url, self.table_names = url, list(table_names)
        self.enabled = dict(enabled or {})

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = _Families()
        if not self.table_names:  # nothing to read: the families alone (their names and help)
            yield from families.all()
            return
        read: set[str] = set()
        try:
            with connect(self.url) as conn:
                alive = SharedTables(conn).relays_alive(self.table_names, within_s=REMOTE_SILENT_AFTER_S)
                for table_name in self.table_names:
                    try:
                        status = read_status(OutboxTable(conn, table_name))
                    except Exception as exc:  # one table unreadable: its up is 0, the rest go on
                        log.warning("metrics: cannot read the state of %s: %s", table_name, type(exc).__name__)
                        continue
                    families.add(table_name, status, alive.get(table_name, 0))
                    read.add(table_name)
        except Exception as exc:  # a scrape must not fail while the database is away
            log.warning("metrics: cannot read the outbox tables' state: %s", type(exc).__name__)
        for table_name in self.table_names:
            families.up.add_metric([table_name], 1.0 if table_name in read else 0.0)
            if table_name in self.enabled:
                families.enabled.add_metric([table_name], 1.0 if self.enabled[table_name] else 0.0)
        yield from families.all()


def watch_tables(url: str, table_names: Iterable[str], enabled: Mapping[str, bool] | None = None) -> None:
    """Add the per-table gauges to this process's /metrics (once)."""
    if not any(isinstance(c, OutboxStateCollector) for c in list(REGISTRY._collector_to_names)):
        REGISTRY.register(OutboxStateCollector(url, table_names, enabled))
