"""telemetry.render writes what prometheus_client's generate_latest writes, for the
kinds of families Cherami exports (prometheus_client is the oracle here)."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from cherami.telemetry import Histogram, histogram, render


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def _latest(families: list[Metric]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))  # type: ignore[arg-type]
    return generate_latest(registry)


def test_render_is_generate_latest() -> None:
    gauge = GaugeMetricFamily("g", 'a \\ doc\nof "two" lines', labels=["queue", "group"])
    for i, value in enumerate([0, 1, 2.5, -3.25, 999_999.5, 1_234_567.0, 1e20, -1e20,
                               math.inf, -math.inf, math.nan, 7]):  # fmt: skip
        gauge.add_metric([f"q{i}", "g"], value)
    gauge.add_metric(['odd "\\ \n name', "é"], 1)
    counter = CounterMetricFamily("c", "counted", labels=["op"])
    counter.add_metric(["get"], 12)
    counter.add_metric(["put"], 0)
    bare = CounterMetricFamily("bare", "no labels", labels=[])
    bare.add_metric([], 3)
    hist = Histogram()
    for seconds in (0.0004, 0.003, 0.2, 12.0):
        hist.observe(seconds)
    families: list[Metric] = [
        gauge, counter, bare,
        histogram("h_seconds", "timed", ["queue"], [(["q"], hist), (["idle"], Histogram())]),
    ]  # fmt: skip
    assert render(families)[0] == _latest(families)
    assert b"idle" not in render(families)[0]  # nothing observed: left out
