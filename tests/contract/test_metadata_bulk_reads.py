"""Contract: reads of many queues at once (``MetadataStore.queues_with_extents``) and of
many named groups (``groups_named``, ``ack_levels_named``, ``groups_with_parked``), on
SQLite and PostgreSQL (the ``meta`` fixture, conftest.py)."""

from __future__ import annotations

from cherami.metadata import bulk
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import (
    DELETED,
    FAILING,
    OPEN,
    SEALED,
    AckLevel,
    Extent,
    Group,
    GroupConfig,
    Queue,
    QueueConfig,
    Redelivery,
)


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


def _group(queue: str, name: str) -> Group:
    return Group(queue=queue, name=name, config=GroupConfig(), created_at=2.0, start_ms=5,
                 dlq=f"{queue}.{name}.dlq")  # fmt: skip


async def test_named_groups_their_levels_and_which_have_parked_messages(
    meta: MetadataStore,
) -> None:
    """The records, ack levels and parked state of the (queue, group) pairs named, as
    get_group, get_ack_levels and get_redeliveries give them one by one: the pairs
    named, not every group of the queues named nor every queue of the names."""
    for queue in ("a", "b"):
        await meta.insert_queue(_queue(queue))
        for name in ("g1", "g2"):
            await meta.insert_group(_group(queue, name))
            await meta.put_ack_levels([
                AckLevel(queue=queue, group=name, extent=f"{queue}-e{n}", level=b"\x00\x01",
                         acked=n + 1, limit=b"\x09" if n == 1 else None)
                for n in range(2)
            ])  # fmt: skip
    parked = [("a", "g2", "a-e0"), ("a", "g2", "a-e1"), ("b", "g1", "b-e0")]
    await meta.put_redeliveries(
        [Redelivery(queue=q, group=g, extent=e, key=b"k", count=1, due_ms=0) for q, g, e in parked],
        [],
    )
    named = [("b", "g1"), ("a", "g2"), ("a", "nope"), ("gone", "g1"), ("a", "g2")]
    groups = await meta.groups_named(named)
    assert groups == [await meta.get_group("a", "g2"), await meta.get_group("b", "g1")]
    levels = await meta.ack_levels_named(named)
    one_by_one = [*await meta.get_ack_levels("a", "g2"), *await meta.get_ack_levels("b", "g1")]
    assert levels == sorted(one_by_one, key=lambda lv: (lv.queue, lv.group, lv.extent))
    assert [lv.limit for lv in levels] == [None, b"\x09", None, b"\x09"]
    assert await meta.groups_with_parked(named) == [("a", "g2"), ("b", "g1")]
    assert await meta.groups_with_parked([("a", "g1"), ("b", "g2")]) == []
    for read in (meta.groups_named, meta.ack_levels_named, meta.groups_with_parked):
        assert await read([]) == []


async def test_more_groups_than_one_statement_asks_for(meta: MetadataStore) -> None:
    await meta.insert_queue(_queue("q"))
    names = [f"g{n:04d}" for n in range(bulk.NAMES_AT_ONCE + 3)]
    for n, name in enumerate(names):
        await meta.insert_group(_group("q", name))
        if n % 5 == 0:
            await meta.put_ack_levels([AckLevel(queue="q", group=name, extent="e", acked=n)])
            await meta.put_redeliveries(
                [Redelivery(queue="q", group=name, extent="e", key=b"k", count=1, due_ms=0)], []
            )
    keys = [("q", name) for name in reversed(names)]
    assert [g.name for g in await meta.groups_named(keys)] == names
    every_fifth = [name for n, name in enumerate(names) if n % 5 == 0]
    assert [lv.group for lv in await meta.ack_levels_named(keys)] == every_fifth
    assert await meta.groups_with_parked(keys) == [("q", name) for name in every_fifth]
