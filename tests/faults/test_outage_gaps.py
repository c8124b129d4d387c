"""How long clients wait during a metadata outage (docs/operations.md, "What clients see
during a metadata outage"): a cluster of 2 input hosts and 2 output hosts on a private
PostgreSQL, an HTTP producer and a streaming producer publishing, a group read by two
consume streams and a group read over HTTP; PostgreSQL is stopped as ``pg_ctl stop -m
immediate`` does (SIGQUIT) for 20 s and started again. The longest time in the outage
with no publish ack (per producer) and with no delivery (per group) must stay under
one lease TTL: by then every process answers its routing reads from memory (a call to a
store known unreachable waits at most 0.5 s) and the output hosts have agreed that the
outage is one (a slow tick of 1 s, peers asked for 0.5 s). It was 5 s for publishes and
10 s for HTTP deliveries when a metadata call waited the pool's 5 s timeout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cherami import timing
from cherami.client.asyncclient import AsyncClient
from cherami.devcluster.local import LocalCluster
from cherami.errors import CheramiError
from tests.support.liveness import Workload
from tests.support.pg import PrivatePostgres, private_postgres

__all__ = ["private_postgres"]  # the fixture, imported for pytest

pytestmark = pytest.mark.postgres

OUTAGE = 20.0
BOUND = timing.DEFAULT.lease_ttl  # seconds: the longest gap allowed (see the docstring)
QUEUE, STREAMS, HTTP = "gaps", "streams", "http"


@pytest.fixture
def gap_cluster(tmp_path: Path, private_postgres: PrivatePostgres) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path / "cluster", f"{private_postgres.url()}&schema=cherami")
    try:
        local.up()
        yield local
    finally:
        local.down()


def longest_gap(times: list[float], start: float, end: float) -> tuple[float, float]:
    """The longest stretch of [start, end] with none of ``times`` in it: its length, and
    when it began (seconds after ``start``)."""
    marks = [start, *sorted(t for t in times if start < t < end), end]
    return max((b - a, a - start) for a, b in zip(marks, marks[1:], strict=False))


async def _http_group(url: str, stop: asyncio.Event, got_at: list[float]) -> None:
    """Receive and ack the HTTP group's messages until ``stop``; note when each came."""
    async with AsyncClient(url, timeout=30) as client:
        while not stop.is_set():
            try:
                got = await client.receive(QUEUE, HTTP, max_messages=100, wait_seconds=1)
                if got:
                    got_at.extend([time.time()] * len(got))
                    await client.ack(QUEUE, HTTP, [m.receipt or "" for m in got])
            except CheramiError:
                await asyncio.sleep(0.1)


@pytest.mark.timeout(150)
async def test_no_client_waits_a_lease_ttl_in_a_metadata_outage(
    gap_cluster: LocalCluster, private_postgres: PrivatePostgres
) -> None:
    url = gap_cluster.url
    async with AsyncClient(url, timeout=30) as client:
        await client.create_queue(QUEUE)
        await client.create_group(QUEUE, STREAMS, visibility_timeout_seconds=10)
        await client.create_group(QUEUE, HTTP, visibility_timeout_seconds=10)
    work = Workload(url, QUEUE, STREAMS, 10.0)
    work.start_stream_consumer("stream-a")
    work.start_stream_consumer("stream-b")
    work.start_http_producer("hp-0")
    work.start_stream_producer("sp-0")
    h = work.history
    stop_http = asyncio.Event()
    http_at: list[float] = []
    http_task = asyncio.create_task(_http_group(url, stop_http, http_at))
    try:
        deadline = time.monotonic() + 30  # every client at work before the outage
        while time.monotonic() < deadline and not (
            http_at and {d.consumer for d in h.deliveries} >= {"stream-a", "stream-b"}
            and {b[:3] for b in h.acked} >= {"hp-", "sp-"}
        ):  # fmt: skip
            await asyncio.sleep(0.2)
        assert time.monotonic() < deadline, "the clients were not all at work in 30 s"
        stopped_at = time.time()
        await asyncio.to_thread(private_postgres.stop, "immediate")
        await asyncio.sleep(OUTAGE)  # the outage itself: what is measured happens in it
        await asyncio.to_thread(private_postgres.start)
        started_at = time.time()
    finally:
        stop_http.set()
        await work.stop_producers()
        await work.stop_consumers()
        await asyncio.wait_for(http_task, 10)
    acks = {p: [t for b, t in h.acked.items() if b.startswith(p)] for p in ("hp-0-", "sp-0-")}
    delivered = [d.at for d in h.deliveries]
    gaps = {
        "publish acks, HTTP": longest_gap(acks["hp-0-"], stopped_at, started_at),
        "publish acks, stream": longest_gap(acks["sp-0-"], stopped_at, started_at),
        "deliveries, stream group": longest_gap(delivered, stopped_at, started_at),
        "deliveries, HTTP group": longest_gap(http_at, stopped_at, started_at),
    }
    shown = {k: (round(v, 2), round(at, 1)) for k, (v, at) in gaps.items()}
    print(f"\n=== {started_at - stopped_at:.1f} s metadata outage, longest gaps (s, and "
          f"when they began, s into it): {shown}; client errors: {dict(h.errors)}")  # fmt: skip
    long = {k: round(v, 2) for k, (v, _) in gaps.items() if v >= BOUND}
    assert not long, f"waited a lease TTL ({BOUND} s) or more in the outage: {long}"
