"""Jepsen-style: producers publish unique messages with retries and two consumer groups
consume and ack on a multi-process cluster (PostgreSQL metadata), while a nemesis kills
and restarts a store host, an input host, an output host and the leading controller,
pauses an input host (SIGSTOP/SIGCONT) and cuts a store host off the network. Then every
group is drained and checked: lost and unexpected must be 0."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.devcluster.local import LocalCluster
from cherami.errors import CheramiError
from tests.support.blackhole import Blackhole, free_port
from tests.support.checker import QueueHistory

PG = "postgresql://postgres@127.0.0.1:5432/test"
QUEUE, GROUPS = "jepsen", ("g1", "g2")

pytestmark = pytest.mark.postgres


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, Blackhole]]:
    schema = f"f_{uuid.uuid4().hex[:12]}"
    local = LocalCluster(tmp_path / "cluster", f"{PG}?schema={schema}")
    cut_store = local.procs["storehost-2"]
    cut_store.port = free_port()
    hole = Blackhole(cut_store.port).start()
    cut_store.advertise = hole.address
    try:
        local.up()
        yield local, hole
    finally:
        local.down()
        hole.stop()
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


class Workload:
    def __init__(self, url: str) -> None:
        self.url = url
        self.history = {g: QueueHistory() for g in GROUPS}
        self.attempted: set[str] = set()
        self.acked: set[str] = set()
        self.stop_producing = asyncio.Event()
        self.stop_consuming = asyncio.Event()
        self.last_delivery = time.monotonic()

    async def produce(self, worker: int) -> None:
        n = 0
        async with AsyncClient(self.url, timeout=20) as client:
            while not self.stop_producing.is_set():
                bodies = [f"p{worker}-{n + i}" for i in range(20)]
                n += 20
                self.attempted.update(bodies)
                while True:  # retry the same batch until it is acked
                    try:
                        await client.publish(QUEUE, bodies)
                        self.acked.update(bodies)
                        break
                    except CheramiError:
                        await asyncio.sleep(0.3)

    async def consume(self, group: str) -> None:
        history = self.history[group]
        async with AsyncClient(self.url, timeout=20) as client:
            while not self.stop_consuming.is_set():
                try:
                    got = await client.receive(QUEUE, group, max_messages=50, wait_seconds=1)
                    history.delivered.update(m.text for m in got)
                    if got:
                        self.last_delivery = time.monotonic()
                        await client.ack(QUEUE, group, [m.receipt or "" for m in got])
                except CheramiError:
                    await asyncio.sleep(0.3)

    def reports(self) -> dict[str, dict[str, int]]:
        out = {}
        for group, history in self.history.items():
            history.attempted, history.acked = self.attempted, self.acked
            out[group] = history.report()
        return out


async def _nemesis(local: LocalCluster, hole: Blackhole, log: list[str]) -> None:
    async def kill_restart(name: str, down: float = 2.0) -> None:
        log.append(f"kill {name}")
        await asyncio.to_thread(local.kill, name)
        await asyncio.sleep(down)
        await asyncio.to_thread(local.restart, name)
        log.append(f"restarted {name}")

    await asyncio.sleep(3)
    await kill_restart("storehost-0")
    await asyncio.sleep(3)
    await kill_restart("inputhost-0")
    await asyncio.sleep(3)
    await kill_restart("outputhost-0")
    await asyncio.sleep(3)
    leader = local.leader() or "controller-0"
    await kill_restart(leader)
    await asyncio.sleep(3)
    log.append("pause inputhost-1")
    local.signal("inputhost-1", signal.SIGSTOP)
    await asyncio.sleep(5)
    local.signal("inputhost-1", signal.SIGCONT)
    log.append("resume inputhost-1")
    await asyncio.sleep(3)
    log.append("cut storehost-2")
    hole.cut = True
    await asyncio.sleep(8)
    hole.cut = False
    log.append("heal storehost-2")
    await asyncio.sleep(3)


async def _run(
    local: LocalCluster, hole: Blackhole, soak_seconds: float
) -> dict[str, dict[str, int]]:
    async with AsyncClient(local.url) as client:
        await client.create_queue(QUEUE)
        for group in GROUPS:
            await client.create_group(QUEUE, group, visibility_timeout_seconds=5)
    work = Workload(local.url)
    tasks = [asyncio.create_task(work.produce(i)) for i in range(2)]
    tasks += [asyncio.create_task(work.consume(g)) for g in GROUPS for _ in range(2)]
    log: list[str] = []
    until = time.monotonic() + soak_seconds
    await _nemesis(local, hole, log)
    while time.monotonic() < until:
        await _nemesis(local, hole, log)
    work.stop_producing.set()
    await asyncio.gather(*tasks[:2])
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and time.monotonic() - work.last_delivery < 8:
        await asyncio.sleep(0.5)
    work.stop_consuming.set()
    await asyncio.gather(*tasks[2:])
    reports = work.reports()
    print("nemesis:", ", ".join(log))
    for group, report in reports.items():
        print(f"group {group}: {report}")
    return reports


@pytest.mark.timeout(3600)  # the --soak version runs for CHERAMI_SOAK_SECONDS
async def test_cluster_keeps_every_acked_message_under_faults(
    cluster: tuple[LocalCluster, Blackhole], soak_seconds: float
) -> None:
    local, hole = cluster
    reports = await _run(local, hole, soak_seconds)
    for group, report in reports.items():
        assert report["acked"] > 500, f"{group}: too little was published under faults"
        assert report["lost"] == 0, f"{group}: {report}"
        assert report["unexpected"] == 0, f"{group}: {report}"
    with contextlib.suppress(Exception):
        for name in local.names("controller"):
            print(name, "log tail:", local.procs[name].log.read_text()[-300:])
