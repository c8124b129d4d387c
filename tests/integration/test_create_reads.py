"""What making queues and groups reads from the metadata store (issue 29: a node makes
10,000 queues of 2 groups at 200 a second): a real node process, its own count of
metadata calls by operation (``cherami_metadata_call_latency_seconds_count``).

Before: each group's creation read its queue twice (the frontend's lookup, then the
controller's), and the leading controller looked at every changed queue (the queue
and its 2 dead-letter queues) with a get_queue and a list_extents each, about 7
get_queue and 3 list_extents a queue of 2 groups in all; and its first extent was a
line in the log at info (2.9% of the node's CPU making 10,000 queues)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cherami.client.asyncclient import AsyncClient
from tests.integration.test_lazy_groups import metadata_calls, until_calls
from tests.support.server import ServerProcess, unique

pytestmark = pytest.mark.timeout(180)

QUEUES = 40


async def test_making_queues_reads_each_queue_once_and_the_leader_reads_in_bulk(
    tmp_path: Path,
) -> None:
    node = ServerProcess(tmp_path / "node", 1).start()
    try:
        async with AsyncClient(node.url, timeout=30) as c:
            names = [unique("q") for _ in range(QUEUES)]
            before = await metadata_calls(c)
            limit = asyncio.Semaphore(16)

            async def make(name: str) -> None:
                async with limit:
                    await c.create_queue(name)
                    await c.create_group(name, "a")
                    await c.create_group(name, "b")

            await asyncio.gather(*(make(n) for n in names))
            # the leader has looked at every queue made (and the output host followed)
            await until_calls(c, "changes_since", 10)
            after = await metadata_calls(c)
            made = {op: (n - before.get(op, 0.0)) / QUEUES for op, n in after.items()}
            # one lookup a group by the frontend; none by the controller or the leader
            assert made.get("get_queue", 0) <= 2.2, made
            assert made.get("list_extents", 0) <= 0.2, made
            assert made.get("get_group", 0) <= 2.0, made
            assert made.get("queues_with_extents", 0) <= 1.0, made
            # a queue's first extent, opened as it is made, is not a line in the log
            assert not [line for line in node.output if "opened for queue" in line]
            for name in names:  # and every queue and group is there, each with its DLQ
                groups = [g["name"] for g in await c.list_groups(name)]
                assert groups == ["a", "b"]
    finally:
        node.stop()
