"""Contract: reads of many queues at once (``MetadataStore.queues_with_extents``,
``groups_of``), on
SQLite and PostgreSQL (the ``meta`` fixture, conftest.py)."""

from __future__ import annotations

from cherami.metadata import bulk
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import (
    DELETED,
    FAILING,
    OPEN,
    SEALED,
    Extent,
    Group,
    GroupConfig,
    Queue,
    QueueConfig,
)  # fmt: skip


def _queue(name: str, min_extents: int = 1) -> Queue:
    return Queue(
        name=name, config=QueueConfig(replicas=2, min_extents=min_extents), created_at=1.0,
        dlq_of=f"{name}/g" if min_extents == 0 else None, timers=min_extents == 2,
    )  # fmt: skip


def _extent(id_: str, queue: str, created_at: float) -> Extent:
    return Extent(
        id=id_, queue=queue, kind="plain", status=OPEN, input_host="in-0",
        stores=["s0", "s1"], created_at=created_at,
    )  # fmt: skip


async def test_many_queues_and_their_extents_in_one_read(meta: MetadataStore) -> None:
    """The same queues and extents as get_queue and list_extents give one by one, for
    the queues that exist among those named; the others are left out."""
    for name, min_extents in (("b", 1), ("a", 2), ("c", 0), ("other", 1)):
        await meta.insert_queue(_queue(name, min_extents))
    for n, (queue, status) in enumerate([
        ("a", OPEN), ("b", SEALED), ("a", FAILING), ("b", OPEN), ("a", DELETED),
        ("other", OPEN), ("a", OPEN),
    ]):  # fmt: skip
        extent = _extent(f"e{n}", queue, created_at=100.0 - n)  # the later the older
        assert await meta.insert_extent(extent)
        if status != OPEN:
            await meta.set_extent_status(extent.id, status)

    statuses = (OPEN, FAILING)
    read = await meta.queues_with_extents(["b", "gone", "a", "c", "a"], statuses)
    one_by_one = [
        (await meta.get_queue(n), await meta.list_extents(n, statuses)) for n in ("a", "b", "c")
    ]
    assert read == one_by_one
    assert [[e.id for e in extents] for _, extents in read] == [["e6", "e2", "e0"], ["e3"], []]
    assert read[0][0].timers and read[2][0].dlq_of == "c/g"
    assert await meta.queues_with_extents([], statuses) == []
    assert await meta.queues_with_extents(["gone"], statuses) == []
    sealed = await meta.queues_with_extents(["b"], (SEALED,))
    assert [[e.id for e in extents] for _, extents in sealed] == [["e1"]]


async def test_more_queues_than_one_statement_asks_for(meta: MetadataStore) -> None:
    names = [f"q{n:04d}" for n in range(bulk.NAMES_AT_ONCE * 2 + 3)]
    for n, name in enumerate(names):
        await meta.insert_queue(_queue(name))
        if n % 7 == 0:
            assert await meta.insert_extent(_extent(f"e{n}", name, created_at=float(n)))
    read = await meta.queues_with_extents([*reversed(names), "zzz"], (OPEN,))
    assert [q.name for q, _ in read] == names
    assert {q.name: [e.id for e in extents] for q, extents in read if extents} == {
        name: [f"e{n}"] for n, name in enumerate(names) if n % 7 == 0
    }


async def test_the_groups_of_more_queues_than_one_statement_asks_for(meta: MetadataStore) -> None:
    names = [f"q{n:04d}" for n in range(bulk.NAMES_AT_ONCE + 3)]
    for name in names:
        await meta.insert_queue(_queue(name))
        group = Group(queue=name, name="g", config=GroupConfig(), created_at=1.0, start_ms=0,
                      dlq=f"{name}.g.dlq")  # fmt: skip
        await meta.insert_group(group)
    read = await meta.groups_of([*reversed(names), "zzz"])
    assert [(g.queue, g.name, extents) for g, extents in read] == [(n, "g", []) for n in names]
