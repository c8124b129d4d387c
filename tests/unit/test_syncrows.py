"""syncrows.py: the rows of many groups' syncs read at once, and when: every group's
(InBulk, for a refresh) or those named (Named, for a take), on a real SQLite store."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from cherami.errors import GroupNotFound, QueueNotFound
from cherami.metadata.models import (
    AckLevel,
    Extent,
    Group,
    GroupConfig,
    Queue,
    QueueConfig,
    Redelivery,
)
from cherami.metadata.sqlite import SqliteMetadataStore
from cherami.roles.outputhost.syncrows import (
    EVERY,
    IN_BULK_AFTER,
    IN_BULK_SHARE,
    NAMED_AFTER,
    InBulk,
    Key,
    Named,
    OneByOne,
)
from tests.support.counted import Counted

OPEN, SEALED, CONSUMED, DELETED = "open", "sealed", "consumed", "deleted"


def extent(id_: str, queue: str, status: str, at: float) -> Extent:
    return Extent(id=id_, queue=queue, kind="plain", status=status, input_host="i",
                  stores=["s"], created_at=at)  # fmt: skip


class Store:
    """The four bulk reads InBulk makes, and how many were made."""

    def __init__(self) -> None:
        self.calls = 0
        self.extents = [
            extent("e1", "q", SEALED, 1.0), extent("e2", "q", OPEN, 2.0),
            extent("d1", "q.g.dlq", DELETED, 1.5), extent("x", "other", CONSUMED, 3.0),
        ]  # fmt: skip

    async def list_every_group(self) -> list[Group]:
        self.calls += 1
        return [Group(queue="q", name="g", config=GroupConfig(), created_at=0.0, start_ms=0,
                      dlq="q.g.dlq")]  # fmt: skip

    async def list_queues(self) -> list[Queue]:
        self.calls += 1
        return [Queue(name="q", config=QueueConfig(), created_at=0.0)]

    async def list_every_ack_level(self) -> list[AckLevel]:
        self.calls += 1
        return [AckLevel(queue="q", group="g", extent="e1", acked=3),
                AckLevel(queue="q", group="h", extent="e1", acked=1)]  # fmt: skip

    async def list_extents_in(self, statuses: tuple[str, ...]) -> list[Extent]:
        self.calls += 1
        return [e for e in self.extents if e.status in statuses]

    async def get_redeliveries(self, queue: str, group: str) -> list[Redelivery]:
        self.calls += 1
        return [Redelivery(queue=queue, group=group, extent="e1", key=b"k", count=1)]


def test_rows_are_each_groups_as_read_one_by_one() -> None:
    async def run() -> None:
        store = Store()
        rows = await InBulk.read(store)  # type: ignore[arg-type]
        assert store.calls == 4
        group, queue = await rows.records("q", "g")
        assert (group.name, queue.name) == ("g", "q")
        with pytest.raises(GroupNotFound):
            await rows.records("q", "nope")
        assert [lv.acked for lv in await rows.levels("q", "g")] == [3]
        assert await rows.levels("q", "none") == []
        assert [e.id for e in await rows.extents("q")] == ["e1", "e2"]  # oldest first
        assert [e.id for e in await rows.extents("q", (OPEN,))] == ["e2"]
        # a dead-letter queue's extents whatever their status (merged ranges, by id)
        assert await rows.extents("q.g.dlq") == []
        assert [e.id for e in await rows.extents("q.g.dlq", (DELETED,))] == ["d1"]
        assert store.calls == 4  # nothing more read
        assert len(await rows.redeliveries("q", "g")) == 1  # read when the sync asks
        assert store.calls == 5

    asyncio.run(run())


def test_read_in_bulk_only_for_many_stale_groups_among_those_loaded() -> None:
    def bulk(stale: list[str], loaded: list[str]) -> bool:
        return asyncio.run(InBulk.when(stale, loaded, Store())) is not None  # type: ignore[arg-type]

    many = [f"q{i}/g" for i in range(IN_BULK_AFTER + 1)]
    assert not bulk(many[:IN_BULK_AFTER], many)  # a few: one by one
    assert bulk(many, many)
    assert not bulk(many + ["unloaded/g"] * 9, many[:IN_BULK_AFTER])  # counted if loaded
    others = [f"r{i}/g" for i in range(len(many) * (IN_BULK_SHARE - 1) + 1)]
    assert not bulk(many, many + others)  # under a share of those loaded
    assert bulk(many, many + others[:-1])


@pytest.fixture
async def meta(tmp_path: Path) -> Any:
    store = SqliteMetadataStore(str(tmp_path / "meta.db"))
    yield store
    await store.close()


async def _catalog(meta: SqliteMetadataStore, queues: int) -> list[Key]:
    """``queues`` queues of groups a and b, extents of each status; every third group
    has a DLQ range merged back (a level with a limit), every fifth a parked message."""
    keys: list[Key] = []
    for i in range(queues):
        q = f"q{i:03d}"
        await meta.insert_queue(Queue(name=q, config=QueueConfig(), created_at=1.0))
        for n, status in enumerate((SEALED, OPEN, CONSUMED, DELETED)):
            await meta.insert_extent(extent(f"{q}-e{n}", q, OPEN, at=float(n)))
            if status != OPEN:
                await meta.set_extent_status(f"{q}-e{n}", status)
        for g in ("a", "b"):
            dlq = f"_dlq.{q}.{g}"
            await meta.insert_group(Group(queue=q, name=g, config=GroupConfig(), created_at=1.0,
                                          start_ms=0, dlq=dlq))  # fmt: skip
            levels = [AckLevel(queue=q, group=g, extent=f"{q}-e0", acked=i)]
            if len(keys) % 3 == 0:
                await meta.insert_queue(Queue(name=dlq, config=QueueConfig(), created_at=1.0,
                                              dlq_of=f"{q}/{g}"))  # fmt: skip
                await meta.insert_extent(extent(f"{dlq}-d", dlq, OPEN, at=0.5))
                await meta.set_extent_status(f"{dlq}-d", DELETED)
                levels.append(AckLevel(queue=q, group=g, extent=f"{dlq}-d", limit=b"z"))
            await meta.put_ack_levels(levels)
            if len(keys) % 5 == 0:
                parked = Redelivery(queue=q, group=g, extent=f"{q}-e1", key=b"k", count=2)
                await meta.put_redeliveries([parked], [])
            keys.append((q, g))
    return keys


async def _read(rows: Any, key: Key) -> tuple[Any, ...]:
    """What a group's sync reads (service.py ``_sync``)."""
    group, queue = await rows.records(*key)
    levels = await rows.levels(*key)
    merged = any(lv.limit is not None for lv in levels)  # a DLQ range merged back
    dlq = await rows.extents(group.dlq, EVERY) if merged else None
    return group, queue, levels, await rows.extents(key[0]), dlq, await rows.redeliveries(*key)


async def test_named_rows_are_each_groups_as_read_one_by_one_in_a_few_reads(
    meta: SqliteMetadataStore,
) -> None:
    """A take of 200 groups (ownership.py) read four to six calls for each of them one
    after another: 3,000 each of get_ack_levels, list_extents and get_redeliveries in a
    power-loss round at 1,000 queues. Named reads them in a call of each kind, and the
    parked messages of only the groups that have some."""
    keys = await _catalog(meta, 100)
    counting = Counted(meta)
    rows = await Named.read(counting, keys)  # type: ignore[arg-type]
    assert counting.calls == {"groups_named": 1, "ack_levels_named": 1,
                              "queues_with_extents": 2, "groups_with_parked": 1}  # fmt: skip
    one_by_one = OneByOne(meta)
    for key in keys:
        assert await _read(rows, key) == await _read(one_by_one, key), key
    # the parked rows of the groups that have some (every fifth); nothing else read
    assert counting.calls.pop("get_redeliveries") == len(keys) // 5
    assert counting.calls == {"groups_named": 1, "ack_levels_named": 1,
                              "queues_with_extents": 2, "groups_with_parked": 1}  # fmt: skip


async def test_named_rows_of_groups_gone_or_not_named(meta: SqliteMetadataStore) -> None:
    """A group deleted before the read is not found, as by get_group; one whose queue's
    record is gone, as by get_queue; a group not named (a load outside the take) reads
    its own rows."""
    keys = await _catalog(meta, 2)
    await meta.delete_group("q000", "b")
    counting = Counted(meta)
    rows = await Named.read(counting, [*keys, ("nope", "a")])  # type: ignore[arg-type]
    for key in (("q000", "b"), ("nope", "a")):
        with pytest.raises(GroupNotFound):
            await rows.records(*key)
    before = dict(counting.calls)
    assert await _read(rows, ("q001", "a")) == await _read(OneByOne(meta), ("q001", "a"))
    assert counting.calls == before  # named: nothing more read (nothing parked)
    rows = await Named.read(counting, [("q000", "a"), ("q001", "a")])  # type: ignore[arg-type]
    assert await _read(rows, ("q001", "b")) == await _read(OneByOne(meta), ("q001", "b"))
    assert counting.calls["get_group"] == 1 and counting.calls["get_ack_levels"] == 1
    group = await meta.get_group("q000", "a")
    orphan = Named(meta, ({("q000", "a"): group}, {}, {}), {}, ({("q000", "a")}, set()))
    with pytest.raises(QueueNotFound):
        await orphan.records("q000", "a")
    assert await Named.when(keys[:NAMED_AFTER], meta) is None  # a few: each its own
    assert await Named.when(keys[: NAMED_AFTER + 1], meta) is not None
