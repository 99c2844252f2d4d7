"""What the relay counts (telemetry/counts.py) is exposed exactly as prometheus_client's own metrics expose the
same observations, bulk observations included."""

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.registry import Collector

from outbox_pipelines.core.telemetry import counts, metrics


class _Families(Collector):
    def __init__(self, *families: counts.Family) -> None:
        self.families = families

    def collect(self):
        for family in self.families:
            yield metrics.family_metric(family)


def _text(registry: CollectorRegistry) -> bytes:
    # The _created sample is the clock at creation, different for each.
    return b"\n".join(line for line in generate_latest(registry).splitlines() if b"_created" not in line)


def _ours(*families: counts.Family) -> bytes:
    registry = CollectorRegistry()
    registry.register(_Families(*families))
    return _text(registry)


def test_repeated_observations_match_prometheus_client_s_single_ones():
    values = [(0.005, 3), (0.05, 1), (0.5, 250), (7.0, 2), (1.0, 4), (0.1, 1)]
    registry = CollectorRegistry()
    theirs = Histogram("h", "h", ["table"], registry=registry, buckets=(0.01, 0.1, 1.0)).labels("t")
    for value, times in values:
        for _ in range(times):
            theirs.observe(value)
    family = counts.HistogramFamily("h", "h", ["table"], buckets=(0.01, 0.1, 1.0))
    for value, times in values:
        family.labels("t").observe_repeated(value, times)
    assert _ours(family) == _text(registry)
    assert b'h_bucket{le="+Inf",table="t"} 261.0' in _ours(family)
    assert b'h_bucket{le="0.1",table="t"} 5.0' in _ours(family)  # a value on a bound counts in that bucket


def test_counters_and_gauges_expose_as_prometheus_client_s():
    registry = CollectorRegistry()
    Counter("c_total", "c", ["table", "result"], registry=registry).labels("t", "success").inc(3)
    Counter("m", "m", ["table"], registry=registry).labels("t").inc()
    Gauge("g", "g", ["table"], registry=registry).labels("t").set(1)
    ours = [
        counts.CounterFamily("c_total", "c", ["table", "result"]),
        counts.CounterFamily("m", "m", ["table"]),
        counts.GaugeFamily("g", "g", ["table"]),
    ]
    ours[0].labels("t", "success").inc(3)
    ours[1].labels("t").inc()
    ours[2].labels("t").set(1)
    assert _ours(*ours) == _text(registry)
    assert b'm_total{table="t"} 1.0' in _ours(*ours)


def test_a_batch_tallied_at_once_exposes_what_message_by_message_does(monkeypatch):
    """The relay counts a batch delivered whole in one pass (BatchTally.add_all)."""
    batch = [
        SimpleNamespace(topic=topic, tenant_id=tenant, attempts=attempts)
        for topic, tenant, attempts in [("a", None, 1), ("b", "t1", 1), ("a", None, 2), ("a", "t1", 1)] * 25
    ]

    def exposition(tally_batch) -> bytes:
        fresh = []
        for name in ("DISPATCHED", "DEAD", "DISPATCH_LATENCY", "RETRY_COUNT"):
            original = getattr(counts, name)
            if isinstance(original, counts.HistogramFamily):
                copy = counts.HistogramFamily(
                    original.name, original.documentation, original.labelnames, original.bounds
                )
            else:
                copy = type(original)(original.name, original.documentation, original.labelnames)
            monkeypatch.setattr(counts, name, copy)
            fresh.append(copy)
        tally = counts.BatchTally("outbox_events")
        tally_batch(tally)
        tally.flush()
        return _ours(*fresh)

    def each(tally):
        for message in batch:
            tally.add(message, "success", 0.25, final=True)

    together = exposition(lambda tally: tally.add_all(batch, "success", 0.25))
    assert together == exposition(each)
    assert b'outbox_dispatch_total{result="success",table="outbox_events",tenant="",topic="a"} 50.0' in together
    assert b'outbox_retry_count_bucket{le="1.0",table="outbox_events"} 75.0' in together
