"""Periodic.wake brings the next tick forward (a change to act on), at most one tick
per MIN_GAP however often it is woken; without a wake the tick waits its period."""

from __future__ import annotations

import asyncio

from cherami.periodic import Periodic


def test_a_wake_brings_the_tick_forward_and_many_wakes_make_one_tick() -> None:
    async def run() -> int:
        ticked = asyncio.Queue[None]()
        periodic = Periodic("test", 60.0, lambda: ticked.put(None))
        periodic.start(first_now=True)
        try:
            await asyncio.wait_for(ticked.get(), 5)  # the first, at once
            for _ in range(100):  # a burst of changes
                periodic.wake()
            await asyncio.wait_for(ticked.get(), 5)  # not 60 s later
            return ticked.qsize()
        finally:
            await periodic.stop()

    assert asyncio.run(run()) == 0  # the burst made one tick
