"""LoopWatch (membership.py): the time this process's loop was held up, added to
``dead_after`` when it looks for live hosts. The clock is injected."""

from __future__ import annotations

import asyncio
from typing import Any

from cherami import membership
from cherami.membership import LoopWatch, live_hosts


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_stalls_within_the_window_are_summed_and_older_ones_dropped() -> None:
    clock = _Clock()
    watch = LoopWatch(clock)
    watch.note(90.0, 2.0)  # ended 10 s ago
    watch.note(97.0, 1.5)
    watch.note(99.0, 0.5)
    assert watch.held_within(6.0) == 2.0
    assert watch.held_within(20.0) == 4.0
    clock.now = 200.0
    assert watch.held_within(6.0) == 0.0


def test_a_stall_still_going_on_counts_before_the_watch_wakes() -> None:
    """The leader's tick can run before the watch after the loop was held up: the
    watch's overdue wake-up is counted then."""
    clock = _Clock()

    async def held_up() -> tuple[float, float]:
        watch = LoopWatch(clock)
        assert watch.held_within(1.0) == 0.0  # starts the watch on this loop
        clock.now += 4.0  # the loop held up 4 s: the watch has not woken since
        return watch.held_within(10.0), LoopWatch.PERIOD

    held, period = asyncio.run(held_up())
    assert held == 4.0 - period


def test_live_hosts_wait_out_dead_after_plus_the_stalls(monkeypatch: Any) -> None:
    asked: list[float] = []

    class _Metadata:
        async def list_hosts(self, role: str, alive_within: float, load: bool) -> list[object]:
            asked.append(alive_within)
            return []

    watch = LoopWatch(_Clock())
    watch.note(99.0, 2.5)
    monkeypatch.setattr(membership, "LOOP", watch)
    asyncio.run(live_hosts(_Metadata(), "inputhost", 3.0))  # type: ignore[arg-type]
    assert asked == [5.5]
