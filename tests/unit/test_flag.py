"""Flag behaves as asyncio.Event does where the group consumer uses it."""

from __future__ import annotations

import asyncio

import pytest

from cherami.roles.outputhost.flag import Flag


async def test_wait_returns_at_once_when_set_and_waits_when_cleared() -> None:
    flag = Flag()
    assert not flag.is_set()
    flag.set()
    assert flag.is_set() and await flag.wait()
    flag.clear()
    waiter = asyncio.create_task(flag.wait())
    await asyncio.sleep(0)
    assert not waiter.done()
    flag.set()
    assert await asyncio.wait_for(waiter, 1) is True


async def test_set_wakes_every_waiter_and_a_cancelled_one_leaves_the_others() -> None:
    flag = Flag()
    waiters = [asyncio.create_task(flag.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    waiters[0].cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiters[0]
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await flag.wait()  # a timeout cancels only this wait
    assert not any(w.done() for w in waiters[1:])
    flag.set()
    assert await asyncio.wait_for(asyncio.gather(*waiters[1:]), 1) == [True, True]


async def test_set_then_clear_before_the_waiter_runs_still_wakes_it() -> None:
    flag = Flag()
    waiter = asyncio.create_task(flag.wait())
    await asyncio.sleep(0)
    flag.set()
    flag.clear()  # as with Event: the waiter was woken by the set
    assert await asyncio.wait_for(waiter, 1) is True
    assert not flag.is_set()
