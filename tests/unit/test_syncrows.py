"""syncrows.py: the rows of many groups' syncs read at once, and when."""

from __future__ import annotations

import asyncio

import pytest

from cherami.errors import GroupNotFound
from cherami.metadata.models import AckLevel, Extent, Group, GroupConfig, Queue, QueueConfig
from cherami.roles.outputhost.syncrows import IN_BULK_AFTER, IN_BULK_SHARE, InBulk

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
