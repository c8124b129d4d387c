"""Throughput scaling: how many open plain extents a queue should have, judged by the
rate they carry (from the input hosts' load reports).

Above ``extent_target_rate`` per extent on average over the up window (10 s): one more
extent, up to ``max_extents``. Below half of it over the down window (60 s): one fewer,
never under ``min_extents``. Each change starts both windows again once the count shows
it; a count moved otherwise (an extent rolled over by size and its successor not open
yet, a failover) keeps them: the rate is the queue's. Between half the
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
DIP = 2.0  # seconds a count lower than before is taken for a roll-over, not a change


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
    since: float  # when the windows started (the queue seen first, or its last change)
    samples: deque[tuple[float, float]] = field(default_factory=deque)  # (time, per extent)
    decided: int | None = None  # the count the last OPEN_ONE/SEAL_ONE aims at
    decided_at: float = 0.0
    seen: deque[tuple[float, int]] = field(default_factory=deque)  # (time, count) of DIP s


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
        rate. After OPEN_ONE or SEAL_ONE the windows start again once the count shows it.

        The count judged is the most seen over the last DIP seconds: an extent rolled
        over by size is sealed a tick before its successor opens, and that tick must
        neither start the windows again (a queue rolling over every few seconds under
        heavy load never scaled) nor count its rate over one extent fewer."""
        now = self._clock()
        window = self._queues.get(queue)
        if window is None:
            window = self._queues[queue] = _Window(load.extents, now)
        seen = window.seen
        seen.append((now, load.extents))
        while seen[0][0] < now - DIP:
            seen.popleft()
        extents = max(c for _, c in seen)
        if window.extents != extents:
            if window.decided is not None and extents == window.decided:
                window.since = now  # this policy's change: both windows start again
                window.samples.clear()
                window.decided = None
            window.extents = extents
        samples = window.samples
        samples.append((now, load.rate / max(1, extents)))
        while samples and samples[0][0] < now - self.down_window:
            samples.popleft()
        if extents < load.min_extents:
            return KEEP  # the minimum is opened by ensure_extents, not by load
        if window.decided is not None:
            if now - window.decided_at < self.up_window:
                return KEEP  # the last change has not shown in the count yet
            window.decided = None  # it did not happen (no room, no host): try again
        if extents > load.max_extents:
            return self._decided(window, extents - 1, SEAL_ONE)  # max_extents lowered
        lasted = now - window.since
        if extents < load.max_extents and lasted >= self.up_window:
            recent = [r for t, r in samples if t >= now - self.up_window]
            if sum(recent) / len(recent) > load.target:
                return self._decided(window, extents + 1, OPEN_ONE)
        quiet = sum(r for _, r in samples) / len(samples) < load.target / 2
        if extents > load.min_extents and lasted >= self.down_window and quiet:
            return self._decided(window, extents - 1, SEAL_ONE)
        return KEEP

    def _decided(self, window: _Window, extents: int, decision: int) -> int:
        """Remember the count the decision aims at: its windows start again once the
        count reaches it (a change that did not happen is tried again)."""
        window.decided = extents
        window.decided_at = self._clock()
        return decision

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


def queue_rates(rates: dict[str, float], queue_of: dict[str, str]) -> dict[str, float]:
    """Messages/s into each queue's plain extents, from the extents' rates in the latest
    reports: an extent sealed since (rolled over by size) still counts, its successor is
    in no report yet. Summing only the open extents read a queue at full speed, rolling
    over every few seconds, as carrying nothing ("carries 0 msgs/s on 1 extents")."""
    out: dict[str, float] = {}
    for extent, rate in rates.items():
        queue = queue_of.get(extent)
        if queue is not None:
            out[queue] = out.get(queue, 0.0) + rate
    return out


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
