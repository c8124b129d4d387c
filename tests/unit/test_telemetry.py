"""The telemetry histograms."""

from __future__ import annotations

from cherami.telemetry import Histogram


def test_a_histogram_observes_a_batch_as_one_value_at_a_time() -> None:
    values = [0.0, 0.004, 0.05, 0.5, 3.0, 99.0, 0.05]
    one, many = Histogram(), Histogram()
    for v in values:
        one.observe(v)
    many.observe_all(values)
    assert (many.counts, many.count) == (one.counts, one.count)
    assert abs(many.sum - one.sum) < 1e-9
