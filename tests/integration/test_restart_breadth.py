"""A node with 1,000 queues of 2 groups each (3,000 queues with the dead-letter queues,
2,000 open extents: the dead-letter queues hold none until their first dead letter)
comes back after SIGTERM and after SIGKILL, and every message
published before is delivered after, to every group. Before recovery kept agreeing
extents open, a node with 16 queues or more could not restart ('0 store hosts up')."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from cherami.client.asyncclient import AsyncClient
from tests.support.server import ServerProcess, recovered

QUEUES, GROUPS = 1000, ("a", "b")


async def _fill(client: AsyncClient) -> None:
    limit = asyncio.Semaphore(8)

    async def one(i: int) -> None:
        async with limit:
            await client.create_queue(f"q{i}")
            for group in GROUPS:
                await client.create_group(f"q{i}", group)
            await client.publish(f"q{i}", [f"m{i}-0"])

    await asyncio.gather(*(one(i) for i in range(QUEUES)))


async def _delivered_then_next(client: AsyncClient, round_: int) -> list[tuple[int, str]]:
    """Receive and ack every queue's message of ``round_`` in each group, then publish
    the next round's; the (queue, group) pairs that did not get theirs."""
    limit = asyncio.Semaphore(8)
    missing: list[tuple[int, str]] = []

    async def one(i: int) -> None:
        async with limit:
            for group in GROUPS:
                got = await client.receive(f"q{i}", group, max_messages=10, wait_seconds=5)
                if [m.text for m in got] != [f"m{i}-{round_}"]:
                    missing.append((i, group))
                await client.ack(f"q{i}", group, [m.receipt or "" for m in got])
            await client.publish(f"q{i}", [f"m{i}-{round_ + 1}"])

    await asyncio.gather(*(one(i) for i in range(QUEUES)))
    return missing


async def test_a_node_with_a_thousand_queues_restarts(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "node").start()
    try:
        async with AsyncClient(server.url, timeout=60) as client:
            await _fill(client)
        for round_, how in enumerate(("sigterm", "sigkill")):
            if how == "sigterm":
                assert await asyncio.to_thread(server.stop) == 0
            else:
                await asyncio.to_thread(server.kill)
            started = time.monotonic()
            await asyncio.to_thread(server.start, 120)
            print(f"{how}: back in {time.monotonic() - started:.1f} s with {QUEUES} queues")
            # a plain extent for every queue (no timer extent: nothing delayed was
            # published; none for a dead-letter queue nothing was moved to), idle at the
            # stop: every replica agrees, so every one is kept open, none sealed
            assert recovered(server) == (QUEUES, QUEUES, 0)
            async with AsyncClient(server.url, timeout=60) as client:
                assert await _delivered_then_next(client, round_) == []
    finally:
        server.stop()
