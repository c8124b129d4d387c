"""A group's ticker runs only while the group has timers: an idle group holds no task,
and a new timer starts it again (it waited on an event forever before, a task and an
event for each of a node's 20,000 idle groups)."""

from __future__ import annotations

import asyncio
import time

from cherami.roles.outputhost.ticker import Ticker


class Group:
    def __init__(self) -> None:
        self.timers = 0
        self.expired = 0
        self.stopped = False

    def expire(self, now: float) -> None:
        self.expired += 1
        self.timers = max(0, self.timers - 1)

    def ticker(self) -> Ticker:
        return Ticker(lambda: self.timers > 0, lambda now: 0.0, self.expire, time.monotonic,
                      lambda: self.stopped)  # fmt: skip


async def _until_done(ticker: Ticker) -> None:
    assert ticker.task is not None
    await asyncio.wait_for(ticker.task, 5)
    assert ticker.task is None  # not even the finished task is kept


async def test_an_idle_group_holds_no_running_ticker() -> None:
    group = Group()
    ticker = group.ticker()
    ticker.wake()
    assert ticker.task is None  # not started yet: nothing runs
    ticker.start()
    await _until_done(ticker)
    assert group.expired == 0


async def test_a_timer_starts_it_and_it_ends_when_none_is_left() -> None:
    group = Group()
    ticker = group.ticker()
    ticker.start()
    await _until_done(ticker)
    group.timers = 2
    ticker.wake()
    await _until_done(ticker)
    assert group.expired == 2 and group.timers == 0
    group.timers = 1
    ticker.wake()
    assert ticker.task is not None  # started again
    await _until_done(ticker)
    assert group.expired == 3


async def test_a_stopping_group_starts_nothing() -> None:
    group = Group()
    ticker = group.ticker()
    ticker.start()
    await _until_done(ticker)
    group.stopped, group.timers = True, 1
    ticker.wake()
    assert ticker.task is None
