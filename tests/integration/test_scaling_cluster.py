"""Throughput scaling on a real cluster (PostgreSQL metadata, a schema of its own): a
producer's rate goes up past the queue's extent_target_rate and down again, the open
extent count follows it (spread over the input hosts), no publish fails and no acked
message is lost. GET /v1/cluster and ``cherami cluster status --json`` show it.

The windows are shortened here (up 3 s, down 8 s, reports every 1 s; the defaults are
10 s, 60 s and 2 s).

The second test rolls the extents over by size every second or two (as a queue at full
speed does with the default 1,000,000 messages an extent): each roll-over started the
up window again and its successor read 0 msgs/s, so a saturated queue stayed at 1 or 2
extents (issue 33, part 1)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.devcluster.local import LocalCluster
from tests.integration.test_cli import cherami
from tests.support.drain import drain
from tests.support.pgcluster import PG, cluster_on_postgres

QUEUE, GROUP = "ramp", "g"
TARGET = 500  # msgs/s per extent
HIGH, LOW = 1400, 100  # msgs/s: 3 extents carry 467/s each (< TARGET), 2 carry 700/s
HANG_GUARD = 30.0

pytestmark = pytest.mark.postgres


def _cluster(path: Path, inputs: int, *extra: str) -> Iterator[tuple[LocalCluster, str]]:
    counts = {"storehost": 3, "controller": 1, "inputhost": inputs, "outputhost": 1,
              "frontend": 1}  # fmt: skip
    args = ["--scale-up-window", "3", "--scale-down-window", "8",
            "--load-report-interval", "1", *extra]  # fmt: skip
    with cluster_on_postgres(path, counts, args) as up:
        yield up


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, str]]:
    yield from _cluster(tmp_path / "cluster", 2, "--zone", "z1")


@pytest.fixture
def rolling_cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, str]]:
    yield from _cluster(tmp_path / "cluster", 3, "--extent-max-messages", "1500")


def _open_plain(schema: str) -> list[tuple[str, str]]:
    """(extent, input host) of the queue's open plain extents."""
    with psycopg.connect(PG) as conn:
        rows = conn.execute(
            f"SELECT id, input_host FROM {schema}.extents "
            "WHERE queue = %s AND status = 'open' AND kind = 'plain'",
            (QUEUE,),
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


class Producer:
    """Publishes at ``rate`` msgs/s in batches of 50 from two tasks; counts errors."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.rate = LOW
        self.acked: set[str] = set()
        self.errors: list[BaseException] = []
        self.stop = asyncio.Event()
        self._n = 0

    async def run(self) -> None:
        await asyncio.gather(self._one(), self._one())

    async def _one(self) -> None:
        next_at = time.monotonic()
        while not self.stop.is_set():
            bodies = [f"m{self._n + i}" for i in range(50)]
            self._n += 50
            try:
                await self.client.publish(QUEUE, bodies)
                self.acked.update(bodies)
            except Exception as err:  # noqa: BLE001 - every failure is a test failure
                self.errors.append(err)
            next_at += 50 / (self.rate / 2)
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at = max(next_at, time.monotonic() - 1)


async def _stop_and_drain(
    client: AsyncClient, producer: Producer, task: asyncio.Task[None]
) -> None:
    """Stop the producer (no publish may have failed), then every acked message must be
    delivered: lost 0."""
    producer.stop.set()
    await task
    assert producer.errors == []
    delivered = set(await drain(client, QUEUE, GROUP, wait_seconds=2))
    lost = producer.acked - delivered
    print(f"published {len(producer.acked)}, delivered {len(delivered)}, lost {len(lost)}")
    assert lost == set()


async def _until(check: object, what: str, limit: float = HANG_GUARD) -> float:
    start = time.monotonic()
    while not check():  # type: ignore[operator]
        assert time.monotonic() - start < limit, f"never: {what}"
        await asyncio.sleep(0.25)
    return time.monotonic() - start


async def test_extent_count_follows_the_rate(cluster: tuple[LocalCluster, str]) -> None:
    local, schema = cluster
    async with AsyncClient(local.url, timeout=30) as client:
        made = await client.create_queue(
            QUEUE, replicas=2, min_extents=1, max_extents=4, extent_target_rate=TARGET
        )
        assert (made["min_extents"], made["max_extents"]) == (1, 4)
        defaulted = await client.create_queue("other", replicas=2)
        assert defaulted["min_extents"] == 2  # a cluster's default
        await client.create_group(QUEUE, GROUP)
        producer = Producer(client)
        task = asyncio.create_task(producer.run())
        await asyncio.sleep(4)
        assert len(_open_plain(schema)) == 1, "scaled up at a low rate"

        producer.rate = HIGH
        up = await _until(lambda: len(_open_plain(schema)) == 3, "3 extents at 1,400 msgs/s")
        print(f"1 -> 3 extents in {up:.1f}s")
        hosts = {h for _, h in _open_plain(schema)}
        assert len(hosts) == 2, "the queue's extents are not spread over the input hosts"
        await asyncio.sleep(6)
        assert len(_open_plain(schema)) == 3, "the count moved at a steady rate"

        body = await client.request("GET", "/v1/cluster")
        by_id = {h["id"]: h for h in body["hosts"]}
        assert len(body["hosts"]) == 8 and all(h["alive"] for h in body["hosts"])
        assert all(h["zone"] == "z1" for h in body["hosts"])
        (queue,) = [q for q in body["queues"] if q["name"] == QUEUE]
        plain = [e for e in queue["extents"] if e["kind"] == "plain"]
        assert len(plain) == 3 and queue["rate"] > HIGH / 2
        for extent in plain:
            assert extent["input_host"] == by_id[extent["input_host_id"]]["address"]
            assert len(extent["stores"]) == 2
        stores = [h for h in body["hosts"] if h["role"] == "storehost"]
        assert any(h["load"] and h["load"].get("append_p99_ms") for h in stores)
        extents = (await client.request("GET", f"/v1/queues/{QUEUE}/extents"))["extents"]
        open_rates = [e["rate"] for e in extents if e["status"] == "open" and e["kind"] == "plain"]
        assert sum(open_rates) > HIGH / 2
        status = await asyncio.to_thread(
            cherami, None, "cluster", "status", "--json", url=local.url
        )
        assert status.returncode == 0, status.stderr
        assert {h["id"] for h in json.loads(status.stdout)["hosts"]} == set(by_id)

        producer.rate = LOW
        down = await _until(lambda: len(_open_plain(schema)) == 1, "back to 1 extent", 40)
        print(f"3 -> 1 extents in {down:.1f}s")
        await _stop_and_drain(client, producer, task)


async def test_extents_scale_while_they_roll_over(
    rolling_cluster: tuple[LocalCluster, str],
) -> None:
    local, schema = rolling_cluster
    async with AsyncClient(local.url, timeout=30) as client:
        # a lower target than above: 3 extents even if a loaded machine publishes only
        # 900 of the 1,400 msgs/s asked (450 an extent on 2)
        await client.create_queue(
            QUEUE, replicas=2, min_extents=1, max_extents=3, extent_target_rate=300
        )
        await client.create_group(QUEUE, GROUP)
        producer = Producer(client)
        producer.rate = HIGH
        task = asyncio.create_task(producer.run())
        up = await _until(lambda: len(_open_plain(schema)) >= 3, "3 extents while rolling")
        hosts = {h for _, h in _open_plain(schema)}
        print(f"1 -> 3 extents in {up:.1f}s rolling over, on {len(hosts)} input hosts")
        assert len(hosts) == 3, hosts
        producer.rate = LOW  # 100 msgs/s: 33-50 an extent, below half the target
        down = await _until(lambda: len(_open_plain(schema)) == 1, "back to 1 extent", 40)
        print(f"3 -> 1 extents in {down:.1f}s")
        await _stop_and_drain(client, producer, task)
