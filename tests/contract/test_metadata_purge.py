"""What goes with a deleted queue, group or extent beyond their own rows (purge.py), on
SQLite and on PostgreSQL: unit leases, and a deleted extent's row once its replicas are
dropped (``MetadataStore.purge_extent``)."""

from __future__ import annotations

import time

from cherami.metadata.base import MetadataStore
from cherami.metadata.models import (
    DELETED,
    OPEN,
    AckLevel,
    Extent,
    Group,
    GroupConfig,
    Queue,
    QueueConfig,
    Redelivery,
)


def _extent(id_: str, queue: str, predecessor: str | None = None) -> Extent:
    return Extent(
        id=id_, queue=queue, kind="plain", status=OPEN, input_host="in-0", stores=["s0"],
        created_at=time.time(), predecessor=predecessor,
    )  # fmt: skip


async def _setup(meta: MetadataStore, queue: str, group: str, dlq: str) -> None:
    for name, dlq_of in ((queue, None), (dlq, f"{queue}/{group}")):
        await meta.insert_queue(Queue(name=name, config=QueueConfig(), created_at=time.time(),
                                      dlq_of=dlq_of))  # fmt: skip
    await meta.insert_group(Group(queue=queue, name=group, config=GroupConfig(),
                                  created_at=time.time(), start_ms=0, dlq=dlq))  # fmt: skip


async def _leases(meta: MetadataStore) -> set[str]:
    return set(await meta.lease_holders("group:"))


async def test_purge_takes_a_deleted_extents_row_and_what_names_it(meta: MetadataStore) -> None:
    await _setup(meta, "q", "g", "_dlq.1.q.g")
    for id_ in ("e1", "e2"):
        await meta.insert_extent(_extent(id_, "q"))
        await meta.try_lease(f"group:q/g/{id_}", "out-0", 60)
        await meta.put_ack_levels([AckLevel(queue="q", group="g", extent=id_, acked=3)])
        await meta.put_redeliveries(
            [Redelivery(queue="q", group="g", extent=id_, key=b"k", count=1, due_ms=1)], []
        )
    await meta.try_lease("group:qq/g/e1", "out-0", 60)  # another queue, the same extent id
    assert not await meta.purge_extent("e1", "q"), "an extent not marked deleted stays"
    assert await meta.get_extent("e1") is not None
    await meta.set_extent_status("e1", DELETED)
    assert await meta.purge_extent("e1", "q")
    assert await meta.get_extent("e1") is None
    assert [a.extent for a in await meta.get_ack_levels("q", "g")] == ["e2"]
    assert [r.extent for r in await meta.get_redeliveries("q", "g")] == ["e2"]
    assert await _leases(meta) == {"group:q/g/e2", "group:qq/g/e1"}
    assert not await meta.purge_extent("e1", "q"), "purged already"


async def test_a_successor_stays_while_its_predecessor_does(meta: MetadataStore) -> None:
    await meta.insert_extent(_extent("e1", "q"))
    await meta.insert_extent(_extent("e2", "q", predecessor="e1"))
    await meta.set_extent_status("e2", DELETED)
    assert not await meta.purge_extent("e2", "q")
    await meta.set_extent_status("e1", DELETED)
    assert await meta.purge_extent("e1", "q")
    assert await meta.purge_extent("e2", "q")
    assert await meta.list_extents("q") == []


async def test_deletes_take_the_leases_of_extents_gone_for_good(meta: MetadataStore) -> None:
    await _setup(meta, "q", "g", "_dlq.1.q.g")
    await _setup(meta, "q2", "g", "_dlq.2.q2.g")
    await meta.insert_extent(_extent("live", "q"))
    await meta.insert_extent(_extent("dead", "_dlq.1.q.g"))
    names = ["group:q/g/live", "group:q/g/dead", "group:q/g/*", "group:q2/g/x", "group:q.x/g/y"]
    for name in names:
        await meta.try_lease(name, "out-0", 60)
    await meta.delete_group("q", "g")
    # its dead-letter extent's lease went (that extent goes with it); the lease on the
    # queue's live extent stays, so the name never starts its epochs again
    assert await _leases(meta) == set(names) - {"group:q/g/dead"}
    await meta.delete_queue("q")
    assert await _leases(meta) == {"group:q2/g/x", "group:q.x/g/y"}
