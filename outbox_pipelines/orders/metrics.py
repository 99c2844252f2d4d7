"""The order product's metrics, on the engine's registry: one /metrics serves both."""

from prometheus_client import Counter, Histogram

from outbox_pipelines.core.telemetry.metrics import REGISTRY

ORDER_REQUESTS = Counter("order_requests_total", "Order API requests, by HTTP status", ["status"], registry=REGISTRY)
ORDER_CONFLICTS = Counter("order_idempotency_conflicts_total", "Same key, different body (409)", registry=REGISTRY)
ORDER_BROKER_LATENCY = Histogram(
    "order_broker_latency_ms",
    "Broker round trip of one order, milliseconds",
    registry=REGISTRY,
    buckets=(1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000),
)
