"""Retention's pass over the queues holding sealed extents reads what was consumed in
three reads, not three per group of every such queue: 10,000 queues each holding a
sealed backlog made 25,000 metadata calls a second on an idle node. A real node whose
extents roll over at 2 messages; what is waited for is the node's own metadata call
counters, polled with a deadline."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest

from cherami.client.asyncclient import AsyncClient
from tests.support.server import ServerProcess, unique

pytestmark = pytest.mark.timeout(120)

CALLS = re.compile(r'^cherami_metadata_call_latency_seconds_count\{op="([^"]+)"\} (\S+)$', re.M)
WAIT = 30.0
PER_QUEUE = ("list_groups", "get_ack_levels", "get_redeliveries")


async def calls(client: AsyncClient) -> dict[str, float]:
    async with client.session.get(client.url + "/metrics") as resp:
        return {op: float(n) for op, n in CALLS.findall(await resp.text())}


async def test_retention_reads_consumption_in_bulk_and_still_deletes(tmp_path: Path) -> None:
    node = ServerProcess(tmp_path / "node", 1, ["--extent-max-messages", "2"]).start()
    try:
        async with AsyncClient(node.url, timeout=30) as c:
            queues = [unique("q") for _ in range(12)]
            for queue in queues:
                await c.create_queue(queue)
                await c.create_group(queue, "a")
                await c.create_group(queue, "b")
                await c.publish(queue, ["m1", "m2", "m3"])  # past 2: rolled over

            async def sealed(queue: str) -> int:
                return int((await c.get_queue(queue))["stats"]["sealed_extents"])

            deadline = time.monotonic() + WAIT
            while [await sealed(q) for q in queues] != [1] * len(queues):
                assert time.monotonic() < deadline, "the extents did not roll over"
                await asyncio.sleep(0.2)  # polling the queues' stats, with a deadline

            before = await calls(c)
            deadline = time.monotonic() + WAIT
            while (now := await calls(c)).get("list_every_parked_extent", 0) < before.get(
                "list_every_parked_extent", 0
            ) + 3:  # three retention passes since
                assert time.monotonic() < deadline, "no retention pass read in bulk"
                await asyncio.sleep(0.2)  # polling the node's counters, with a deadline
            for op in PER_QUEUE:  # not a read per group of each queue at each pass
                assert now.get(op, 0) - before.get(op, 0) < len(queues), (op, before, now)

            # consumed by both groups: deleted; by one only: kept
            first, second = queues[0], queues[1]
            for queue, group in ((first, "a"), (first, "b"), (second, "a")):
                acked: list[str] = []
                deadline = time.monotonic() + WAIT
                while len(acked) < 3:  # the 3 messages, over the sealed and the open extent
                    assert time.monotonic() < deadline, f"{queue}/{group}: {acked}"
                    got = await c.receive(queue, group, max_messages=3, wait_seconds=1)
                    if got:
                        await c.ack(queue, group, got)
                        acked += [m.text for m in got]
            deadline = time.monotonic() + WAIT
            while await sealed(first) != 0:
                assert time.monotonic() < deadline, "the consumed extent was not deleted"
                await asyncio.sleep(0.2)  # polling the queue's stats, with a deadline
            assert await sealed(second) == 1
    finally:
        node.stop()
