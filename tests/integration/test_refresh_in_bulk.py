"""The output host's extent refresh syncs the groups of the queues written since the last
one; when many are (a cluster's power loss names every queue, tick after tick, while the
leader seals and reopens their extents), it reads every group's rows in four statements
(roles/outputhost/syncrows.py), not four or five reads for each group.

A real node process (every group loaded: ``group_idle_unload`` 0), its metadata calls
counted from its /metrics. Before the change, the refreshes after a write to each of 80
queues (and the extents the leader opened for them) read each group's ack levels
(``get_ack_levels``) once or more: 80 or more."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from cherami.client.asyncclient import AsyncClient
from tests.integration.test_lazy_groups import WAIT, metadata_calls
from tests.support.server import ServerProcess, unique

pytestmark = pytest.mark.timeout(180)

QUEUES = 80  # more than syncrows.IN_BULK_AFTER, twice over


def _node(root: Path, **timing: float) -> ServerProcess:
    (root / "node.json").write_text(json.dumps({"timing": timing}))
    return ServerProcess(root / "node", 1, ["--config", str(root / "node.json")]).start()


async def test_many_groups_refreshed_in_bulk_follow_their_new_extents(tmp_path: Path) -> None:
    node = _node(tmp_path, group_idle_unload=0, extent_refresh_interval=1.0)
    try:
        async with AsyncClient(node.url, timeout=30) as c:
            queues = [unique("q") for _ in range(QUEUES)]
            for queue in queues:
                await c.create_queue(queue)
                await c.create_group(queue, "g")
                await c.publish(queue, ["before"])
            for queue in queues:  # every group loaded and read from
                got = await c.receive(queue, "g", wait_seconds=5)
                assert [m.text for m in got] == ["before"]
                await c.ack(queue, "g", [m.receipt or "" for m in got])
            before = await metadata_calls(c)
            # a second extent each: every queue written, within a refresh or two
            await asyncio.gather(*(c.update_queue(q, min_extents=2) for q in queues))
            # the groups read from the extents opened since (the refresh followed them)
            sent = [f"after-{i}" for i in range(20)]
            for queue in queues:
                await c.publish(queue, sent)
            for queue in queues:
                seen: list[str] = []
                deadline = time.monotonic() + WAIT
                while sorted(seen) != sorted(sent):
                    assert time.monotonic() < deadline, f"{queue}: {len(seen)} of {len(sent)}"
                    got = await c.receive(queue, "g", max_messages=20, wait_seconds=0.5)
                    if got:  # none yet within the wait: an ack of nothing is refused
                        await c.ack(queue, "g", [m.receipt or "" for m in got])
                    seen += [m.text for m in got]
            after = await metadata_calls(c)
            assert after.get("list_extents_in", 0) > before.get("list_extents_in", 0)
            synced = after.get("get_ack_levels", 0) - before.get("get_ack_levels", 0)
            assert synced < QUEUES / 2, (synced, after)  # not a read for each group
    finally:
        node.stop()
