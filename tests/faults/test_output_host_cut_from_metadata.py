"""The other side of riding out a metadata outage (roles/outputhost/outage.py): an output
host cut off from the metadata store *alone* must stop acting at its leases' end, since
its peer still reaches the store and takes its extents over.

Hosts in network namespaces (cherami.devcluster.netns), the metadata PostgreSQL on the
gateway (the root namespace) with the producers and consumers beside it. One output host
is cut off from the root namespace for 12 s: it reaches neither the store nor the
clients, but still reaches its peer, the frontend and the store hosts, so the frontend
goes on forwarding receives to it. Its peer answers that it reaches the store, so the
cut host must not act on: lost 0, no message held by two consumers at once, and its
extents delivered by the peer during the cut. (A peer whose own ownership tick is slow
on a loaded machine says it cannot reach the store either, and takes nothing meanwhile:
the cut host may act on while such a tick runs, and only then.) (A stream ack the cut
host applied but could not persist is delivered again by the peer: at least once, as
after any failover.) Needs root, iproute2 and iptables; a missing facility fails the
test."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.devcluster.netns import ROOT, NetnsCluster
from tests.support.liveness import Workload
from tests.support.netnspg import netns_cluster_on_pg

COUNTS = {"storehost": 3, "controller": 1, "inputhost": 1, "outputhost": 2, "frontend": 1}
CUT_SECONDS = 12.0
GROUP = "g"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NetnsCluster]:
    with netns_cluster_on_pg(tmp_path / "cluster", COUNTS, ["a", "b"]) as cluster:
        yield cluster


async def _holders(url: str, queue: str) -> list[str]:
    async with AsyncClient(url) as client:
        route = await client.request("GET", f"/v1/queues/{queue}/groups/{GROUP}/consumers")
    return sorted(h["address"] for h in route["output_hosts"])


def _stamp(line: str) -> float:
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _acting_on_unvouched(cut_log: str, peer_log: str) -> list[str]:
    """The cut host's "acting on" lines that its peer did not vouch for. The peer says it
    cannot reach the store while one of its ownership ticks fails or runs past timing.slow_tick
    (a loaded machine can do that with the store in reach); it takes nothing then, so the
    cut host acting on its word is safe, and the peer logs such a tick (as it ends or
    fails) and its answer ("told a peer ...", binding it to take nothing meanwhile)."""
    said = ("ownership tick took", "extent ownership tick failed", "told a peer the metadata")
    slow = [_stamp(ln) for ln in peer_log.splitlines() if any(s in ln for s in said)]
    return [ln for ln in cut_log.splitlines() if "acting on for" in ln
            and not any(abs(t - _stamp(ln)) < 10 for t in slow)]  # fmt: skip


@pytest.mark.timeout(150)
async def test_output_host_cut_from_the_store_alone_stops_acting(
    cluster: NetnsCluster,
) -> None:
    network = cluster.network
    queue = "cut-out"
    visibility = 10.0
    async with AsyncClient(cluster.url) as client:
        await client.create_queue(queue)
        await client.create_group(queue, GROUP, visibility_timeout_seconds=visibility)
    work = Workload(cluster.url, queue, GROUP, visibility)
    work.start_stream_consumer("stream-a")
    work.start_http_consumer("http-a")
    work.start_http_producer("hp-0")
    work.start_stream_producer("sp-0")
    try:
        deadline = time.monotonic() + 20
        while len(await _holders(cluster.url, queue)) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        assert len(await _holders(cluster.url, queue)) == 2, "the group is not spread"
        cut = cluster.names("outputhost")[1]
        cut_address = f"{network.hosts[cut].ip}:"
        cut_at = time.time()
        network.cut(cut, ROOT)
        await asyncio.sleep(CUT_SECONDS)
        during = await _holders(cluster.url, queue)
        network.heal()
        healed_at = time.time()
        await asyncio.sleep(5)
        await work.stop_producers()
        complete = await work.until_delivered(40)
    finally:
        network.heal()
        await work.stop_producers()
        await work.stop_consumers()

    h = work.history
    report = h.report()
    log_text = cluster.procs[cut].log.read_text(errors="replace")
    delivered_late_in_cut = sum(1 for d in h.deliveries if cut_at + 6 < d.at < healed_at)
    print(f"output host cut from the store: {report}, holders at the cut's end {during}, "
          f"delivered in the cut's last {CUT_SECONDS - 6:.0f} s {delivered_late_in_cut}, "
          f"all delivered {complete}")  # fmt: skip
    peer = next(n for n in cluster.names("outputhost") if n != cut)
    unvouched = _acting_on_unvouched(log_text, cluster.procs[peer].log.read_text(errors="replace"))
    assert not unvouched, f"the cut host acted on past its leases on no peer's word: {unvouched}"
    assert not any(a.startswith(cut_address) for a in during), during
    assert delivered_late_in_cut > 0, "the peer did not take the cut host's extents over"
    assert report["acked"] > 500, report
    assert report["lost"] == 0, h.lost_bodies()
    assert report["unexpected"] == 0, report
    assert report["concurrent_duplicates"] == 0, h.describe_pairs()
    assert not h.consumer_failures, h.consumer_failures
