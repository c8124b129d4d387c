"""A node comes back with its data when the replicas of an open extent disagree about
how far it goes (a node with many queues: tests/integration/test_restart_breadth.py)."""

from __future__ import annotations

import asyncio
import time

from cherami.client.asyncclient import AsyncClient
from cherami.metadata.models import OPEN
from cherami.metadata.sqlite import SqliteMetadataStore
from cherami.storage.base import AppendOp
from cherami.storage.rocks import RocksExtentStore
from cherami.wire.records import Record, encode_record
from tests.support.server import ServerProcess, recovered


async def test_replicas_that_disagree_are_sealed_at_restart(fresh_server: ServerProcess) -> None:
    """One replica holds a record the others do not (a publish under way at a crash):
    that extent is sealed at what all of them hold, a new one takes the publishes, and
    the record no producer was told of is never delivered."""
    fresh_server.start()
    async with AsyncClient(fresh_server.url) as client:
        await client.create_queue("split")
        await client.create_group("split", "g")
        await client.publish("split", [f"m{i}" for i in range(10)])
    assert await asyncio.to_thread(fresh_server.stop) == 0

    data = fresh_server.data_dir
    meta = SqliteMetadataStore(str(data / "metadata.db"))
    (plain,) = [e for e in await meta.list_extents("split", (OPEN,)) if e.kind == "plain"]
    await meta.close()
    store = RocksExtentStore(str(data / plain.stores[0]))
    now = int(time.time() * 1000)
    (last,) = store.append(
        [AppendOp(plain.id, 11, [encode_record(Record(now, now, b"half-written"))])]
    )
    store.close()
    assert last == 11

    await asyncio.to_thread(fresh_server.start)
    total, kept, sealed = recovered(fresh_server)
    assert sealed == 1 and kept == total - 1
    async with AsyncClient(fresh_server.url) as client:
        await client.publish("split", ["after"])
        texts: list[str] = []
        deadline = time.monotonic() + 10
        while len(texts) < 11 and time.monotonic() < deadline:
            got = await client.receive("split", "g", max_messages=100, wait_seconds=1)
            texts += [m.text for m in got]
            await client.ack("split", "g", [m.receipt or "" for m in got])
        assert sorted(texts) == sorted([*(f"m{i}" for i in range(10)), "after"])
        assert await client.receive("split", "g", max_messages=10, wait_seconds=1) == []
        stats = (await client.get_queue("split"))["stats"]
        assert stats["sealed_extents"] >= 1
