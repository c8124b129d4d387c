"""Fast failover of a paused input host: HTTP producers (the client's own retries) and a
stream producer keep publishing while the input host of the queue's extents is stopped
(SIGSTOP) for 10 s, by moving to the extents the controller opens elsewhere; every acked
message is delivered."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.devcluster.local import LocalCluster
from tests.support.drain import drain
from tests.support.pgcluster import PG, cluster_on_postgres

QUEUE, GROUP = "paused", "g"
PAUSE = 10.0

pytestmark = pytest.mark.postgres


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, str]]:
    counts = {"storehost": 3, "controller": 1, "inputhost": 2, "outputhost": 1, "frontend": 1}
    with cluster_on_postgres(tmp_path / "cluster", counts) as up:
        yield up


def _input_host_of_the_queue(local: LocalCluster, schema: str) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with psycopg.connect(PG) as conn:
            row = conn.execute(
                f"SELECT h.address FROM {schema}.extents e JOIN {schema}.hosts h "
                "ON h.id = e.input_host WHERE e.queue = %s AND e.status = 'open'",
                (QUEUE,),
            ).fetchone()
        if row:
            return next(n for n, p in local.procs.items() if p.address == row[0])
        time.sleep(0.2)
    raise AssertionError("the queue never got an open extent")


class Producers:
    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.acked: dict[str, list[tuple[float, float, list[str]]]] = {}  # sent, acked, bodies
        self.stop = asyncio.Event()

    async def http(self, name: str) -> None:
        await self._loop(name, lambda bodies: self.client.publish(QUEUE, bodies))

    async def stream(self, name: str) -> None:
        async with self.client.publisher(QUEUE, max_in_flight=4) as pub:
            await self._loop(name, pub.publish)

    async def _loop(self, name: str, publish: object) -> None:
        done = self.acked.setdefault(name, [])
        n = 0
        while not self.stop.is_set():
            bodies = [f"{name}-{n + i}" for i in range(20)]
            n += 20
            sent = time.monotonic()
            await publish(bodies)  # type: ignore[operator]
            done.append((sent, time.monotonic(), bodies))


async def test_producers_move_off_a_paused_input_host(
    cluster: tuple[LocalCluster, str],
) -> None:
    local, schema = cluster
    async with AsyncClient(local.url, timeout=60) as client:
        await client.create_queue(QUEUE)
        await client.create_group(QUEUE, GROUP)
        victim = _input_host_of_the_queue(local, schema)
        producers = Producers(client)
        tasks = [
            asyncio.create_task(producers.http("h1")),
            asyncio.create_task(producers.http("h2")),
            asyncio.create_task(producers.stream("s")),
        ]
        await asyncio.sleep(2)
        paused_at = time.monotonic()
        local.signal(victim, signal.SIGSTOP)
        try:
            await asyncio.sleep(PAUSE)
        finally:
            local.signal(victim, signal.SIGCONT)
        resumed_at = time.monotonic()
        await asyncio.sleep(2)
        producers.stop.set()
        await asyncio.gather(*tasks)

        for name, acks in producers.acked.items():
            longest = max(acked - sent for sent, acked, _ in acks)
            print(f"{name}: {len(acks)} batches, longest wait {longest:.2f}s")
            during = [a for _, a, _ in acks if paused_at < a < resumed_at]
            assert during, f"{name} published nothing while the input host was paused"

        acked = {b for acks in producers.acked.values() for _, _, bodies in acks for b in bodies}
        delivered = set(await drain(client, QUEUE, GROUP, wait_seconds=2))
        assert acked - delivered == set(), f"{len(acked - delivered)} acked messages lost"
