"""Ordering keys across an output host's failover on a real cluster (PostgreSQL
metadata, a schema of its own; 3 store hosts, 1 input host, 2 output hosts): 30 keys x
100 messages of an AP queue and of a CP queue, 8 competing consumers (4 HTTP through
the frontend, 4 streams routed to the output hosts), random processing times and 10%
nacks; a third of the way in, the output host holding the group is SIGKILLed and the
other one takes its extents over. Per key the order of first successful processing is
publish order and no two messages of a key received in one epoch are in hand at once
(a redelivery after the kill is reported, not counted: docs/api.md, "Ordering keys").
The same with 2 input hosts and an AP queue written through both (each key in an
extent on each): the cluster gap of issue 30, which failed before it was closed (43
messages began while another of their key was in hand, the group's two extents on
the two output hosts)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.client.models import OutgoingMessage
from cherami.devcluster.local import LocalCluster
from cherami.metadata.postgres_leases import held_leases
from cherami.roles.outputhost.ownership import WHOLE, group_leases
from tests.support.keyorder import KeyOrder, http_consumer, stream_consumer
from tests.support.pgcluster import PG, cluster_on_postgres

pytestmark = pytest.mark.postgres

KEYS, PER_KEY = 30, 60


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, str]]:
    counts = {"storehost": 3, "controller": 1, "inputhost": 1, "outputhost": 2, "frontend": 1}
    with cluster_on_postgres(tmp_path / "cluster", counts) as up:
        yield up


def _holders(schema: str, queue: str, group: str) -> dict[str, str]:
    """The addresses of the output hosts holding an unexpired lease of the group's units,
    by unit: an AP queue's plain extents, a CP queue's whole group."""
    prefix = group_leases(queue, group)
    with psycopg.connect(PG) as conn:
        plain = {r[0] for r in conn.execute(
            f"SELECT id FROM {schema}.extents WHERE queue = %s AND kind = 'plain'", (queue,)
        ).fetchall()}  # fmt: skip
        conn.execute(f"SET search_path TO {schema}")
        rows = conn.execute(
            f"SELECT held.name, h.address FROM ({held_leases('left(l.name, %s) = %s')}) AS held "
            "JOIN hosts h ON h.id = held.holder",
            (len(prefix), prefix),
        ).fetchall()
    units = {r[0][len(prefix) :]: r[1] for r in rows}
    return {u: a for u, a in units.items() if u in plain or u == WHOLE}


@pytest.mark.parametrize("kind", ["ap", "cp"])
async def test_key_order_holds_across_a_sigkill_of_the_output_host_holding_the_group(
    cluster: tuple[LocalCluster, str], kind: str
) -> None:
    local, schema = cluster
    queue, group = f"keys-{kind}", "g"
    keys = [f"k{i}" for i in range(KEYS)]
    async with AsyncClient(local.url, timeout=30) as client:
        await client.create_queue(queue, type=kind)
        await client.create_group(queue, group, visibility_timeout_seconds=5)
        messages = [OutgoingMessage(f"{k}/{n}", key=k) for n in range(PER_KEY) for k in keys]
        for start in range(0, len(messages), 1000):
            await client.publish(queue, messages[start : start + 1000])
        check = KeyOrder()
        total = len(messages)
        deadline = time.monotonic() + 120
        killed: list[str] = []
        before: dict[str, str] = {}  # extent -> output host, at the kill

        def done() -> bool:
            return check.total_acked() >= total or time.monotonic() > deadline

        async def kill_midway() -> None:
            while check.total_acked() < total // 3:
                await asyncio.sleep(0.05)
            holders = await asyncio.to_thread(_holders, schema, queue, group)
            before.update(holders)
            check.epoch += 1
            killed.append(holders[min(holders)])  # (an AP queue's extents may be on both)
            name = next(n for n in local.names("outputhost") if local.procs[n].address == killed[0])
            await asyncio.to_thread(local.kill, name)

        consumers = [http_consumer(client, queue, group, check, done) for _ in range(4)]
        consumers += [stream_consumer(client, queue, group, check, done) for _ in range(4)]
        await asyncio.gather(*consumers, kill_midway())
        after = await asyncio.to_thread(_holders, schema, queue, group)
    print(f"\n{kind}: held by {before}, killed {killed}, then held by {after}: "
          f"{check.deliveries} "
          f"deliveries, {check.nacks} nacks, {check.errors} failed calls, "
          f"{len(check.redelivered_after_ack)} redelivered after a successful processing, "
          f"{len(check.after_failure)} in hand twice across the kill")  # fmt: skip
    assert killed and after.keys() == before.keys()  # every extent of it is held again,
    assert killed[0] not in after.values()  # by the other host
    assert check.overlaps == [], check.overlaps[:5]
    assert check.span_overlaps() == [], check.span_overlaps()[:5]
    for k in keys:
        acked = check.acked.get(k)
        assert acked == [f"{k}/{n}" for n in range(PER_KEY)], (k, acked)


@pytest.fixture
def spread_cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, str]]:
    counts = {"storehost": 2, "controller": 1, "inputhost": 2, "outputhost": 2, "frontend": 1}
    with cluster_on_postgres(tmp_path / "cluster", counts) as up:
        yield up


async def _stored_per_input_host(client: AsyncClient, queue: str) -> dict[str, int]:
    stored: dict[str, int] = {}
    for e in (await client.request("GET", f"/v1/queues/{queue}/extents"))["extents"]:
        if e["kind"] == "plain" and e["last_seq"]:
            stored[e["input_host"]] = stored.get(e["input_host"], 0) + e["last_seq"]
    return stored


async def test_key_order_holds_in_an_ap_queue_written_through_two_input_hosts(
    spread_cluster: tuple[LocalCluster, str],
) -> None:
    """The gap this closes (issue 30): an AP queue with an open extent on each of 2
    input hosts, keyed publishes spread over both (so each key is in both extents), 2
    output hosts. Before, each output host took one extent and delivered a key's
    messages in parallel with the other's; now the queue is marked keyed before its
    first keyed message and its group is served whole by one output host, which is
    SIGKILLed a third of the way in (the other takes the group over)."""
    local, schema = spread_cluster
    queue, group = "keys-spread", "g"
    keys = [f"k{i}" for i in range(20)]
    per_key = 60
    async with AsyncClient(local.url, timeout=30) as client:
        await client.create_queue(queue, replicas=2, min_extents=2)
        await client.create_group(queue, group, visibility_timeout_seconds=5)
        deadline = time.monotonic() + 30
        while (
            len((await client.request("GET", f"/v1/queues/{queue}/publishers"))["input_hosts"]) < 2
        ):
            assert time.monotonic() < deadline, "never an open extent on each input host"
            await asyncio.sleep(0.2)
        for n in range(per_key):  # one batch a round, in turn over the input hosts
            await client.publish(queue, [OutgoingMessage(f"{k}/{n}", key=k) for k in keys])
        stored = await _stored_per_input_host(client, queue)
        assert len(stored) == 2 and min(stored.values()) >= per_key * len(keys) // 4, stored
        check = KeyOrder()
        total = per_key * len(keys)
        deadline = time.monotonic() + 120
        killed: list[str] = []
        before: dict[str, str] = {}

        def done() -> bool:
            return check.total_acked() >= total or time.monotonic() > deadline

        async def kill_midway() -> None:
            while check.total_acked() < total // 3 and not done():
                await asyncio.sleep(0.05)
            before.update(await asyncio.to_thread(_holders, schema, queue, group))
            check.epoch += 1
            killed.append(before[min(before)])
            name = next(n for n in local.names("outputhost") if local.procs[n].address == killed[0])
            await asyncio.to_thread(local.kill, name)

        consumers = [http_consumer(client, queue, group, check, done) for _ in range(4)]
        consumers += [stream_consumer(client, queue, group, check, done) for _ in range(4)]
        await asyncio.gather(*consumers, kill_midway())
        after = await asyncio.to_thread(_holders, schema, queue, group)
    print(f"\nstored per input host {stored}; held by {before}, killed {killed}, then {after}: "
          f"{check.deliveries} deliveries, {check.nacks} nacks, {len(check.overlaps)} overlaps, "
          f"{len(check.after_failure)} in hand twice across the kill")  # fmt: skip
    assert check.overlaps == [], check.overlaps[:5]
    assert check.span_overlaps() == [], check.span_overlaps()[:5]
    for k in keys:
        assert check.acked.get(k) == [f"{k}/{n}" for n in range(per_key)], (k, check.acked.get(k))
    assert list(before) == [WHOLE] and list(after) == [WHOLE] and after[WHOLE] != killed[0]


async def test_keyed_messages_of_a_queue_never_marked_keyed_are_delivered_in_order(
    spread_cluster: tuple[LocalCluster, str],
) -> None:
    """A queue holding keyed messages written before queues were marked keyed (here:
    the mark cleared in the metadata after the publishes): its group is spread over the
    two output hosts again, each holds its keyed messages back and marks the queue, and
    the group is served whole; every key then in publish order (before the output
    host marked the queue, its keyed messages waited for good)."""
    local, schema = spread_cluster
    queue, group = "keys-unmarked", "g"
    keys = [f"k{i}" for i in range(10)]
    async with AsyncClient(local.url, timeout=30) as client:
        await client.create_queue(queue, replicas=2, min_extents=2)
        await client.create_group(queue, group)
        for n in range(20):
            await client.publish(queue, [OutgoingMessage(f"{k}/{n}", key=k) for k in keys])
        assert (await client.request("GET", f"/v1/queues/{queue}/extents"))["extents"]
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f"SET search_path TO {schema}")  # (the change log's trigger)
            conn.execute("UPDATE queues SET keyed = false WHERE name = %s", (queue,))
        check = KeyOrder(nack_rate=0.0)
        deadline = time.monotonic() + 60

        def done() -> bool:
            return check.total_acked() >= 20 * len(keys) or time.monotonic() > deadline

        await asyncio.gather(*(http_consumer(client, queue, group, check, done) for _ in range(4)))
        with psycopg.connect(PG) as conn:
            (keyed,) = conn.execute(
                f"SELECT keyed FROM {schema}.queues WHERE name = %s", (queue,)
            ).fetchone() or (None,)
    assert keyed is True and check.overlaps == []
    for k in keys:
        assert check.acked.get(k) == [f"{k}/{n}" for n in range(20)], (k, check.acked.get(k))
