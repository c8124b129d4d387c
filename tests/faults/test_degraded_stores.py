"""Degraded stores: a queue with 3 replicas and min_replicas 2 on 3 store hosts keeps
publishing while one store host is down (new extents on the 2 live ones), gets whole
extents again when the host returns, and delivers every acked message."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.devcluster.local import LocalCluster
from cherami.errors import CheramiError, InvalidRequest
from tests.support.drain import drain
from tests.support.pgcluster import PG, cluster_on_postgres

QUEUE, GROUP = "degraded", "g"
HANG_GUARD = 60.0  # only so that a stall fails the test instead of hanging it

pytestmark = pytest.mark.postgres


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, str]]:
    counts = {"storehost": 3, "controller": 1, "inputhost": 1, "outputhost": 1, "frontend": 1}
    with cluster_on_postgres(tmp_path / "cluster", counts) as up:
        yield up


def _open_extent_replicas(schema: str) -> list[int]:
    with psycopg.connect(PG) as conn:
        rows = conn.execute(
            f"SELECT cardinality(stores) FROM {schema}.extents "
            "WHERE queue = %s AND status = 'open' AND kind = 'plain'",
            (QUEUE,),
        ).fetchall()
    return [r[0] for r in rows]


async def _until(check: object, what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.2)


class Producer:
    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.acked: list[tuple[float, list[str]]] = []  # (when, bodies)
        self.stop = asyncio.Event()

    async def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            bodies = [f"m{n + i}" for i in range(20)]
            n += 20
            while True:  # the same batch again until it is acked
                try:
                    await self.client.publish(QUEUE, bodies)
                    break
                except CheramiError:
                    await asyncio.sleep(0.2)
            self.acked.append((time.monotonic(), bodies))

    def acked_since(self, when: float) -> int:
        return sum(len(b) for t, b in self.acked if t > when)


async def test_one_store_host_down_does_not_stop_publishing(
    cluster: tuple[LocalCluster, str],
) -> None:
    local, schema = cluster
    async with AsyncClient(local.url, timeout=30) as client:
        created = await client.create_queue(QUEUE, replicas=3, min_replicas=2)
        assert created["min_replicas"] == 2
        with pytest.raises(InvalidRequest):
            await client.update_queue(QUEUE, min_replicas=4)
        await client.create_group(QUEUE, GROUP)
        producer = Producer(client)
        task = asyncio.create_task(producer.run())
        await _until(lambda: producer.acked_since(0) >= 200, "publishing started")

        killed_at = time.monotonic()
        await asyncio.to_thread(local.kill, "storehost-0")
        await _until(lambda: producer.acked_since(killed_at) >= 200, "publishing resumed")
        await _until(lambda: 2 in _open_extent_replicas(schema), "a degraded extent opened")
        gaps = [b[0] - a[0] for a, b in zip(producer.acked, producer.acked[1:], strict=False)]
        print(f"longest gap between acked batches: {max(gaps):.2f}s")

        await asyncio.to_thread(local.restart, "storehost-0")
        await _until(
            lambda: (r := _open_extent_replicas(schema)) and all(n == 3 for n in r),
            "whole extents again after the store host returned",
        )
        returned_at = time.monotonic()
        await _until(lambda: producer.acked_since(returned_at) >= 200, "publishing goes on")
        producer.stop.set()
        await task

        acked = {body for _, bodies in producer.acked for body in bodies}
        delivered = set(await drain(client, QUEUE, GROUP, wait_seconds=2))
        assert acked - delivered == set(), f"{len(acked - delivered)} acked messages lost"
        assert delivered - acked <= {f"m{i}" for i in range(len(acked) + 20)}
