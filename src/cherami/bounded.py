"""Many awaits at once, a bounded number under way: a leader or an output host that has
every queue to read or tend after a power loss does not do it one after another (each
call waits a round trip) nor all at once (the metadata pool has 10 connections)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

A = TypeVar("A")
T = TypeVar("T")


async def each(items: Sequence[A], call: Callable[[A], Awaitable[T]], at_once: int) -> list[T]:
    """``call`` of every item, ``at_once`` of them under way at a time; the results in the
    items' order. The first exception is raised once every call has ended."""
    limit = asyncio.Semaphore(at_once)

    async def one(item: A) -> T:
        async with limit:
            return await call(item)

    results = await asyncio.gather(*(one(item) for item in items), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results  # type: ignore[return-value]
