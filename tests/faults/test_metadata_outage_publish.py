"""Publishing goes on through a metadata outage (issue 13, "Metadata outage"): a cluster
with PostgreSQL metadata (a private server this test stops for 20 s), an HTTP producer
and a stream producer publishing through a frontend, stream consumers draining. While
the database is down, publishes to the queue's open extents are still acked (the request
paths answer from their last reads, metadata/remembered.py); deliveries pause (an output
host that cannot renew its group's lease stops acting, docs/operations.md §9) and resume
by themselves when it returns. Afterwards every acked message is delivered: lost 0."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.cluster.local import LocalCluster
from tests.support.liveness import Workload
from tests.support.pg import PrivatePostgres, private_postgres

__all__ = ["private_postgres"]  # the fixture, imported for pytest

pytestmark = pytest.mark.postgres

OUTAGE = 20.0
SETTLE = 2.0  # seconds into the outage from which every read is answered from memory


@pytest.fixture
def cluster(tmp_path: Path, private_postgres: PrivatePostgres) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path / "cluster", f"{private_postgres.url()}&schema=cherami")
    try:
        local.up()
        yield local
    finally:
        local.down()


@pytest.mark.timeout(150)
async def test_publishing_goes_on_through_a_metadata_outage(
    cluster: LocalCluster, private_postgres: PrivatePostgres
) -> None:
    queue, group = "outage-publish", "workers"
    async with AsyncClient(cluster.url) as client:
        await client.create_queue(queue)
        await client.create_group(queue, group, visibility_timeout_seconds=10)
    work = Workload(cluster.url, queue, group, visibility=10.0)
    work.start_http_producer("hp-0")
    work.start_stream_producer("sp-0")
    work.start_stream_consumer("stream-a")
    work.start_stream_consumer("stream-b")
    h = work.history
    await asyncio.sleep(5)  # every path has read what it needs once

    stopped_at = time.time()
    await asyncio.to_thread(private_postgres.stop)
    try:
        await asyncio.sleep(OUTAGE)
    finally:
        await asyncio.to_thread(private_postgres.start)
    started_at = time.time()
    await asyncio.sleep(6)
    await work.stop_producers()
    complete = await work.until_delivered(60)
    await work.stop_consumers()

    report = h.report()
    during = [(b, t) for b, t in h.acked.items() if stopped_at + SETTLE < t < started_at]
    by_producer = {p: sum(1 for b, _ in during if b.startswith(p + "-")) for p in ("hp", "sp")}
    delivered_during = sum(1 for d in h.deliveries if stopped_at + SETTLE < d.at < started_at)
    delivered_after = sum(1 for d in h.deliveries if d.at > started_at)
    print(
        f"\n=== metadata outage, publishing: outage {started_at - stopped_at:.1f} s, "
        f"acked during it {len(during)} ({by_producer}, "
        f"{len(during) / (started_at - stopped_at - SETTLE):.0f} msgs/s), delivered during "
        f"it {delivered_during}, after it {delivered_after}, errors {dict(report['errors'])}, "
        f"lost {report['lost']}, duplicated {report['duplicated']}, all delivered {complete}"
    )
    assert by_producer["hp"] > 0, "no HTTP publish was acked during the outage"
    assert by_producer["sp"] > 0, "no stream publish was acked during the outage"
    internal = {k: n for k, n in report["errors"].items() if k.endswith(":internal")}
    assert not internal, f"500 internal answered: {internal}"
    assert delivered_after > 0, "deliveries did not resume after the outage"
    assert complete, f"not every acked message was delivered: {h.lost_bodies()}"
    assert report["lost"] == 0, h.lost_bodies()
    assert report["unexpected"] == 0, report
