"""Publish limits in a cluster (docs/operations.md §9, "Publish limits"): a queue whose
open extents sit on 2 input hosts is limited by both together (each enforces its share),
and a 429 forwarded by a frontend keeps its Retry-After. Real processes on PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.cluster.local import LocalCluster
from tests.support.pgcluster import cluster_fixture
from tests.support.server import unique

RATE = 200.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    counts = {"storehost": 1, "controller": 1, "inputhost": 2, "outputhost": 1, "frontend": 1}
    yield from cluster_fixture(tmp_path_factory, "throttle-cluster", counts)


async def test_a_queues_limit_holds_over_its_input_hosts(cluster: LocalCluster) -> None:
    q = unique()
    async with AsyncClient(cluster.url) as client:
        await client.create_queue(q, replicas=1, min_extents=2, publish_rate=RATE,
                                  publish_burst=20)  # fmt: skip
        deadline = time.monotonic() + 30
        while len((await client.request("GET", f"/v1/queues/{q}/publishers"))["input_hosts"]) < 2:
            assert time.monotonic() < deadline, "the queue never had extents on 2 input hosts"
            await asyncio.sleep(0.2)
        # through the frontend: a refusal by an input host comes back with its Retry-After
        async with httpx.AsyncClient(base_url=cluster.url) as http:
            body = {"messages": [{"body": "x"}] * 10}
            replies = [await http.post(f"/v1/queues/{q}/messages", json=body) for _ in range(6)]
        refused = [r for r in replies if r.status_code == 429]
        assert refused and all(r.status_code in (200, 429) for r in replies)
        assert refused[0].headers["Retry-After"] == "1"
        assert refused[0].json()["error"]["code"] == "throttled"

        async def pump(seconds: float) -> int:
            end, sent = time.monotonic() + seconds, 0
            while time.monotonic() < end:
                sent += len(await client.publish(q, [b"m"] * 10))
            return sent

        await asyncio.sleep(0.5)
        seconds = 4.0
        sent = sum(await asyncio.gather(*(pump(seconds) for _ in range(4))))
        extents = (await client.request("GET", f"/v1/queues/{q}/extents"))["extents"]
    stored = Counter({e["input_host"]: e["last_seq"] for e in extents if e["kind"] == "plain"})
    rate = sent / seconds
    print(f"queue limit {RATE:.0f}/s over 2 input hosts: {rate:.0f}/s, stored per host "
          f"{dict(stored)}")  # fmt: skip
    assert len(stored) == 2 and min(stored.values()) > 0
    assert RATE * 0.6 <= rate <= RATE * 1.15
