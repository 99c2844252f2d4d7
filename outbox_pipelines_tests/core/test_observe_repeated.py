"""The relay's bulk histogram observation exposes exactly what as many single observations do."""

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from outbox_pipelines.core.metrics import observe_repeated


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
