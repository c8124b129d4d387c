"""One contract for every MetadataStore implementation."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cherami.errors import AlreadyExists, GroupNotFound, QueueNotFound
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import (
    OPEN,
    SEALED,
    AckLevel,
    Extent,
    Group,
    GroupConfig,
    Host,
    Queue,
    QueueConfig,
)
from cherami.metadata.sqlite import SqliteMetadataStore


@pytest.fixture(params=["sqlite"])
async def meta(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MetadataStore]:
    store = SqliteMetadataStore(str(tmp_path / "metadata.db"))
    yield store
    await store.close()


def _queue(name: str = "q1") -> Queue:
    return Queue(name=name, config=QueueConfig(replicas=3), created_at=time.time())


def _extent(id_: str, queue: str = "q1", predecessor: str | None = None) -> Extent:
    return Extent(
        id=id_,
        queue=queue,
        kind="plain",
        status=OPEN,
        input_host="in-0",
        stores=["s0", "s1"],
        created_at=time.time(),
        predecessor=predecessor,
    )


async def test_queue_lifecycle(meta: MetadataStore) -> None:
    await meta.insert_queue(_queue())
    with pytest.raises(AlreadyExists):
        await meta.insert_queue(_queue())
    got = await meta.get_queue("q1")
    assert got.config.replicas == 3
    got.config.min_extents = 4
    await meta.update_queue(got)
    assert (await meta.get_queue("q1")).config.min_extents == 4
    assert [q.name for q in await meta.list_queues()] == ["q1"]
    await meta.delete_queue("q1")
    with pytest.raises(QueueNotFound):
        await meta.get_queue("q1")


async def test_group_lifecycle(meta: MetadataStore) -> None:
    await meta.insert_queue(_queue())
    group = Group(
        queue="q1",
        name="g",
        config=GroupConfig(max_delivery_count=3),
        created_at=time.time(),
        start_ms=0,
        dlq="_dlq.1",
    )
    await meta.insert_group(group)
    with pytest.raises(AlreadyExists):
        await meta.insert_group(group)
    assert (await meta.get_group("q1", "g")).config.max_delivery_count == 3
    assert [g.name for g in await meta.list_groups("q1")] == ["g"]
    await meta.delete_group("q1", "g")
    with pytest.raises(GroupNotFound):
        await meta.get_group("q1", "g")


async def test_extents_and_conditional_successor(meta: MetadataStore) -> None:
    assert await meta.insert_extent(_extent("e1"))
    assert await meta.insert_extent(_extent("e2", predecessor="e1"))
    assert not await meta.insert_extent(_extent("e3", predecessor="e1"))
    await meta.set_extent_status("e1", SEALED, sealed_seq=42)
    sealed = await meta.get_extent("e1")
    assert sealed is not None and (sealed.status, sealed.sealed_seq) == (SEALED, 42)
    assert [e.id for e in await meta.list_extents("q1", (OPEN,))] == ["e2"]
    assert {e.id for e in await meta.list_extents("q1")} == {"e1", "e2"}
    assert await meta.get_extent("nope") is None


async def test_ack_levels_upsert(meta: MetadataStore) -> None:
    await meta.put_ack_levels(
        [
            AckLevel(queue="q1", group="g", extent="e1", level=b"\x01", acked=1),
            AckLevel(queue="q1", group="g", extent="e2", level=b"", acked=0, limit=b"\x09"),
        ]
    )
    await meta.put_ack_levels(
        [AckLevel(queue="q1", group="g", extent="e1", level=b"\x05", acked=5)]
    )
    levels = {a.extent: a for a in await meta.get_ack_levels("q1", "g")}
    assert (levels["e1"].level, levels["e1"].acked) == (b"\x05", 5)
    assert levels["e2"].limit == b"\x09"
    await meta.delete_ack_levels("q1", "g", ["e2"])
    assert [a.extent for a in await meta.get_ack_levels("q1", "g")] == ["e1"]
    assert await meta.get_ack_levels("q1", "other") == []


async def test_hosts_and_lease(meta: MetadataStore) -> None:
    await meta.heartbeat(
        Host(id="s0", role="storehost", address="127.0.0.1:1", heartbeat_at=time.time())
    )
    await meta.heartbeat(
        Host(id="s1", role="storehost", address="127.0.0.1:2", heartbeat_at=time.time() - 60)
    )
    assert [h.id for h in await meta.list_hosts("storehost", alive_within=10)] == ["s0"]
    assert await meta.try_lease("controller", "c1", ttl_seconds=5)
    assert await meta.try_lease("controller", "c1", ttl_seconds=5)
    assert not await meta.try_lease("controller", "c2", ttl_seconds=5)
    assert await meta.try_lease("other", "c2", ttl_seconds=5)
