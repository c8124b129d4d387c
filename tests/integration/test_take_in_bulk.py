"""A cluster's output host that takes many groups at once (a restart of it here; the
successors the leader opens after a power loss, issue 34) loads or syncs the groups of
each take from their rows read together (roles/outputhost/syncrows.py ``Named``), not
four to six metadata calls for each group one after another.

Real role processes on PostgreSQL metadata (tests/support/pgcluster.py), the restarted
output host's metadata calls counted from its /metrics. Before the change the restarted
output host read each group's records, ack levels, extents and parked messages on its
own: GROUPS calls each of ``get_queue``, ``get_ack_levels``, ``list_extents`` and
``get_redeliveries`` (60 each at 30 queues x 2 groups); after it, none, and a call of
each of the named reads."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.devcluster.local import LocalCluster
from cherami.errors import Unavailable
from tests.support.pgcluster import cluster_on_postgres
from tests.support.server import unique

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]

COUNTS = {"storehost": 1, "controller": 1, "inputhost": 1, "outputhost": 1, "frontend": 1}
QUEUES, NAMES = 30, ("a", "b")
GROUPS = QUEUES * len(NAMES)
WAIT = 60.0  # a condition waited for this long at most
CALLS = re.compile(r'^cherami_metadata_call_latency_seconds_count\{op="([^"]+)"\} (\S+)$', re.M)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with cluster_on_postgres(tmp_path / "cluster", COUNTS) as (local, _schema):
        yield local


def metadata_calls(cluster: LocalCluster, name: str) -> dict[str, float]:
    text = httpx.get(f"http://{cluster.procs[name].address}/metrics", timeout=30).text
    return {op: float(n) for op, n in CALLS.findall(text)}


async def delivered(c: AsyncClient, queue: str, group: str, text: str) -> None:
    """Until the group is delivered ``text`` (acking whatever it is delivered: a message
    acked before a restart may come again)."""
    deadline = time.monotonic() + WAIT
    while True:
        assert time.monotonic() < deadline, f"{queue}/{group}: no {text!r} in {WAIT} s"
        try:
            got = await c.receive(queue, group, max_messages=10, wait_seconds=1)
            if got:
                await c.ack(queue, group, got)
        except Unavailable:  # the group moving to the restarted output host: again
            await asyncio.sleep(0.2)  # a retry's pace, not a synchronization
            continue
        if any(m.text == text for m in got):
            return


async def test_a_restarted_output_host_loads_the_groups_it_takes_from_rows_read_together(
    cluster: LocalCluster,
) -> None:
    async with AsyncClient(cluster.url, timeout=30) as c:
        queues = [unique("q") for _ in range(QUEUES)]
        for queue in queues:
            await c.create_queue(queue, replicas=1)
            for name in NAMES:
                await c.create_group(queue, name)
            await c.publish(queue, ["m"])  # once the queue's extents are open
        cluster.signal("outputhost-0", signal.SIGKILL)
        cluster.procs["outputhost-0"].popen.wait(10)  # type: ignore[union-attr]
        cluster.restart("outputhost-0")
        # it takes every unit once its last session has expired, and loads their groups
        await asyncio.gather(*(delivered(c, q, g, "m") for q in queues for g in NAMES))
    calls = metadata_calls(cluster, "outputhost-0")
    # one by one: a call of each for each group (a receive reads its group's record)
    for one_by_one in ("get_ack_levels", "get_queue", "list_extents", "get_redeliveries"):
        assert calls.get(one_by_one, 0) < GROUPS / 4, (one_by_one, calls)
    assert calls.get("ack_levels_named", 0) >= 1, calls
