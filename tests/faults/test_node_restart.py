"""A node comes back with its data whatever it holds: many queues, a clean stop or a
SIGKILL, and replicas that disagree about how far an open extent goes."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.metadata.models import OPEN
from cherami.metadata.sqlite import SqliteMetadataStore
from cherami.storage.base import AppendOp
from cherami.storage.rocks import RocksExtentStore
from cherami.wire.records import Record, encode_record
from tests.support.server import ServerProcess

# more than the 16 at which a node could no longer restart (its recovery outlasted the
# store hosts' heartbeat window), each with two groups and so two dead-letter queues
QUEUES, GROUPS = 30, ("a", "b")
RECOVERED = re.compile(r"recovered (\d+) open extents: (\d+) kept open, (\d+) sealed")


async def _fill(url: str) -> None:
    async with AsyncClient(url, timeout=60) as client:
        limit = asyncio.Semaphore(8)

        async def one(i: int) -> None:
            async with limit:
                await client.create_queue(f"q{i}")
                for group in GROUPS:
                    await client.create_group(f"q{i}", group)
                await client.publish(f"q{i}", [f"before-{i}"])

        await asyncio.gather(*(one(i) for i in range(QUEUES)))


async def _each_delivered_once(url: str, tag: str) -> None:
    """Every queue's message in every group, then a publish and its delivery."""
    async with AsyncClient(url, timeout=30) as client:
        for i in range(QUEUES):
            await client.publish(f"q{i}", [f"{tag}-{i}"])
            for group in GROUPS:
                texts = []
                deadline = time.monotonic() + 10
                while len(texts) < 2 and time.monotonic() < deadline:
                    got = await client.receive(f"q{i}", group, max_messages=10, wait_seconds=1)
                    texts += [m.text for m in got]
                    await client.ack(f"q{i}", group, [m.receipt or "" for m in got])
                assert sorted(texts) == sorted([f"before-{i}", f"{tag}-{i}"]), (i, group)
            await client.publish(f"q{i}", [f"before-{i}"])  # for the next restart


def _recovery(server: ServerProcess) -> tuple[int, int, int]:
    found = [RECOVERED.search(line) for line in server.output]
    matches = [m for m in found if m]
    assert matches, "the node logged no recovery"
    total, kept, sealed = (int(g) for g in matches[-1].groups())
    return total, kept, sealed


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
async def test_node_with_many_queues_restarts(fresh_server: ServerProcess, how: str) -> None:
    fresh_server.start()
    await _fill(fresh_server.url)
    for round_ in range(2):  # a second restart finds the extents the first one kept
        if how == "sigterm":
            assert await asyncio.to_thread(fresh_server.stop) == 0
        else:
            await asyncio.to_thread(fresh_server.kill)
        started = time.monotonic()
        await asyncio.to_thread(fresh_server.start)
        print(f"{how} restart {round_} with {QUEUES} queues: {time.monotonic() - started:.1f} s")
        total, kept, sealed = _recovery(fresh_server)
        # a plain and a timer extent for each queue and each dead-letter queue, all idle
        # at the stop: every replica agrees, so each is kept open, none sealed
        assert (total, kept, sealed) == (QUEUES * 6, QUEUES * 6, 0)
        await _each_delivered_once(fresh_server.url, f"after-{round_}")


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
    total, kept, sealed = _recovery(fresh_server)
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
