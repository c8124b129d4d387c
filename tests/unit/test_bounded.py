"""bounded.each: every call made, a bounded number under way, results in order, and a
failure raised once every call has ended (none left running behind the caller)."""

from __future__ import annotations

import asyncio

import pytest

from cherami.bounded import each


async def test_results_in_order_with_at_most_so_many_under_way() -> None:
    running, most = 0, 0

    async def call(i: int) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        for _ in range(10 - i % 10):  # later items end sooner
            await asyncio.sleep(0)
        running -= 1
        return i * i

    assert await each(list(range(40)), call, 4) == [i * i for i in range(40)]
    assert most == 4


async def test_a_failure_is_raised_once_every_call_has_ended() -> None:
    ended: list[int] = []

    async def call(i: int) -> int:
        await asyncio.sleep(0)
        if i == 1:
            raise ValueError("one failed")
        for _ in range(5):
            await asyncio.sleep(0)
        ended.append(i)
        return i

    with pytest.raises(ValueError, match="one failed"):
        await each([0, 1, 2, 3], call, 2)
    assert sorted(ended) == [0, 2, 3]
