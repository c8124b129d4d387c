"""Visibility timeouts on an injected clock (issue 28): a node's roles assembled in this
process (assembly.py, real SQLite metadata, the store host's own service in process,
roles/storehost/inprocess.py) behind the real HTTP API, their ProcessContext's clock
advanced by the test. A delivery's deadline is the context's clock plus its visibility;
nothing here waits for one to pass (these were integration tests that slept through
1-2 s timeouts)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.config import NodeConfig
from cherami.context import ProcessContext
from cherami.httpbase import listen
from cherami.membership import CONTROLLER, INPUTHOST, OUTPUTHOST, STOREHOST
from cherami.metadata.models import Extent, Host
from cherami.metadata.sqlite import SqliteMetadataStore
from cherami.periodic import Periodic
from cherami.roles.frontend.auth import KeyRing
from cherami.roles.storehost.directory import StoreDirectory, StoreWatcher
from cherami.roles.storehost.inprocess import InProcessStoreHost
from cherami.server.assembly import EVERY_ROLE, Surroundings, assemble
from cherami.wire.handshake import derive_key

KEY = derive_key(b"visibility-clock-test-secret")
IDS = {INPUTHOST: "inputhost-0", CONTROLLER: "controller-0", OUTPUTHOST: "outputhost-0"}


@dataclass
class Node:
    client: AsyncClient
    now: list[float]  # the roles' clock (monotonic seconds), advanced by the test

    def advance(self, seconds: float) -> None:
        self.now[0] += seconds


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    now = [1000.0]
    ctx = ProcessContext(clock=lambda: now[0], key=KEY)
    metadata = SqliteMetadataStore(str(tmp_path / "metadata.db"))
    hosts = [InProcessStoreHost(f"store-{i}", KEY) for i in range(3)]
    rows = [Host(id=h.store_id, role=STOREHOST, address=h.address, heartbeat_at=0.0) for h in hosts]
    rows += [Host(id=i, role=r, address="", heartbeat_at=0.0) for r, i in IDS.items()]

    async def beat() -> None:  # the hosts heartbeat (wall time: the metadata store's)
        for row in rows:
            row.heartbeat_at = time.time()
            await metadata.heartbeat(row)

    for host in hosts:
        await host.start()
    await beat()
    beats = Periodic("heartbeats", 0.5, beat)
    beats.start()
    stores = StoreDirectory(KEY, hosts=hosts)
    watcher = StoreWatcher(metadata, stores, ctx.timing.dead_after)
    await watcher.start()

    async def pick(extents: list[Extent]) -> str:
        return IDS[INPUTHOST]

    config = NodeConfig()
    roles = await assemble(
        Surroundings(
            config=config, ctx=ctx, ids=IDS, metadata=metadata, reads=metadata, stores=stores,
            watcher=watcher, keys=KeyRing([]), ready=lambda: True, pick_input_host=pick,
        ),
        EVERY_ROLE,
    )  # fmt: skip
    await roles.start()
    runner, port = await listen(roles.app, config.http, "127.0.0.1", 0, None)
    async with AsyncClient(f"http://127.0.0.1:{port}") as client:
        yield Node(client, now)
    await runner.cleanup()
    await roles.stop()
    await beats.stop()
    await watcher.stop()
    await stores.close()
    for host in hosts:
        await host.stop()
    await metadata.close()


async def _queue(node: Node, **group_config: float) -> str:
    await node.client.create_queue("q", replicas=3)
    await node.client.create_group("q", "g", **group_config)
    return "q"


async def _none_within(node: Node, seconds: float = 0.3) -> bool:
    """Nothing is delivered (while the roles' clock stands still)."""
    return await node.client.receive("q", "g", wait_seconds=seconds) == []


async def test_a_visibility_timeout_redelivers_with_a_new_receipt(node: Node) -> None:
    q = await _queue(node, visibility_timeout_seconds=30)
    await node.client.publish(q, ["task"])
    (first,) = await node.client.receive(q, "g", wait_seconds=5)
    assert first.delivery_count == 1
    node.advance(29.9)
    assert await _none_within(node)  # 30 s of visibility: not yet
    node.advance(0.2)
    (again,) = await node.client.receive(q, "g", wait_seconds=5)  # the ticker expires it
    assert again.id == first.id and again.delivery_count == 2 and again.receipt != first.receipt
    assert await node.client.ack(q, "g", [first.receipt or ""]) == {
        "acked": 0,
        "stale": [first.receipt],
    }
    assert (await node.client.ack(q, "g", [again.receipt or ""]))["acked"] == 1
    stats = (await node.client.get_group(q, "g"))["stats"]
    assert stats["redelivered"] == 1 and stats["backlog"] == 0


async def test_extending_keeps_a_delivery_past_its_first_timeout(node: Node) -> None:
    q = await _queue(node, visibility_timeout_seconds=30)
    await node.client.publish(q, ["long"])
    (m,) = await node.client.receive(q, "g", wait_seconds=5)
    for _ in range(3):  # 72 s in all, each extend 30 s from its own moment
        node.advance(24.0)
        assert (await node.client.extend(q, "g", [m.receipt or ""], 30.0))["extended"] == 1
    node.advance(29.9)
    assert await _none_within(node)
    node.advance(0.2)  # past the last extension
    (again,) = await node.client.receive(q, "g", wait_seconds=5)
    assert again.id == m.id and again.delivery_count == 2
    assert (await node.client.extend(q, "g", [m.receipt or ""], 30.0))["stale"] == [m.receipt]


async def test_a_receives_visibility_overrides_the_groups(node: Node) -> None:
    q = await _queue(node, visibility_timeout_seconds=60)
    await node.client.publish(q, ["long", "short"])
    (first,) = await node.client.receive(
        q, "g", max_messages=1, wait_seconds=5, visibility_timeout_seconds=30
    )
    (second,) = await node.client.receive(
        q, "g", max_messages=1, wait_seconds=5, visibility_timeout_seconds=0.5
    )
    node.advance(0.6)  # the shorter one times out, though a longer one came first
    (again,) = await node.client.receive(q, "g", wait_seconds=5)
    assert again.id == second.id and again.delivery_count == 2
    node.advance(29.0)  # 29.6 s: the 30 s one still out
    assert await _none_within(node)
    node.advance(1.0)
    (late,) = await node.client.receive(q, "g", wait_seconds=5)
    assert late.id == first.id and late.delivery_count == 2
    await node.client.ack(q, "g", [again.receipt or "", late.receipt or ""])
