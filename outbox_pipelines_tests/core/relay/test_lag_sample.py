"""The relay's delivery-lag sample: a uniform reservoir, whatever the batches, computing only what it keeps."""

import random
import statistics

from outbox_pipelines.core.relay.report import LagSample


def _fill(sample: LagSample, values: list[float], chunks: list[int]) -> int:
    """Add the values in batches of the given sizes (cycled); return how many values were computed."""
    computed = 0

    def value_of(v: float) -> float:
        nonlocal computed
        computed += 1
        return v

    at, i = 0, 0
    while at < len(values):
        size = chunks[i % len(chunks)]
        sample.add_each(values[at : at + size], value_of)
        at, i = at + size, i + 1
    return computed


def test_batches_of_any_size_keep_the_same_sample_as_one_value_at_a_time():
    values = [float(n) for n in range(5_000)]
    one_by_one = LagSample(capacity=200, rng=random.Random(3))
    for value in values:
        one_by_one.add(value)
    batched = LagSample(capacity=200, rng=random.Random(3))
    _fill(batched, values, [1, 7, 199, 1000, 3])
    assert batched.values == one_by_one.values
    assert batched.count == one_by_one.count == 5_000
    assert len(batched.values) == 200


def test_the_sample_is_uniform_over_everything_added():
    # 400 reservoirs of 100 out of 10,000 values: each value is kept with probability 1/100, so the
    # kept values' mean is the population's, and each tenth of the stream holds a tenth of the sample.
    kept: list[float] = []
    for seed in range(400):
        sample = LagSample(capacity=100, rng=random.Random(seed))
        _fill(sample, [float(n) for n in range(10_000)], [1000])
        kept += sample.values
    assert abs(statistics.fmean(kept) - 4999.5) < 60  # standard error of the mean ≈ 14
    per_tenth = [sum(1 for v in kept if t * 1000 <= v < (t + 1) * 1000) / len(kept) for t in range(10)]
    assert all(0.09 < share < 0.11 for share in per_tenth), per_tenth


def test_once_full_only_the_values_kept_are_computed():
    sample = LagSample(capacity=1_000, rng=random.Random(1))
    computed = _fill(sample, [float(n) for n in range(100_000)], [1000])
    # 1,000 to fill, then about capacity x ln(100,000 / 1,000) ≈ 4,600 replacements, not 99,000.
    assert 1_000 < computed < 8_000
    assert sample.count == 100_000
    percentiles = sample.percentiles()
    assert 40_000 < percentiles["lag_p50_s"] < 60_000
