"""Throughput scaling: how many open plain extents a queue should have, judged by the
rate they carry (from the input hosts' load reports).

Above ``extent_target_rate`` per extent on average over the up window (10 s): one more
extent, up to ``max_extents``. Below half of it over the down window (60 s): one fewer,
never under ``min_extents``. Each change starts both windows again. Between half the
target and the target nothing changes, and a change never lands outside that band
(with N extents above the target, N + 1 carry more than half of it each; with N below
half, N - 1 carry less than the target each), so a steady rate gives a steady count."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from cherami.metadata.models import Extent

OPEN_ONE, SEAL_ONE, KEEP = 1, -1, 0


@dataclass(frozen=True)
class QueueLoad:
    extents: int  # open plain extents now
    rate: float  # messages/s they carry together
    target: float  # extent_target_rate
    min_extents: int
    max_extents: int


@dataclass
class _Window:
    extents: int
    since: float  # when the queue was first seen with this many extents
    samples: deque[tuple[float, float]] = field(default_factory=deque)  # (time, per extent)


class ScalingPolicy:
    def __init__(
        self,
        up_window: float = 10.0,
        down_window: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.up_window = up_window
        self.down_window = max(down_window, up_window)
        self._clock = clock
        self._queues: dict[str, _Window] = {}

    def decide(self, queue: str, load: QueueLoad) -> int:
        """OPEN_ONE, SEAL_ONE or KEEP; called on every controller tick with the latest
        rate. After OPEN_ONE or SEAL_ONE the windows start again once the count moved."""
        now = self._clock()
        window = self._queues.get(queue)
        if window is None or window.extents != load.extents:
            window = self._queues[queue] = _Window(load.extents, now)
        samples = window.samples
        samples.append((now, load.rate / max(1, load.extents)))
        while samples and samples[0][0] < now - self.down_window:
            samples.popleft()
        if load.extents < load.min_extents:
            return KEEP  # the minimum is opened by ensure_extents, not by load
        if load.extents > load.max_extents:
            return SEAL_ONE  # max_extents was lowered
        lasted = now - window.since
        if load.extents < load.max_extents and lasted >= self.up_window:
            recent = [r for t, r in samples if t >= now - self.up_window]
            if sum(recent) / len(recent) > load.target:
                return OPEN_ONE
        quiet = sum(r for _, r in samples) / len(samples) < load.target / 2
        if load.extents > load.min_extents and lasted >= self.down_window and quiet:
            return SEAL_ONE
        return KEEP

    def forget(self, keep: set[str]) -> None:
        """Drop the windows of queues not in ``keep`` (deleted queues)."""
        for queue in set(self._queues) - keep:
            del self._queues[queue]


def extent_rates(reports: list[dict[str, float]]) -> dict[str, float]:
    """Messages/s into each extent, summed over the hosts' reports of it."""
    rates: dict[str, float] = {}
    for report in reports:
        for extent, rate in report.items():
            rates[extent] = rates.get(extent, 0.0) + rate
    return rates


def extent_to_seal(plain: list[Extent], rates: dict[str, float]) -> Extent:
    """The open plain extent to seal when a queue scales down: one on the input host
    that holds most of the queue's extents (so input hosts keep one each while they
    can), the least busy of those, the newest of equals."""
    per_host: dict[str, int] = {}
    for extent in plain:
        per_host[extent.input_host] = per_host.get(extent.input_host, 0) + 1
    return min(
        plain,
        key=lambda e: (-per_host[e.input_host], rates.get(e.id, 0.0), -e.created_at, e.id),
    )
