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


def test_woken_ticks_keep_their_min_gap() -> None:
    """The leading controller's ticks are woken by every change-log write: a power loss's
    replacement of 2,000 extents woke it at each (1,840 reads of the hosts table in a
    round). Its woken ticks begin min_gap apart at least, however often it is woken."""

    async def run() -> list[float]:
        loop = asyncio.get_running_loop()
        began: list[float] = []

        async def tick() -> None:
            began.append(loop.time())

        periodic = Periodic("test", 60.0, tick, min_gap=0.2)
        periodic.start(first_now=True)
        try:
            while len(began) < 4:  # woken all the time
                periodic.wake()
                await asyncio.sleep(0)
        finally:
            await periodic.stop()
        return began

    began = asyncio.run(run())
    # less asyncio's own slack: a timer may run up to the loop's clock resolution early,
    # and a tick begins a moment after its start is taken (0.199 s seen; 0.05 s before)
    assert all(b - a >= 0.19 for a, b in zip(began, began[1:], strict=False)), began
