"""A node whose process is held up longer than ``timing.dead_after`` (a burst of work on
its one event loop, here a SIGSTOP) does not count its own hosts dead when it runs
again: their heartbeats could not be written meanwhile, and the leader, looking right
after, found its input host silent and opened a second extent for half of 10,000 queues
(membership.py, LoopWatch). A real node process; what is waited for is the node's own
metadata call counter, polled with a deadline."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import pytest

from cherami.client.asyncclient import AsyncClient
from tests.support.server import ServerProcess, unique

pytestmark = pytest.mark.timeout(120)

CALLS = re.compile(r'^cherami_metadata_call_latency_seconds_count\{op="([^"]+)"\} (\S+)$', re.M)
DEAD_AFTER = 3.0  # the default timing.dead_after
WAIT = 30.0


async def calls(client: AsyncClient, op: str) -> float:
    async with client.session.get(client.url + "/metrics") as resp:
        found = dict(CALLS.findall(await resp.text()))
    return float(found.get(op, 0))


async def test_a_node_held_up_past_dead_after_keeps_its_hosts_and_extents(
    tmp_path: Path,
) -> None:
    node = ServerProcess(tmp_path / "node", 3).start()
    queues = [unique("q") for _ in range(3)]
    try:
        async with AsyncClient(node.url, timeout=30) as c:
            for queue in queues:  # a group each, and a message named after its queue
                await c.create_queue(queue)
                await c.create_group(queue, "g")
                await c.publish(queue, [queue])
            opened = sum("opened for queue" in line for line in node.output)
            replaced = sum("extents of lost hosts" in line for line in node.output)
            assert node.proc is not None
            os.kill(node.proc.pid, signal.SIGSTOP)  # the store hosts, its children, run on
            try:
                time.sleep(DEAD_AFTER + 2)  # the fault: held up past dead_after
            finally:
                os.kill(node.proc.pid, signal.SIGCONT)
            start = await calls(c, "changes_since")
            deadline = time.monotonic() + WAIT
            while await calls(c, "changes_since") < start + 8:  # the leader ticked since
                assert time.monotonic() < deadline, "the node's ticks did not go on"
                await asyncio.sleep(0.1)  # polling the node's counter, with a deadline
            now_replaced = sum("extents of lost hosts" in line for line in node.output)
            assert now_replaced == replaced, "\n".join(list(node.output)[-20:])
            assert sum("opened for queue" in line for line in node.output) == opened
            for queue in queues:  # and it serves as before
                got = await c.receive(queue, "g", wait_seconds=5)
                assert [m.text for m in got] == [queue]
                await c.ack(queue, "g", got)
    finally:
        node.stop()
