"""Ctrl-C on ``cherami serve`` (SIGINT to the whole foreground process group, the node
and its store hosts alike) stops the node cleanly and quietly: the node stops its store
hosts itself, after the roles that read from them."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from cherami.client.asyncclient import AsyncClient
from tests.support.server import ServerProcess


async def test_ctrl_c_stops_a_node_without_a_warning(tmp_path: Path) -> None:
    node = ServerProcess(tmp_path / "node").start()
    async with AsyncClient(node.url) as client:
        for i in range(10):  # groups whose readers wait at the store hosts
            await client.create_queue(f"q{i}")
            await client.create_group(f"q{i}", "g")
            await client.publish(f"q{i}", ["x"])
    assert node.proc is not None
    os.killpg(node.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    assert await asyncio.to_thread(node.proc.wait, 30) == 0
    deadline = time.monotonic() + 5  # the last lines are still being read from its pipe
    while not any("stopped" in line for line in node.output) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert any("stopped" in line for line in node.output)
    noisy = [line for line in node.output if " WARNING " in line or " ERROR " in line]
    # dozens of "read of extent ... failed: store store-1 connection lost" before, and a
    # "3 replicas on 3 store hosts" warning for every queue (a node restarts its stores)
    assert noisy == []
