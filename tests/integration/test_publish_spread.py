"""Producers spread over the input hosts of a queue (docs/protocol.md, "Publishing to
several input hosts"): the routing call lists the input hosts that hold the queue's
open extents, a stream Publisher opens a stream to each and spreads its batches over
them, and keeps every acked message when one of them is killed. Real processes: a
cluster with 2 input hosts on PostgreSQL metadata (a schema of its own), and a node."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.client.stream import Publisher
from cherami.devcluster.local import LocalCluster
from cherami.errors import Forbidden, QueueNotFound, Unauthorized
from tests.support.pgcluster import cluster_on_postgres
from tests.support.server import ServerProcess, unique

GROUP = "g"
HANG_GUARD = 30.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Shared by the cluster tests of this module; the last one kills an input host."""
    counts = {"storehost": 2, "controller": 1, "inputhost": 2, "outputhost": 1, "frontend": 1}
    root = tmp_path_factory.mktemp("spread") / "cluster"
    with cluster_on_postgres(root, counts) as (local, _schema):
        yield local


async def _spread_queue(client: AsyncClient, extents: int = 2) -> tuple[str, list[str]]:
    """A queue with an extent on each of ``extents`` input hosts, and its group; the
    routed addresses, once the routing call lists them."""
    q = unique("spread")
    await client.create_queue(q, replicas=2, min_extents=extents)
    await client.create_group(q, GROUP)
    deadline = time.monotonic() + HANG_GUARD
    while True:
        route = await client.request("GET", f"/v1/queues/{q}/publishers")
        hosts = [h["address"] for h in route["input_hosts"]]
        if len(hosts) == extents:
            assert route["queue"] == q and route["refresh_seconds"] == 10
            assert all(len(h["extents"]) == 1 for h in route["input_hosts"])
            return q, hosts
        assert time.monotonic() < deadline, f"never routed to {extents} input hosts: {route}"
        await asyncio.sleep(0.2)


async def _per_input_host(client: AsyncClient, q: str) -> Counter[str]:
    """Messages stored per input host, from the queue's plain extents."""
    stored: Counter[str] = Counter()
    for e in (await client.request("GET", f"/v1/queues/{q}/extents"))["extents"]:
        if e["kind"] == "plain" and e["last_seq"]:
            stored[e["input_host"]] += e["last_seq"]
    return stored


async def _publish_all(pub: Publisher, total: int, tasks: int = 8, batch: int = 100) -> set[str]:
    """``total`` messages from ``tasks`` tasks; the ids acked."""
    acked: set[str] = set()

    async def one(k: int) -> None:
        for start in range(k * batch, total, tasks * batch):
            ids = await pub.publish([f"m{i}" for i in range(start, start + batch)])
            assert len(ids) == batch
            acked.update(ids)

    await asyncio.gather(*(one(k) for k in range(tasks)))
    return acked


async def _drain(client: AsyncClient, q: str, acked: set[str]) -> dict[str, str]:
    """Receive and ack until every acked id came and the group has nothing more; the
    body of each message id delivered."""
    seen: dict[str, str] = {}
    deadline = time.monotonic() + HANG_GUARD
    while time.monotonic() < deadline:
        got = await client.receive(q, GROUP, max_messages=1000, wait_seconds=1)
        if not got and acked <= set(seen):
            break
        seen.update((m.id, m.text) for m in got)
        if got:
            await client.ack(q, GROUP, [m.receipt or "" for m in got])
    return seen


async def test_a_publisher_spreads_over_the_input_hosts(cluster: LocalCluster) -> None:
    async with AsyncClient(cluster.url, timeout=30) as client:
        q, routed = await _spread_queue(client)
        print("routing call:", await client.request("GET", f"/v1/queues/{q}/publishers"))
        input_hosts = {cluster.procs[n].address for n in cluster.names("inputhost")}
        assert set(routed) == input_hosts

        start = time.monotonic()
        async with client.publisher(q, max_in_flight=32) as pub:
            assert pub.hosts == sorted(routed)  # a stream straight to each input host
            acked = await _publish_all(pub, 20_000)
            assert pub.failovers == 0
        took = time.monotonic() - start
        assert len(acked) == 20_000
        stored = await _per_input_host(client, q)
        share = {h: round(n / sum(stored.values()), 3) for h, n in stored.items()}
        print(f"20,000 messages in {took:.1f}s; share per input host {share}")
        assert set(stored) == input_hosts and min(share.values()) >= 0.2

        seen = await _drain(client, q, acked)
        lost = acked - set(seen)
        print(f"acked {len(acked)}, delivered {len(seen)}, lost {len(lost)}")
        assert lost == set() and len(seen) == len(acked)

        # HTTP publishes through the frontend spread too: to the host with the fewest
        # forwards in flight, ties in turn
        h, _ = await _spread_queue(client)
        await asyncio.gather(*(client.publish(h, [f"h{i}"] * 10) for i in range(20)))
        over_http = await _per_input_host(client, h)
        print(f"HTTP publishes per input host: {dict(over_http)}")
        assert set(over_http) == input_hosts and min(over_http.values()) >= 40


async def test_a_publisher_follows_the_route_to_a_new_input_host(cluster: LocalCluster) -> None:
    """A queue on one input host gets a second extent, on the other: within a route
    refresh (10 s) the open Publisher streams to both, and both get messages."""
    async with AsyncClient(cluster.url, timeout=30) as client:
        q, routed = await _spread_queue(client, extents=1)
        acked: set[str] = set()
        async with client.publisher(q) as pub:
            assert pub.hosts == routed
            await client.update_queue(q, min_extents=2)
            grown_at = time.monotonic()
            while len(pub.hosts) < 2:
                assert time.monotonic() - grown_at < 15, "never streamed to the new host"
                acked.update(await pub.publish([f"g{len(acked) + i}" for i in range(100)]))
                await asyncio.sleep(0.05)
            print(f"streaming to {pub.hosts} {time.monotonic() - grown_at:.1f}s after the change")
            for n in range(20):
                acked.update(await pub.publish([f"after{n}-{i}" for i in range(100)]))
            assert pub.failovers == 0
        stored = await _per_input_host(client, q)
        assert len(stored) == 2, stored
        seen = await _drain(client, q, acked)
        assert acked <= set(seen)


async def test_killing_an_input_host_loses_no_acked_message(cluster: LocalCluster) -> None:
    async with AsyncClient(cluster.url, timeout=30) as client:
        q, routed = await _spread_queue(client)
        victim = next(n for n in cluster.names("inputhost") if cluster.procs[n].address in routed)
        address = cluster.procs[victim].address
        acked: set[str] = set()
        waits: list[float] = []  # how long each publish call took
        stop = asyncio.Event()

        async def producer(pub: Publisher, k: int) -> None:
            n = 0
            while not stop.is_set():  # about 1,000 msgs/s each
                began = time.monotonic()
                ids = await pub.publish([f"k{k}-{n + i}" for i in range(50)])
                waits.append(time.monotonic() - began)
                assert len(ids) == 50
                acked.update(ids)
                n += 50
                await asyncio.sleep(0.05)

        async with client.publisher(q, max_in_flight=16) as pub:
            assert len(pub.hosts) == 2
            producers = [asyncio.create_task(producer(pub, k)) for k in range(6)]
            await asyncio.sleep(1.5)
            before = len(acked)
            # a burst, so that the victim dies with frames of it unanswered
            burst = [await pub.send([f"b{i}-{j}" for j in range(100)]) for i in range(30)]
            while not pub.outstanding.get(address, 0):
                await asyncio.sleep(0)
            unanswered = pub.outstanding[address]
            cluster.kill(victim)
            killed_at = time.monotonic()
            burst_ids = await asyncio.wait_for(asyncio.gather(*burst), HANG_GUARD)
            acked.update(i for ids in burst_ids for i in ids)
            print(f"the burst was acked {time.monotonic() - killed_at:.2f}s after the kill")
            await asyncio.sleep(6)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*producers), HANG_GUARD)  # raises nothing
            after_kill = len(acked) - before
            failovers = pub.failovers
            hosts_after = pub.hosts
        print(f"{len(waits)} publish calls, {len(acked)} ids acked ({after_kill} after the "
              f"kill), longest call {max(waits):.2f}s, failovers {failovers}, publishing to "
              f"{hosts_after} {time.monotonic() - killed_at:.1f}s after the kill")  # fmt: skip
        print(f"{unanswered} messages were unanswered on the killed host's stream")
        assert unanswered > 0 and failovers >= 1 and address not in hosts_after
        assert after_kill > 0

        seen = await _drain(client, q, acked)
        lost = acked - set(seen)
        # a batch resent after the kill may have been stored before it: same body, new id
        duplicates = sum(n - 1 for n in Counter(seen.values()).values())
        print(f"acked {len(acked)}, delivered {len(seen)}, lost {len(lost)}, "
              f"delivered more than once {duplicates}")  # fmt: skip
        assert lost == set()


async def test_on_a_single_node_the_route_is_empty(client: AsyncClient) -> None:
    q = unique()
    await client.create_queue(q)
    await client.create_group(q, GROUP)
    route = await client.request("GET", f"/v1/queues/{q}/publishers")
    assert route == {"queue": q, "input_hosts": [], "refresh_seconds": 10}
    doc = await client.request("GET", "/openapi.json")
    assert "get" in doc["paths"]["/v1/queues/{queue}/publishers"]
    with pytest.raises(QueueNotFound):
        await client.request("GET", f"/v1/queues/{unique()}/publishers")
    async with client.publisher(q) as pub:
        assert pub.hosts == [""]  # through the client's URL
        ids = [i for _ in range(5) for i in await pub.publish([f"s{j}" for j in range(100)])]
    assert len(set(ids)) == 500
    seen = await _drain(client, q, set(ids))
    assert set(seen) == set(ids)


async def test_the_route_needs_the_produce_scope(tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps([
        {"key": "admin-key", "scopes": ["admin"]},
        {"key": "prod-key", "scopes": ["produce"], "prefixes": ["orders"]},
        {"key": "cons-key", "scopes": ["consume"], "prefixes": ["orders"]},
    ]))  # fmt: skip
    node = ServerProcess(tmp_path / "node", stores=1, extra=["--auth-file", str(keys)]).start()
    try:
        async with AsyncClient(node.url, api_key="admin-key") as admin:
            await admin.create_queue("orders")
            await admin.create_queue("other")
        route = "/v1/queues/{}/publishers"
        for key, queue, error in [
            (None, "orders", Unauthorized),
            ("cons-key", "orders", Forbidden),
            ("prod-key", "other", Forbidden),
        ]:
            async with AsyncClient(node.url, api_key=key) as client:
                with pytest.raises(error):
                    await client.request("GET", route.format(queue))
        async with AsyncClient(node.url, api_key="prod-key") as producer:
            assert (await producer.request("GET", route.format("orders")))["input_hosts"] == []
            async with producer.publisher("orders") as pub:
                assert len(await pub.publish(["with a key"])) == 1
    finally:
        node.stop()
