"""A queue deleted among many leaves nothing behind (issue 29, "Proof"): no row of it in
the node's metadata, no extent of it on its store hosts, nothing of it in its roles'
memory, and its name is free again; the queues left are unaffected.

A node (3 store hosts, SQLite metadata, its SQS endpoint) with QUEUES queues of 2 groups
each. On ACTIVE of the queues to be deleted and ACTIVE of those kept, everything that
leaves state somewhere: messages published (plain extents), one delayed (the queue's
timer extent), received and acked (ack levels), nacked with a delay (a parked
redelivery row), dead-lettered (a dead-letter queue with an extent of its own); some
queues made through the SQS endpoint with tags (queue properties). Then half the queues
are deleted, and one group of a kept queue. The change log is left aside (it keeps the
newest 10,000 changes).

Before purge_extent (metadata/purge.py), every extent of a deleted queue stayed as a
row marked 'deleted' for good (here 100 plain, 12 timer and 12 dead-letter extents'
rows). The same statements on PostgreSQL, and the unit leases a cluster's output hosts
take (a node takes none), are checked in tests/contract/test_metadata_purge.py. A
deleted group's leases on its queue's live extents stay (expired) until those extents
go, so that a lease name never starts its epochs again while an old holder may act on
an old one (purge.py)."""

from __future__ import annotations

import asyncio
import gc
import re
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.client.models import OutgoingMessage, Received
from cherami.config import NodeConfig
from cherami.errors import Unavailable
from cherami.server.node import Node
from cherami.storage.rocks import RocksExtentStore
from cherami.storage.rockslayout import extent_prefix
from tests.support.server import ServerProcess

QUEUES = 200  # half of them deleted
ACTIVE = 12  # of the deleted and of the kept queues: published to, consumed, nacked...
TAGGED = 4  # of the deleted queues: made through the SQS endpoint with tags
CONCURRENCY = 16
SQS_LINE = re.compile(r"SQS endpoint at (https?://[\d.]+:\d+)")
# every table that holds a queue's state; hosts and the change log hold none of it
TABLES = ("queues", "groups", "extents", "ack_levels", "redeliveries", "queue_properties",
          "leases")  # fmt: skip

pytestmark = pytest.mark.timeout(240)


class NodeUnderTest:
    """A node (``cherami serve``, 3 store hosts, its SQS endpoint) and a direct look at
    its SQLite metadata tables."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc = ServerProcess(root, 3, ["--sqs-port", "0"])

    def sqs_url(self) -> str:
        for line in list(self.proc.output):
            if match := SQS_LINE.search(line):
                return match.group(1)
        raise AssertionError("the node printed no SQS endpoint")

    def rows(self, table: str) -> list[tuple[Any, ...]]:
        with sqlite3.connect(f"file:{self.root / 'metadata.db'}?mode=ro", uri=True) as db:
            return db.execute(f"SELECT * FROM {table}").fetchall()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeUnderTest]:
    made = NodeUnderTest(tmp_path / "node")
    made.proc.start()
    try:
        yield made
    finally:
        made.proc.stop()


def mentions(rows: list[tuple[Any, ...]], names: set[str]) -> list[tuple[Any, ...]]:
    """The rows with a column that is one of ``names`` or a lease named after one."""
    found = []
    for row in rows:
        for value in row:
            if not isinstance(value, str):
                continue
            parts = set(value.split("/")) | {value} | {value.removeprefix("group:")}
            if parts & names or any(p.removeprefix("group:") in names for p in parts):
                found.append(row)
                break
    return found


async def receive(c: AsyncClient, queue: str, group: str, n: int) -> list[Received]:
    """``n`` messages (a cluster's output host takes a group's units within a few of
    its ticks; a receive before that returns none)."""
    got: list[Received] = []
    deadline = time.monotonic() + 30
    while len(got) < n and time.monotonic() < deadline:
        try:
            got += await c.receive(queue, group, max_messages=n - len(got), wait_seconds=2)
        except Unavailable:  # its units are being taken: asked again after a pause
            await asyncio.sleep(0.1)
    assert len(got) == n, (queue, group, got)
    return got


async def exercise(c: AsyncClient, queue: str) -> None:
    """Leave every kind of state: extents (plain, timer, a dead-letter queue's), ack
    levels, a parked redelivery, unit leases."""
    await c.publish(queue, ["m1", "m2", "m3", OutgoingMessage("later", delay_seconds=600)])
    got = await receive(c, queue, "a", 2)
    await c.ack(queue, "a", got[0])
    await c.nack(queue, "a", got[1])  # max_delivery_count 1: dead-lettered
    got = await receive(c, queue, "b", 2)
    await c.ack(queue, "b", got[0])
    await c.nack(queue, "b", got[1], delay_seconds=600)  # parked


async def wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if not last:
            return
        await asyncio.sleep(0.2)
    if isinstance(last, dict):  # rows by table
        counts = {table: len(rows) for table, rows in last.items()}
        last = f"{counts}, such as { {table: rows[:2] for table, rows in last.items()} }"
    raise AssertionError(f"{what} after {timeout} s: {last}")


async def test_deleted_queues_leave_nothing_behind(node: NodeUnderTest) -> None:
    meta = node
    names = [f"q{i:04d}" for i in range(QUEUES)]
    doomed, kept = names[: QUEUES // 2], names[QUEUES // 2 :]
    tagged = doomed[:TAGGED]
    sqs = boto3.client(
        "sqs", endpoint_url=node.sqs_url(), region_name="us-east-1",
        aws_access_key_id="test", aws_secret_access_key="test",
    )  # fmt: skip
    for name in tagged:
        await asyncio.to_thread(sqs.create_queue, QueueName=name, tags={"team": "x"})
    async with AsyncClient(node.proc.url, timeout=30) as c:
        limit = asyncio.Semaphore(CONCURRENCY)

        async def make(queue: str) -> None:
            async with limit:
                if queue not in tagged:
                    await c.create_queue(queue)
                await c.create_group(queue, "a", max_delivery_count=1)
                await c.create_group(queue, "b")

        await asyncio.gather(*map(make, names))
        active = doomed[:ACTIVE] + kept[:ACTIVE]
        await asyncio.gather(*map(partial_exercise(c, limit), active))
        assert mentions(meta.rows("queue_properties"), set(tagged)), "the SQS queues' tags"
        assert mentions(meta.rows("redeliveries"), set(doomed)), "parked rows"
        dlqs = {row[5] for row in meta.rows("groups") if row[0] in set(doomed)}
        extents = {row[0]: row for row in meta.rows("extents")}
        dead = {i for i, row in extents.items() if row[1] in set(doomed) | dlqs}
        assert {row[2] for i, row in extents.items() if i in dead} == {"plain", "timer"}
        assert any(extents[i][1] in dlqs for i in dead), "dead letters have an extent"

        async def delete(queue: str) -> None:
            async with limit:
                await c.delete_queue(queue)

        await asyncio.gather(*map(delete, doomed))
        await c.delete_group(kept[0], "b")  # a group alone, its queue kept
        gone = set(doomed) | dlqs | dead

        def left() -> dict[str, list[tuple[Any, ...]]]:
            found = {t: mentions(meta.rows(t), gone) for t in TABLES}
            found["groups"] += [r for r in meta.rows("groups") if r[:2] == (kept[0], "b")]
            for table in ("ack_levels", "redeliveries"):
                found[table] += [r for r in meta.rows(table) if r[:2] == (kept[0], "b")]
            return {t: rows for t, rows in found.items() if rows}

        await wait_for(left, 15, "rows of deleted queues and groups are left")

        # the queues kept still deliver what they hold: each group its third message
        # (not received before), and on those only created what is published now
        for queue in kept[:ACTIVE]:
            for group in ("a", "b") if queue != kept[0] else ("a",):
                got = await receive(c, queue, group, 1)
                assert [m.body for m in got] == [b"m3"], (queue, group)
                await c.ack(queue, group, got)
        for queue in kept[ACTIVE : ACTIVE + 4]:
            await c.publish(queue, ["after"])
            for group in ("a", "b"):
                got = await receive(c, queue, group, 1)
                assert [m.body for m in got] == [b"after"], (queue, group)

        # the names are free again, and a queue made under one starts empty
        for queue in doomed[:3]:
            await c.create_queue(queue)
            await c.create_group(queue, "a")
            await c.publish(queue, ["new"])
            got = await receive(c, queue, "a", 1)
            assert [m.body for m in got] == [b"new"], queue
        await c.create_group(kept[0], "b", start_from="latest")

    # on the store hosts: no extent of the deleted queues, in metadata or in records
    assert node.proc.stop() == 0, "\n".join(node.proc.output)
    for store in sorted(node.root.glob("store-*")):
        rocks = RocksExtentStore(str(store))
        try:
            assert not dead & set(rocks.extents()), store
            shared = rocks._views["__extents__"]
            prefixes = {extent_prefix(e) for e in dead}
            keys = [k for k, _ in shared.items() if any(k.startswith(p) for p in prefixes)]
            assert not keys, f"{store}: {len(keys)} records of dropped extents"
        finally:
            rocks.close()


def partial_exercise(c: AsyncClient, limit: asyncio.Semaphore) -> Any:
    async def run(queue: str) -> None:
        async with limit:
            await exercise(c, queue)

    return run


def held_names(names: frozenset[str], *mine: object) -> list[str]:
    """Where a dict or set of this process holds one of ``names`` as a key (or part of a
    tuple key): its owner's class and attribute, as far as the referrers tell (``names``
    and the containers in ``mine`` aside)."""
    found = []
    for obj in gc.get_objects():
        kind = type(obj)  # not isinstance: a lazy proxy's __class__ (celery's) runs code
        if issubclass(kind, dict):
            keys: Any = list(obj)
        elif issubclass(kind, (set, frozenset)):
            keys = list(obj)
        else:
            continue
        if obj is names or any(obj is m for m in mine) or not any(
            (k in names) if isinstance(k, str) else
            isinstance(k, tuple) and any(isinstance(p, str) and p in names for p in k)
            for k in keys
        ):  # fmt: skip
            continue
        where = f"{type(obj).__name__} {sorted(map(repr, keys))[:2]} in " + ", ".join(
            type(r).__qualname__ for r in gc.get_referrers(obj)
        )
        for ref in gc.get_referrers(obj):
            if isinstance(ref, dict):
                owners = [o for o in gc.get_referrers(ref) if getattr(o, "__dict__", None) is ref]
                attrs = [a for a, v in ref.items() if v is obj]
                if owners and attrs:
                    where = f"{type(owners[0]).__qualname__}.{attrs[0]}"
        found.append(where)
    return found


async def test_a_deleted_queue_leaves_nothing_in_a_nodes_memory(tmp_path: Path) -> None:
    """The roles of a node (frontend, controller, input host, output host: run here, in
    this process, so that their memory can be looked at; the store hosts are child
    processes) keep nothing of a queue once it is deleted: before, the controller's
    per-queue locks, the input host's writers, the frontend's throttle state and
    publish counts kept every deleted queue's name for good."""
    node = Node(NodeConfig(data_dir=str(tmp_path / "node"), port=0))
    await node.start()
    try:
        names = {f"gone-{uuid.uuid4().hex[:10]}" for _ in range(6)}
        async with AsyncClient(f"http://127.0.0.1:{node.port}", timeout=30) as c:
            for queue in sorted(names) + ["kept"]:
                await c.create_queue(queue)
                await c.create_group(queue, "a", max_delivery_count=1)
                await c.create_group(queue, "b")
                await exercise(c, queue)
                async with c.consumer(queue, "b"):
                    pass
            dlqs = {row.dlq for q in names for row in await node_groups(node, q)}
            for queue in sorted(names):
                await c.delete_queue(queue)
            gone = frozenset(names | dlqs)

            def held() -> list[str]:
                gc.collect()
                return held_names(gone, names, dlqs)

            # the leader reads the deletes from the change log at its next tick
            await wait_for(held, 10, "the node's memory holds deleted queues")
            await c.publish("kept", ["still"])
            got = await receive(c, "kept", "a", 2)
            assert sorted(m.body for m in got) == [b"m3", b"still"]
    finally:
        await node.stop()


async def node_groups(node: Node, queue: str) -> list[Any]:
    assert node.metadata is not None
    return list(await node.metadata.list_groups(queue))
