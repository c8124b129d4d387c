"""One contract for every MetadataStore implementation."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest
from psycopg import sql

from cherami.errors import AlreadyExists, Fenced, GroupNotFound, InvalidRequest, QueueNotFound
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import (
    DELETED,
    FAILING,
    OPEN,
    SEALED,
    AckLevel,
    Extent,
    ExtentLoad,
    Fence,
    Group,
    GroupConfig,
    Host,
    LoadReport,
    Queue,
    QueueConfig,
    Redelivery,
)
from cherami.metadata.open import MetadataTarget, open_metadata, parse_metadata_url
from cherami.metadata.postgres import PostgresMetadataStore
from cherami.metadata.postgres_schema import MIGRATIONS
from cherami.metadata.sqlite import SqliteMetadataStore
from tests.contract.conftest import POSTGRES_URL, MetadataBackend

# The `meta` and `metadata_backend` fixtures (conftest.py) run each test on SQLite and on
# PostgreSQL.


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


async def test_every_group_of_every_queue_in_one_read(meta: MetadataStore) -> None:
    assert await meta.list_every_group() == []
    for queue in ("q2", "q1"):
        await meta.insert_queue(_queue(queue))
        for name in ("b", "a"):
            group = Group(queue=queue, name=name, config=GroupConfig(), created_at=0,
                          start_ms=0, dlq=f"_dlq.{queue}")  # fmt: skip
            await meta.insert_group(group)
    listed = await meta.list_every_group()
    assert [(g.queue, g.name) for g in listed] == [("q1", "a"), ("q1", "b"), ("q2", "a"),
                                                    ("q2", "b")]  # fmt: skip
    assert listed[0] == await meta.get_group("q1", "a")
    await meta.delete_queue("q2")
    assert [(g.queue, g.name) for g in await meta.list_every_group()] == [("q1", "a"), ("q1", "b")]


async def test_every_ack_level_in_one_read(meta: MetadataStore) -> None:
    """What ``get_ack_levels`` says of each group, for every group at once (a scrape of
    many groups not loaded)."""
    assert await meta.list_every_ack_level() == []
    rows = [
        AckLevel(queue="q2", group="a", extent="e3", level=b"\x00\x07", acked=7),
        AckLevel(queue="q1", group="b", extent="e2", level=b"", acked=0, limit=b"\x00\x02"),
        AckLevel(queue="q1", group="b", extent="e1", level=b"\x01", acked=1),
        AckLevel(queue="q1", group="a", extent="e1", level=b"\x03", acked=3),
    ]
    await meta.put_ack_levels(rows)
    every = await meta.list_every_ack_level()
    assert [(a.queue, a.group, a.extent) for a in every] == [
        ("q1", "a", "e1"), ("q1", "b", "e1"), ("q1", "b", "e2"), ("q2", "a", "e3")]  # fmt: skip
    assert every == [
        a for q, g in (("q1", "a"), ("q1", "b"), ("q2", "a")) for a in sorted(
            await meta.get_ack_levels(q, g), key=lambda a: a.extent)
    ]  # fmt: skip
    assert every[2].limit == b"\x00\x02" and every[3].level == b"\x00\x07"
    await meta.delete_ack_levels("q1", "b", ["e1", "e2"])
    assert [(a.queue, a.group) for a in await meta.list_every_ack_level()] == [
        ("q1", "a"), ("q2", "a")]  # fmt: skip


async def test_every_parked_extent_in_one_read(meta: MetadataStore) -> None:
    assert await meta.list_every_parked_extent() == []
    await meta.put_redeliveries([
        Redelivery(queue="q2", group="a", extent="e3", key=b"\x01", count=1, due_ms=0),
        Redelivery(queue="q1", group="b", extent="e1", key=b"\x02", count=1, due_ms=0),
        Redelivery(queue="q1", group="a", extent="e1", key=b"\x01", count=2, due_ms=0),
    ], [])  # fmt: skip
    assert await meta.list_every_parked_extent() == [("q1", "e1"), ("q2", "e3")]


async def test_every_merged_dead_letter_extent_in_one_read(meta: MetadataStore) -> None:
    """What ``get_ack_levels`` and ``list_extents(group.dlq)`` say of each group, for
    every group at once: the ranges merged back whose DLQ extent's row is there."""
    assert await meta.list_merged_extents() == []
    for queue in ("q2", "q1"):
        await meta.insert_queue(_queue(queue))
        for name in ("b", "a"):
            group = Group(queue=queue, name=name, config=GroupConfig(), created_at=0,
                          start_ms=0, dlq=f"{queue}.{name}.dlq")  # fmt: skip
            await meta.insert_group(group)
            assert await meta.insert_extent(_extent(f"{queue}.{name}.d1", f"{queue}.{name}.dlq"))
            assert await meta.insert_extent(_extent(f"{queue}.{name}.d2", f"{queue}.{name}.dlq"))
    await meta.put_ack_levels([
        AckLevel(queue="q2", group="a", extent="q2.a.d2", limit=b"\x05"),
        AckLevel(queue="q1", group="b", extent="q1.b.d1", limit=b"\x01"),
        AckLevel(queue="q1", group="b", extent="q1.b.d2", limit=b"\x02"),
        AckLevel(queue="q1", group="a", extent="q1.a.d1", acked=3),  # no range merged
        AckLevel(queue="q1", group="a", extent="q2.a.d1", limit=b"\x01"),  # another's DLQ
        AckLevel(queue="q1", group="a", extent="gone", limit=b"\x01"),  # no such extent
        AckLevel(queue="q3", group="a", extent="q1.a.d2", limit=b"\x01"),  # no such group
    ])  # fmt: skip
    merged = [("q1", "b", "q1.b.d1"), ("q1", "b", "q1.b.d2"), ("q2", "a", "q2.a.d2")]
    assert await meta.list_merged_extents() == merged
    # the groups of the queues named, each with its merged extents (the same rule)
    read = await meta.groups_of({"q1", "gone"})
    assert [(g.name, g.dlq, extents) for g, extents in read] == [
        ("a", "q1.a.dlq", []), ("b", "q1.b.dlq", ["q1.b.d1", "q1.b.d2"]),
    ]  # fmt: skip
    assert read[0][0] == await meta.get_group("q1", "a")
    assert [(g.queue, g.name) for g, _ in await meta.groups_of(["q2", "q1"])] == [
        ("q1", "a"), ("q1", "b"), ("q2", "a"), ("q2", "b"),
    ]  # fmt: skip
    assert await meta.groups_of([]) == []
    await meta.set_extent_status("q1.b.d1", SEALED, sealed_seq=3)  # any status: its row is there
    assert await meta.list_merged_extents() == merged
    await meta.delete_group("q2", "a")
    assert await meta.list_merged_extents() == merged[:2]


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
    # a merge that read the level before the group acked further: its limit lands, its
    # level does not move the stored one back
    await meta.put_ack_levels(
        [AckLevel(queue="q1", group="g", extent="e2", level=b"\x04", acked=4)]
    )
    await meta.put_ack_levels(
        [AckLevel(queue="q1", group="g", extent="e2", level=b"", acked=0, limit=b"\x0c")]
    )
    levels = {a.extent: a for a in await meta.get_ack_levels("q1", "g")}
    assert (levels["e2"].level, levels["e2"].acked, levels["e2"].limit) == (b"\x04", 4, b"\x0c")
    await meta.put_ack_levels(  # a stale level with a stale limit changes nothing
        [AckLevel(queue="q1", group="g", extent="e2", level=b"\x02", acked=2, limit=b"\x09")]
    )
    levels = {a.extent: a for a in await meta.get_ack_levels("q1", "g")}
    assert (levels["e2"].level, levels["e2"].acked, levels["e2"].limit) == (b"\x04", 4, b"\x0c")
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


async def test_records_round_trip_and_list_in_code_point_order(meta: MetadataStore) -> None:
    for name in ("b", "B", "a", "A", "_z"):
        await meta.insert_queue(_queue(name))
    assert [q.name for q in await meta.list_queues()] == ["A", "B", "_z", "a", "b"]
    queue = Queue(
        name="full",
        config=QueueConfig(type="cp", replicas=2, delay_seconds=1.5, retention_seconds=60),
        created_at=1234.5,
        dlq_of="other/g",
    )
    await meta.insert_queue(queue)
    assert await meta.get_queue("full") == queue
    extent = _extent("e1")
    extent.sealed_seq = 1 << 40
    assert await meta.insert_extent(extent)
    assert await meta.get_extent("e1") == extent


async def test_extent_status_and_duplicate_ids(meta: MetadataStore) -> None:
    assert await meta.insert_extent(_extent("e1"))
    assert not await meta.insert_extent(_extent("e1"))
    assert await meta.insert_extent(_extent("e2"))
    await meta.set_extent_status("e1", SEALED, sealed_seq=7)
    await meta.set_extent_status("e1", SEALED)  # keeps the sealed sequence number
    sealed = await meta.get_extent("e1")
    assert sealed is not None and sealed.sealed_seq == 7
    assert {e.id for e in await meta.list_extents("q1", (OPEN, SEALED))} == {"e1", "e2"}
    assert await meta.list_extents("q1", (DELETED,)) == []
    # an input host's report of a failing extent lands after its seal (issue 33, part 1):
    # a sealed extent stays sealed; an open one becomes failing, then sealed
    await meta.set_extent_status("e1", FAILING)
    assert (await meta.get_extent("e1")).status == SEALED  # type: ignore[union-attr]
    await meta.set_extent_status("e2", FAILING)
    assert (await meta.get_extent("e2")).status == FAILING  # type: ignore[union-attr]
    await meta.set_extent_status("e2", SEALED, sealed_seq=3)
    assert (await meta.get_extent("e2")).status == SEALED  # type: ignore[union-attr]
    assert await meta.list_extents("other") == []


async def test_extents_in_statuses_across_queues(meta: MetadataStore) -> None:
    assert await meta.insert_extent(_extent("e1"))
    assert await meta.insert_extent(msgspec.structs.replace(_extent("e2"), queue="q2"))
    assert await meta.insert_extent(msgspec.structs.replace(_extent("e3"), queue="q3"))
    await meta.set_extent_status("e3", SEALED, sealed_seq=1)
    assert {(e.id, e.queue) for e in await meta.list_extents_in((OPEN,))} == {
        ("e1", "q1"),
        ("e2", "q2"),
    }
    assert {e.id for e in await meta.list_extents_in((OPEN, SEALED))} == {"e1", "e2", "e3"}
    assert await meta.list_extents_in((DELETED,)) == []


async def test_delete_queue_takes_groups_and_ack_levels(meta: MetadataStore) -> None:
    await meta.insert_queue(_queue())
    await meta.insert_group(
        Group(queue="q1", name="g", config=GroupConfig(), created_at=0, start_ms=0, dlq="d")
    )
    assert await meta.insert_extent(_extent("e1"))
    await meta.put_ack_levels([AckLevel(queue="q1", group="g", extent="e1", acked=1)])
    await meta.delete_ack_levels("q1", "g", [])
    await meta.delete_queue("q1")
    assert await meta.list_groups("q1") == []
    assert await meta.get_ack_levels("q1", "g") == []
    assert [e.status for e in await meta.list_extents("q1")] == [DELETED]


async def test_ack_levels_never_move_backward(meta: MetadataStore) -> None:
    await meta.put_ack_levels(
        [AckLevel(queue="q1", group="g", extent="e1", level=b"\x05", acked=5)]
    )
    await meta.put_ack_levels(
        [
            AckLevel(queue="q1", group="g", extent="e1", level=b"\x03", acked=3),
            AckLevel(queue="q1", group="g", extent="e2", level=b"\x01", acked=1),
        ]
    )
    levels = {a.extent: (a.level, a.acked) for a in await meta.get_ack_levels("q1", "g")}
    assert levels == {"e1": (b"\x05", 5), "e2": (b"\x01", 1)}


async def test_lease_holder(meta: MetadataStore) -> None:
    assert await meta.lease_holder("controller") is None
    assert await meta.try_lease("controller", "c1", ttl_seconds=5)
    assert await meta.lease_holder("controller") == "c1"
    assert await meta.try_lease("expired", "c1", ttl_seconds=0)
    assert await meta.lease_holder("expired") is None


async def test_many_leases_taken_in_one_call(meta: MetadataStore) -> None:
    """What one ``try_lease`` of each would give: another's unexpired lease is left out,
    an expired one is taken at the next epoch, a renewal keeps its epoch."""
    assert await meta.try_lease("b", "o2", ttl_seconds=5) == 1
    assert await meta.try_lease("c", "o2", ttl_seconds=0) == 1  # expired
    first = await meta.try_leases(["a", "b", "c", "d", "a"], "o1", ttl_seconds=5)
    assert first == {"a": 1, "c": 2, "d": 1}
    assert await meta.try_leases(["d", "a"], "o1", ttl_seconds=5) == {"a": 1, "d": 1}
    assert await meta.lease_holders("") == {"a": "o1", "b": "o2", "c": "o1", "d": "o1"}
    assert await meta.try_leases([], "o1", ttl_seconds=5) == {}


async def test_lease_holders_by_prefix(meta: MetadataStore) -> None:
    assert await meta.try_lease("group:q/g_1/e1", "o1", ttl_seconds=5)
    assert await meta.try_lease("group:q/g_1/e2", "o2", ttl_seconds=5)
    assert await meta.try_lease("group:q/g_1/e3", "o2", ttl_seconds=0)  # expired
    assert await meta.try_lease("group:q/gx1/e1", "o1", ttl_seconds=5)  # "_" is no wildcard
    assert await meta.try_lease("group:q/g_10/e1", "o1", ttl_seconds=5)
    assert await meta.lease_holders("group:q/g_1/") == {
        "group:q/g_1/e1": "o1",
        "group:q/g_1/e2": "o2",
    }
    assert await meta.lease_holders("nothing:") == {}


async def test_leases_are_renewed_in_bulk_only_by_their_holder(meta: MetadataStore) -> None:
    mine = await meta.try_lease("group:q/g/e1", "o1", ttl_seconds=0)  # run out, not taken
    assert mine is not None
    assert await meta.try_lease("group:q/g/e2", "o1", ttl_seconds=5) == 1
    assert await meta.try_lease("group:q/g/e3", "o1", ttl_seconds=0)
    taken = await meta.try_lease("group:q/g/e3", "o2", ttl_seconds=5)  # passed on
    assert taken == 2
    names = ["group:q/g/e1", "group:q/g/e2", "group:q/g/e3", "group:q/g/never"]
    renewed = await meta.renew_leases(names, "o1", ttl_seconds=5)
    assert renewed == {"group:q/g/e1": mine, "group:q/g/e2": 1}  # epochs kept
    assert await meta.lease_holders("group:q/g/") == {
        "group:q/g/e1": "o1", "group:q/g/e2": "o1", "group:q/g/e3": "o2",
    }  # fmt: skip
    assert not await meta.try_lease("group:q/g/e1", "o2", ttl_seconds=5)  # renewed: still o1's
    assert await meta.renew_leases([], "o1", ttl_seconds=5) == {}
    many = [f"group:q/h/e{i}" for i in range(2000)]  # more than one statement's parameters
    for name in many[:3]:
        assert await meta.try_lease(name, "o1", ttl_seconds=5)
    assert set(await meta.renew_leases(many, "o1", ttl_seconds=5)) == set(many[:3])


async def test_expired_lease_passes_to_another_holder(meta: MetadataStore) -> None:
    assert await meta.try_lease("controller", "c1", ttl_seconds=0)
    assert await meta.try_lease("controller", "c2", ttl_seconds=5)
    assert await meta.lease_holder("controller") == "c2"
    assert not await meta.try_lease("controller", "c1", ttl_seconds=5)


async def test_reopening_keeps_the_data(metadata_backend: MetadataBackend) -> None:
    first = await metadata_backend.open()
    await first.insert_queue(_queue())
    second = await metadata_backend.open()  # PostgreSQL: migrations already applied
    assert (await second.get_queue("q1")).name == "q1"


async def test_concurrent_successors_only_one_is_inserted(
    metadata_backend: MetadataBackend,
) -> None:
    stores = [await metadata_backend.open(), await metadata_backend.open()]
    one = stores[0]
    assert await one.insert_extent(_extent("e0"))
    results = await asyncio.gather(
        one.insert_extent(_extent("a", predecessor="e0")),
        one.insert_extent(_extent("b", predecessor="e0")),
    )
    assert sorted(results) == [False, True]
    for i in range(1, 11):  # across connections, where the database does the arbitration
        racers = await asyncio.gather(
            *(
                stores[j % 2].insert_extent(_extent(f"e{i}-{j}", predecessor=f"p{i}"))
                for j in range(4)
            )
        )
        assert racers.count(True) == 1
    extents = await one.list_extents("q1")
    assert len(extents) == 1 + 1 + 10
    assert len({e.predecessor for e in extents if e.predecessor}) == 11


async def test_concurrent_lease_takers_only_one_wins(metadata_backend: MetadataBackend) -> None:
    stores = [await metadata_backend.open(), await metadata_backend.open()]
    results = await asyncio.gather(
        *(stores[i % 2].try_lease("controller", f"c{i}", ttl_seconds=30) for i in range(8))
    )
    assert results.count(True) == 1
    winner = f"c{results.index(True)}"
    assert await stores[1].try_lease("controller", winner, ttl_seconds=30)
    assert not await stores[0].try_lease("controller", "late", ttl_seconds=30)


# PostgreSQL schema and migrations


async def _migration_versions(schema: str) -> list[int]:
    async with await psycopg.AsyncConnection.connect(POSTGRES_URL) as conn:
        query = sql.SQL("SELECT version FROM {}.schema_migrations ORDER BY version")
        cur = await conn.execute(query.format(sql.Identifier(schema)))
        return [v for (v,) in await cur.fetchall()]


@pytest.mark.postgres
async def test_postgres_migrations_apply_once(pg_schema: str) -> None:
    stores = await asyncio.gather(
        *(PostgresMetadataStore.connect(POSTGRES_URL, pg_schema) for _ in range(3))
    )
    await stores[0].insert_queue(_queue())
    for store in stores:
        await store.close()
    again = await PostgresMetadataStore.connect(POSTGRES_URL, pg_schema)
    assert (await again.get_queue("q1")).name == "q1"
    await again.close()
    assert await _migration_versions(pg_schema) == list(range(1, len(MIGRATIONS) + 1))


@pytest.mark.postgres
async def test_postgres_rejects_a_bad_schema_name() -> None:
    with pytest.raises(InvalidRequest):
        await PostgresMetadataStore.connect(POSTGRES_URL, 'x"; DROP TABLE queues; --')


# open_metadata


def _sqlite(path: str) -> MetadataTarget:
    return MetadataTarget(kind="sqlite", location=path)


def _postgres(url: str) -> MetadataTarget:
    return MetadataTarget(kind="postgres", location=url)


@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("sqlite:///var/lib/cherami/metadata.db", _sqlite("/var/lib/cherami/metadata.db")),
        ("sqlite://data/metadata.db", _sqlite("data/metadata.db")),
        ("SQLite:///a%20b.db", _sqlite("/a b.db")),
        ("sqlite://:memory:", _sqlite(":memory:")),
        ("/var/lib/cherami/metadata.db", _sqlite("/var/lib/cherami/metadata.db")),
        ("metadata.db", _sqlite("metadata.db")),
        ("./data:1/metadata.db", _sqlite("./data:1/metadata.db")),
        ("postgresql://u@h:5432/db", _postgres("postgresql://u@h:5432/db")),
        ("postgres://h/db?sslmode=require", _postgres("postgres://h/db?sslmode=require")),
        ("POSTGRESQL://h/db", _postgres("postgresql://h/db")),
    ],
)
def test_parse_metadata_url(url: str, target: MetadataTarget) -> None:
    assert parse_metadata_url(url) == target


@pytest.mark.parametrize(
    ("url", "location", "schema"),
    [
        ("postgresql://h/db?schema=tenant_1", "postgresql://h/db", "tenant_1"),
        (
            "postgresql://h/db?sslmode=require&schema=s&options=-c%20a%3Db",
            "postgresql://h/db?sslmode=require&options=-c%20a%3Db",
            "s",
        ),
    ],
)
def test_parse_metadata_url_strips_the_schema(url: str, location: str, schema: str) -> None:
    assert parse_metadata_url(url) == MetadataTarget(
        kind="postgres", location=location, schema=schema
    )


@pytest.mark.parametrize(
    "url",
    [
        "",
        "   ",
        "mysql://h/db",
        "redis://h",
        "sqlite:metadata.db",
        "postgresql:/h/db",
        "sqlite://",
        "sqlite:///m.db?mode=ro",
        "postgresql://h/db?schema=a&schema=b",
        "postgresql://h/db?schema=Bad-Name",
        "host=a,b port=5432 dbname=test",  # libpq's keyword form: a URL is asked for
    ],
)
def test_parse_metadata_url_rejects(url: str) -> None:
    with pytest.raises(InvalidRequest):
        parse_metadata_url(url)


async def test_open_metadata_sqlite(tmp_path: Path) -> None:
    for url in (f"sqlite://{tmp_path}/a.db", str(tmp_path / "b.db")):
        store = await open_metadata(url)
        try:
            assert isinstance(getattr(store, "wrapped", store), SqliteMetadataStore)
            await store.insert_queue(_queue())
        finally:
            await store.close()
    assert (tmp_path / "a.db").exists() and (tmp_path / "b.db").exists()


@pytest.mark.postgres
async def test_open_metadata_postgres_uses_the_schema(pg_schema: str) -> None:
    sep = "&" if "?" in POSTGRES_URL else "?"
    store = await open_metadata(f"{POSTGRES_URL}{sep}schema={pg_schema}")
    try:
        assert isinstance(getattr(store, "wrapped", store), PostgresMetadataStore)
        await store.insert_queue(_queue())
    finally:
        await store.close()
    assert await _migration_versions(pg_schema) == list(range(1, len(MIGRATIONS) + 1))


async def test_lease_epoch_grows_only_when_the_holder_changes(meta: MetadataStore) -> None:
    first = await meta.try_lease("group:q/g", "o1", ttl_seconds=5)
    assert first is not None
    assert await meta.try_lease("group:q/g", "o1", ttl_seconds=0) == first  # a renewal
    taken = await meta.try_lease("group:q/g", "o2", ttl_seconds=5)  # o1's expired
    assert taken == first + 1
    assert await meta.try_lease("group:q/g", "o1", ttl_seconds=5) is None


async def test_a_stale_fence_refuses_ack_levels_and_extent_changes(meta: MetadataStore) -> None:
    await meta.insert_queue(_queue("q1"))
    old = await meta.try_lease("group:q1/g", "o1", ttl_seconds=0)
    assert old is not None
    fence = Fence(lease="group:q1/g", epoch=old)
    level = AckLevel(queue="q1", group="g", extent="e1", level=b"\x02", acked=2)
    await meta.put_ack_levels([level], fence=fence)  # current: written
    new = await meta.try_lease("group:q1/g", "o2", ttl_seconds=5)
    assert new == old + 1
    later = AckLevel(queue="q1", group="g", extent="e1", level=b"\x07", acked=7)
    with pytest.raises(Fenced):
        await meta.put_ack_levels([later], fence=fence)
    assert [(a.level, a.acked) for a in await meta.get_ack_levels("q1", "g")] == [(b"\x02", 2)]
    await meta.put_ack_levels([later], fence=Fence(lease="group:q1/g", epoch=new))
    assert [a.acked for a in await meta.get_ack_levels("q1", "g")] == [7]

    lead = await meta.try_lease("controller-leader", "c1", ttl_seconds=0)
    assert lead is not None
    stale = Fence(lease="controller-leader", epoch=lead)
    extent = _extent("x1")
    assert await meta.insert_extent(extent, fence=stale)
    assert await meta.try_lease("controller-leader", "c2", ttl_seconds=5) == lead + 1
    with pytest.raises(Fenced):
        await meta.set_extent_status("x1", "sealed", sealed_seq=3, fence=stale)
    second = msgspec.structs.replace(extent, id="x2")
    with pytest.raises(Fenced):
        await meta.insert_extent(second, fence=stale)
    assert [(e.id, e.status) for e in await meta.list_extents("q1")] == [("x1", "open")]


def _redelivery(key: int, count: int = 1, due_ms: int = 0, group: str = "g") -> Redelivery:
    return Redelivery(
        queue="q1", group=group, extent="e1", key=key.to_bytes(8, "big"), count=count,
        due_ms=due_ms,
    )  # fmt: skip


async def test_redeliveries_upsert_and_delete_in_one_call(meta: MetadataStore) -> None:
    await meta.insert_queue(_queue("q1"))
    assert await meta.get_redeliveries("q1", "g") == []
    await meta.put_redeliveries([_redelivery(9, 1, 5000), _redelivery(2, 1, 7000)], [])
    await meta.put_redeliveries([_redelivery(9, 2, 6000)], [_redelivery(2)])
    assert await meta.get_redeliveries("q1", "g") == [_redelivery(9, 2, 6000)]
    big = _redelivery(1, 3, 1 << 50)  # due times are ms since the epoch: beyond 32 bits
    await meta.put_redeliveries([big, _redelivery(3, 1, 0, group="other")], [])
    assert await meta.get_redeliveries("q1", "g") == [big, _redelivery(9, 2, 6000)]
    await meta.put_redeliveries([], [_redelivery(9), _redelivery(42)])  # a missing row is fine
    assert await meta.get_redeliveries("q1", "g") == [big]


async def test_deleting_a_group_or_queue_deletes_its_redeliveries(meta: MetadataStore) -> None:
    await meta.insert_queue(_queue("q1"))
    await meta.put_redeliveries([_redelivery(1), _redelivery(2, group="h")], [])
    await meta.delete_group("q1", "g")
    assert await meta.get_redeliveries("q1", "g") == []
    assert len(await meta.get_redeliveries("q1", "h")) == 1
    await meta.delete_queue("q1")
    assert await meta.get_redeliveries("q1", "h") == []


async def test_a_stale_fence_refuses_redeliveries(meta: MetadataStore) -> None:
    await meta.insert_queue(_queue("q1"))
    old = await meta.try_lease("group:q1/g", "o1", ttl_seconds=0)
    assert old is not None
    fence = Fence(lease="group:q1/g", epoch=old)
    await meta.put_redeliveries([_redelivery(1)], [], fence=fence)
    assert await meta.try_lease("group:q1/g", "o2", ttl_seconds=5) == old + 1
    with pytest.raises(Fenced):
        await meta.put_redeliveries([_redelivery(2)], [_redelivery(1)], fence=fence)
    assert await meta.get_redeliveries("q1", "g") == [_redelivery(1)]
    current = Fence(lease="group:q1/g", epoch=old + 1)
    await meta.put_redeliveries([], [_redelivery(1)], fence=current)
    assert await meta.get_redeliveries("q1", "g") == []


async def test_hosts_carry_zone_and_latest_load_report(meta: MetadataStore) -> None:
    now = time.time()
    report = LoadReport(
        at=now, interval=2.0, cpu=0.25, open_extents=2, connections=3,
        disk_free_bytes=10 << 30, disk_total_bytes=100 << 30, append_p99_ms=1.5,
        extents={"e1": ExtentLoad(msgs_in=500.0, bytes_in=50_000.0)},
    )  # fmt: skip
    await meta.heartbeat(
        Host(
            id="i0", role="inputhost", address="10.0.0.1:1", heartbeat_at=now, zone="a", load=report
        )  # fmt: skip
    )
    await meta.heartbeat(Host(id="s0", role="storehost", address="10.0.0.2:1", heartbeat_at=now))
    await meta.heartbeat(
        Host(id="old", role="storehost", address="10.0.0.3:1", heartbeat_at=now - 60)
    )
    (host,) = await meta.list_hosts("inputhost", alive_within=10)
    assert (host.zone, host.load) == ("a", report)
    assert host.load is not None and host.load.msgs_in() == 500.0
    # a beat without a report keeps the last one; the zone follows the beat
    await meta.heartbeat(
        Host(id="i0", role="inputhost", address="10.0.0.1:1", heartbeat_at=now + 1, zone="b")
    )
    (host,) = await meta.list_hosts("inputhost", alive_within=10)
    assert (host.zone, host.load, host.heartbeat_at) == ("b", report, now + 1)
    (bare,) = await meta.list_hosts("inputhost", alive_within=10, load=False)  # who is alive
    assert (bare.id, bare.address, bare.zone, bare.load) == ("i0", "10.0.0.1:1", "b", None)
    (store,) = await meta.list_hosts("storehost", alive_within=10)
    assert (store.id, store.zone, store.load) == ("s0", "", None)
    # every role, and dead hosts too
    assert [h.id for h in await meta.list_hosts(None, alive_within=10)] == ["i0", "s0"]
    assert [h.id for h in await meta.list_hosts(None, alive_within=None)] == ["i0", "old", "s0"]


def _old_sqlite(path: str, table: str, row: str) -> SqliteMetadataStore:
    """A store opened on a database an older version made: ``table`` as it was then,
    holding ``row`` (its values; ? is the time)."""
    import sqlite3

    db = sqlite3.connect(path)
    db.execute(f"CREATE TABLE {table}")
    db.execute(f"INSERT INTO {table.split()[0]} VALUES {row}", (time.time(),))
    db.commit()
    db.close()
    return SqliteMetadataStore(path)


async def test_sqlite_made_before_zones_gains_the_hosts_columns(tmp_path: Path) -> None:
    meta = _old_sqlite(
        str(tmp_path / "old.db"),
        "hosts (id TEXT PRIMARY KEY, role TEXT NOT NULL, address TEXT NOT NULL, "
        "heartbeat_at REAL NOT NULL)",
        "('s0', 'storehost', '127.0.0.1:1', ?)",
    )
    (host,) = await meta.list_hosts("storehost", alive_within=10)
    assert (host.id, host.zone, host.load) == ("s0", "", None)
    await meta.heartbeat(msgspec.structs.replace(host, zone="z", load=LoadReport(cpu=0.5)))
    (host,) = await meta.list_hosts("storehost", alive_within=10)
    assert (host.zone, host.load) == ("z", LoadReport(cpu=0.5))
    await meta.close()


async def test_a_deleted_extent_stays_deleted(meta: MetadataStore) -> None:
    await meta.insert_queue(_queue("q1"))
    await meta.insert_extent(_extent("x1"))
    await meta.delete_queue("q1")
    await meta.set_extent_status("x1", "failing")  # a late report of its input host
    await meta.set_extent_status("x1", SEALED, sealed_seq=4)  # a late seal
    extent = await meta.get_extent("x1")
    assert extent is not None and extent.status == DELETED


async def test_change_log_names_the_queues_written_since(meta: MetadataStore) -> None:
    start, anything = await meta.changes_since(-1)
    assert anything is None  # an unknown point: anything may have changed
    assert await meta.changes_since(start) == (start, set())
    await meta.insert_queue(_queue("q1"))
    await meta.insert_queue(_queue("q2"))
    after_queues, changed = await meta.changes_since(start)
    assert after_queues > start and changed == {"q1", "q2"}
    assert await meta.insert_extent(_extent("e1", queue="q2"))
    at, changed = await meta.changes_since(after_queues)
    assert changed == {"q2"}
    await meta.set_extent_status("e1", SEALED, sealed_seq=3)
    at2, changed = await meta.changes_since(at)
    assert at2 > at and changed == {"q2"}
    # acks are not catalog changes; a merged DLQ range (a level with a limit) is
    await meta.put_ack_levels([AckLevel(queue="q1", group="g", extent="e1", level=b"", acked=0)])
    assert await meta.changes_since(at2) == (at2, set())
    await meta.put_ack_levels(
        [AckLevel(queue="q1", group="g", extent="e1", level=b"", acked=0, limit=b"\x05")]
    )
    at3, changed = await meta.changes_since(at2)
    assert changed == {"q1"}
    await meta.put_ack_levels(
        [AckLevel(queue="q1", group="g", extent="e1", level=b"\x01", acked=1, limit=b"\x05")]
    )
    assert await meta.changes_since(at3) == (at3, set())
    await meta.delete_queue("q1")
    assert (await meta.changes_since(at3))[1] == {"q1"}
    assert (await meta.changes_since(10**12))[1] is None  # ahead of the log: unknown


async def _pages(meta: MetadataStore, limit: int, prefix: str = "") -> list[list[str]]:
    """Every page of the non-DLQ queues, each read after the last name of the one before."""
    pages: list[list[str]] = []
    after: str | None = None
    while True:
        names = [q.name for q in await meta.list_queues(prefix, after, limit, dlqs=False)]
        pages.append(names)
        if len(names) < limit:
            return pages
        after = names[-1]


async def test_queues_list_by_prefix_a_page_at_a_time(meta: MetadataStore) -> None:
    names = ["a", "a%b", "a_b", "ab", "abc", "ac", "b", "A", "a.", "a-"]
    for name in names:
        await meta.insert_queue(_queue(name))
    dlq = Queue(name="_dlq.1.a.g", config=QueueConfig(), created_at=1.0, dlq_of="a/g")
    await meta.insert_queue(dlq)
    everything = sorted(names)  # code-point order, as the stores list
    assert [q.name for q in await meta.list_queues()] == sorted([*names, dlq.name])
    assert [q.name for q in await meta.list_queues(dlqs=False)] == everything

    async def listed(*args: Any, **kwargs: Any) -> list[str]:
        return [q.name for q in await meta.list_queues(*args, **kwargs)]

    assert await listed("a") == ["a", "a%b", "a-", "a.", "a_b", "ab", "abc", "ac"]
    # LIKE's wildcards are plain characters of a prefix
    assert await listed("a%") == ["a%b"]
    assert await listed("a_") == ["a_b"]
    assert await listed("ab") == ["ab", "abc"]
    assert await listed("_", dlqs=False) == [] and await listed("_") == [dlq.name]
    assert await listed("abcd") == [] and await listed("zz") == []
    # a page starts after a name, whether or not that name exists
    assert await listed("a", "a_b", 2) == ["ab", "abc"]
    assert await listed("", "ab", 3) == ["abc", "ac", "b"]
    assert await listed("", "aa", 1) == ["ab"]
    assert await listed("a", "ac", 5) == []  # past the last: an empty page
    assert await listed("", None, 0) == []
    # paging through all: every name once, in order, whatever the page size
    for limit in (1, 3, 4, len(names), 100):
        pages = await _pages(meta, limit)
        assert [n for page in pages for n in page] == everything
        assert all(len(page) == limit for page in pages[:-1])
    pages = await _pages(meta, 3, prefix="a")
    assert pages == [["a", "a%b", "a-"], ["a.", "a_b", "ab"], ["abc", "ac"]]


async def test_a_prefix_ending_in_the_last_code_points(meta: MetadataStore) -> None:
    """The upper end of a prefix's range: the character after the prefix's last that
    is below U+10FFFF, past the surrogates (what the range reads, not LIKE)."""
    top, below_surrogates = "\U0010ffff", "\ud7ff"
    names = ["x", f"x{top}", f"x{top}y", "y", below_surrogates, f"{below_surrogates}a", "\ue000"]
    for name in names:
        await meta.insert_queue(_queue(name))
    assert [q.name for q in await meta.list_queues(f"x{top}")] == [f"x{top}", f"x{top}y"]
    assert [q.name for q in await meta.list_queues(top)] == []
    assert [q.name for q in await meta.list_queues(below_surrogates)] == [
        below_surrogates, f"{below_surrogates}a"
    ]  # fmt: skip


async def test_groups_list_by_prefix_a_page_at_a_time(meta: MetadataStore) -> None:
    for queue in ("q1", "q2"):
        await meta.insert_queue(_queue(queue))
        for name in ("g1", "g2", "g_3", "h", "g%"):
            await meta.insert_group(Group(
                queue=queue, name=name, config=GroupConfig(), created_at=time.time(),
                start_ms=0, dlq=f"_dlq.{queue}.{name}",
            ))  # fmt: skip

    async def names(*args: Any) -> list[str]:
        return [g.name for g in await meta.list_groups("q1", *args)]

    assert await names() == ["g%", "g1", "g2", "g_3", "h"]
    assert await names("g") == ["g%", "g1", "g2", "g_3"]
    assert await names("g_") == ["g_3"] and await names("g%") == ["g%"]
    assert await names("g", None, 2) == ["g%", "g1"]
    assert await names("g", "g1", 2) == ["g2", "g_3"]
    assert await names("g", "g_3", 2) == []
    assert await names("", "g_3", 2) == ["h"]
    assert await meta.list_groups("q3") == [] and await meta.list_groups("q3", "g", None, 1) == []


async def test_queue_properties(metadata_backend: MetadataBackend) -> None:
    """Kept with a queue, seen through every store on the database, found by name and
    value, written only while the queue exists and deleted with it."""
    meta, other = await metadata_backend.open(), await metadata_backend.open()
    with pytest.raises(QueueNotFound):
        await meta.put_queue_properties("q1", {"sqs.q.wait": "5"})
    await meta.insert_queue(_queue("q1"))
    await meta.insert_queue(_queue("q2"))
    await meta.put_queue_properties("q1", {"sqs.q.wait": "5", "sqs.q.tag.a": "1",
                                           "sqs.q.tag.b": "2", "sqs.q.dlq": "d"})  # fmt: skip
    await meta.put_queue_properties("q2", {"sqs.q.dlq": "d", "sqs.task.1": "{}"})
    assert await other.get_queue_properties("q1", "sqs.q.tag.") == {"sqs.q.tag.a": "1",
                                                                    "sqs.q.tag.b": "2"}  # fmt: skip
    await other.put_queue_properties("q1", {"sqs.q.tag.a": "3"}, delete=["sqs.q.tag.b", "none"])
    assert await meta.get_queue_properties("q1") == {
        "sqs.q.dlq": "d",
        "sqs.q.tag.a": "3",
        "sqs.q.wait": "5",
    }
    assert await meta.get_queue_properties("nope") == {}
    assert await meta.find_queue_properties("sqs.q.dlq", "d") == {"q1": "d", "q2": "d"}
    assert await meta.find_queue_properties("sqs.q.dlq", "e") == {}
    assert await meta.find_queue_properties("sqs.task.1") == {"q2": "{}"}
    await meta.delete_queue("q1")
    assert await other.get_queue_properties("q1") == {}
    assert await other.find_queue_properties("sqs.q.dlq") == {"q2": "d"}
    with pytest.raises(QueueNotFound):
        await other.put_queue_properties("q1", {"sqs.q.wait": "1"})
    await meta.insert_queue(_queue("q1"))  # a new queue of the name starts with none
    assert await other.get_queue_properties("q1") == {}


async def test_a_queue_asks_for_timer_extents_once(meta: MetadataStore) -> None:
    """``timers``: stored as made, set by mark_queue (a change in the change log the
    first time only), never unset by an update of the config."""
    await meta.insert_queue(_queue("plain"))
    await meta.insert_queue(msgspec.structs.replace(_queue("delayed"), timers=True))
    assert [(q.name, q.timers) for q in await meta.list_queues()] == [
        ("delayed", True), ("plain", False),
    ]  # fmt: skip
    start, _ = await meta.changes_since(-1)
    await meta.mark_queue("plain", "timers")
    at, changed = await meta.changes_since(start)
    assert changed == {"plain"} and (await meta.get_queue("plain")).timers
    await meta.mark_queue("plain", "timers")  # already: nothing written
    assert await meta.changes_since(at) == (at, set())
    stale = msgspec.structs.replace(await meta.get_queue("plain"), timers=False)
    stale.config.retention_seconds = 60
    await meta.update_queue(stale)  # a PATCH with a queue read before: keeps the flag
    got = await meta.get_queue("plain")
    assert got.timers and got.config.retention_seconds == 60
    with pytest.raises(QueueNotFound):
        await meta.mark_queue("nope", "timers")


async def test_a_queue_is_marked_keyed_once(meta: MetadataStore) -> None:
    """``keyed``: false as made, set by mark_queue (a change in the change log the first
    time only: output hosts serve its groups whole from then), never unset by an update."""
    await meta.insert_queue(_queue("q"))
    assert not (await meta.get_queue("q")).keyed
    start, _ = await meta.changes_since(-1)
    await meta.mark_queue("q", "keyed")
    at, changed = await meta.changes_since(start)
    assert changed == {"q"} and (await meta.get_queue("q")).keyed
    assert not (await meta.get_queue("q")).timers  # the one flag only
    await meta.mark_queue("q", "keyed")  # already: nothing written
    assert await meta.changes_since(at) == (at, set())
    await meta.update_queue(msgspec.structs.replace(await meta.get_queue("q"), keyed=False))
    assert [q.keyed for q in await meta.list_queues()] == [True]
    with pytest.raises(QueueNotFound):
        await meta.mark_queue("nope", "keyed")


async def test_sqlite_made_before_lazy_timers_keeps_them(tmp_path: Path) -> None:
    """A queue made when every queue had timer extents keeps them."""
    meta = _old_sqlite(
        str(tmp_path / "old.db"),
        "queues (name TEXT PRIMARY KEY, config TEXT NOT NULL, created_at REAL NOT NULL, "
        "dlq_of TEXT)",
        "('old', '{}', ?, NULL)",
    )
    old = await meta.get_queue("old")
    assert old.timers and not old.keyed  # (keyed: an output host marks it, service.py)
    await meta.close()


async def test_cancelled_delayed_messages_are_kept_while_their_extent_lives(
    meta: MetadataStore,
) -> None:
    await meta.insert_queue(_queue("q1"))
    assert await meta.insert_extent(_extent("t1"))
    assert await meta.insert_extent(_extent("t2"))
    assert await meta.cancelled_scheduled("q1", "t1", 1, 100) == set()
    await meta.cancel_scheduled("q1", "t1", [5, 7, 1 << 40])
    await meta.cancel_scheduled("q1", "t1", [5])  # again: no change, no error
    other = await meta.cancelled_scheduled("q1", "t1", 6, 1 << 41)
    assert await meta.cancelled_scheduled("q1", "t1", 1, 100) == {5, 7}
    assert other == {7, 1 << 40}
    assert await meta.cancelled_scheduled("q1", "t1", 6, 6) == set()
    assert await meta.cancelled_in("q1") == {"t1": {5, 7, 1 << 40}}
    await meta.insert_queue(_queue("q2"))
    assert await meta.insert_extent(_extent("t9", "q2"))
    await meta.cancel_scheduled("q2", "t9", [3])
    assert await meta.cancelled_everywhere() == {"q1": {"t1": {5, 7, 1 << 40}}, "q2": {"t9": {3}}}
    await meta.set_extent_status("t1", DELETED)  # retention deleted it
    at, _ = await meta.changes_since(-1)
    await meta.cancel_scheduled("q1", "t2", [6])  # the next cancel drops t1's
    assert (await meta.changes_since(at))[1] == {"q1"}  # output hosts read them again
    assert await meta.cancelled_in("q1") == {"t2": {6}}
    assert (await meta.cancelled_everywhere())["q1"] == {"t2": {6}}
    assert await meta.cancelled_scheduled("q1", "t1", 0, 1 << 62) == set()
    assert await meta.cancelled_scheduled("q1", "t2", 0, 10) == {6}
