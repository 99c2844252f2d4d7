"""The relay's bulk histogram observation exposes exactly what as many single observations do."""

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from outbox_pipelines.core.telemetry.metrics import observe_repeated


def _exposition(observe) -> bytes:
    registry = CollectorRegistry()
    histogram = Histogram("h", "h", ["table"], registry=registry, buckets=(0.01, 0.1, 1.0))
    observe(histogram.labels("t"))
    # The _created sample is the clock at creation, different for each histogram.
    return b"\n".join(line for line in generate_latest(registry).splitlines() if b"_created" not in line)


def test_repeated_observations_match_single_ones():
    values = [(0.005, 3), (0.05, 1), (0.5, 250), (7.0, 2), (1.0, 4)]

    def one_by_one(child):
        for value, times in values:
            for _ in range(times):
                child.observe(value)

    def in_bulk(child):
        for value, times in values:
            observe_repeated(child, value, times)

    assert _exposition(in_bulk) == _exposition(one_by_one)
    assert b'h_bucket{le="+Inf",table="t"} 260.0' in _exposition(in_bulk)


def test_a_batch_tallied_at_once_exposes_what_message_by_message_does(monkeypatch):
    """The relay counts a batch delivered whole in one pass (BatchTally.add_all)."""
    from types import SimpleNamespace

    from outbox_pipelines.core.telemetry import metrics

    batch = [
        SimpleNamespace(topic=topic, tenant_id=tenant, attempts=attempts)
        for topic, tenant, attempts in [("a", None, 1), ("b", "t1", 1), ("a", None, 2), ("a", "t1", 1)] * 25
    ]

    def exposition(tally_batch) -> bytes:
        registry = CollectorRegistry()
        for name in ("DISPATCHED", "DEAD", "DISPATCH_LATENCY", "RETRY_COUNT"):
            original = getattr(metrics, name)
            kind = Histogram if isinstance(original, Histogram) else type(original)
            extra = {"buckets": original._upper_bounds} if kind is Histogram else {}
            monkeypatch.setattr(
                metrics,
                name,
                kind(original._name, original._documentation, original._labelnames, registry=registry, **extra),
            )
        tally = metrics.BatchTally("outbox_events")
        tally_batch(tally)
        tally.flush()
        return b"\n".join(line for line in generate_latest(registry).splitlines() if b"_created" not in line)

    def each(tally):
        for message in batch:
            tally.add(message, "success", 0.25, final=True)

    together = exposition(lambda tally: tally.add_all(batch, "success", 0.25))
    assert together == exposition(each)
    assert b'outbox_dispatch_total{result="success",table="outbox_events",tenant="",topic="a"} 50.0' in together
