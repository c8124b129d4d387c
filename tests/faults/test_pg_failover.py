"""Metadata on a PostgreSQL that fails over (issue 33, part 4): a cluster of role processes
whose metadata URL names a primary and its synchronous streaming standby
(``postgresql://h1:p1,h2:p2/db?target_session_attrs=read-write``, the standby listed
first, so every connection made before the failover is refused by it and goes on to the
primary), with HTTP and stream producers and consumers of one competing group at work.

The primary's processes are SIGKILLed at once (its machine lost), ``DOWN`` seconds pass
(a failover manager noticing), and the standby is promoted with ``pg_ctl promote``. The
roles' pools drop their dead connections and reconnect to the promoted standby. Checked:
no acked message lost and none held by two consumers at once (tests/support/liveness.py),
publishing and delivering back within ``BACK_WITHIN`` of the promote, and a queue made
after the promote (a write of every role to the new primary: the queue, its extents
under the leader's fenced epoch, a unit's lease and ack level) carries a message within
``BACK_WITHIN`` too. The leases live in the promoted database, at epochs of its new
timeline: the leader's epoch went forward. The gaps are printed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.devcluster.local import LocalCluster
from cherami.errors import CheramiError
from cherami.roles.controller.leader import LEASE
from tests.support.liveness import Workload
from tests.support.pgpair import PrimaryStandby

pytestmark = pytest.mark.postgres

COUNTS = {"storehost": 3, "controller": 2, "inputhost": 1, "outputhost": 2, "frontend": 1}
GROUP = "workers"
VISIBILITY = 10.0
DOWN = 5.0  # seconds from the primary's death to the promote: past every lease's TTL (3 s)
BACK_WITHIN = 10.0  # seconds after the promote: traffic flows again by then
TIMELINE = 1 << 32  # the epochs of one timeline (metadata/postgres_failover.py)


@pytest.fixture
def pair() -> Iterator[PrimaryStandby]:
    pg = PrimaryStandby(synchronous=True)
    try:
        yield pg.start()
    finally:
        pg.remove()


@pytest.fixture
def cluster(tmp_path: Path, pair: PrimaryStandby) -> Iterator[LocalCluster]:
    url = pair.url(standby_first=True) + "?target_session_attrs=read-write&schema=cherami"
    local = LocalCluster(tmp_path / "cluster", url, COUNTS)
    try:
        local.up()
        yield local
    finally:
        local.down()


def _leader_epoch(url: str) -> tuple[str, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT holder, epoch FROM cherami.leases WHERE name = %s", (LEASE,)
        ).fetchone()
    assert row is not None, "no leader lease"
    return str(row[0]), int(row[1])


def _stall(times: list[float], start: float, end: float) -> float:
    """The longest time from ``start`` to ``end`` with no event of ``times``."""
    marks = [start, *sorted(t for t in times if start < t < end), end]
    return max(b - a for a, b in zip(marks, marks[1:], strict=False))


async def _until(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.1)


async def _round_trip(url: str, queue: str, timeout: float) -> float:
    """Make ``queue`` and a group, publish one message and receive it; the seconds it
    took, retrying what fails (the store may still be unreachable)."""
    started = time.monotonic()
    deadline = started + timeout
    async with AsyncClient(url, timeout=5) as client:
        for step in ("queue", "group", "publish", "receive"):
            while True:
                try:
                    if step == "queue":
                        await client.create_queue(queue)
                    elif step == "group":
                        await client.create_group(queue, GROUP)
                    elif step == "publish":
                        await client.publish(queue, ["after the promote"])
                    else:
                        got = await client.receive(queue, GROUP, wait_seconds=1)
                        if not got:
                            raise CheramiError("nothing yet")
                        await client.ack(queue, GROUP, [m.receipt or "" for m in got])
                    break
                except CheramiError as err:
                    if err.code == "already_exists":
                        break
                    assert time.monotonic() < deadline, f"{queue}: {step} failed: {err}"
                    await asyncio.sleep(0.2)
    return time.monotonic() - started


@pytest.mark.timeout(120)
async def test_metadata_failover_to_a_promoted_standby(
    cluster: LocalCluster, pair: PrimaryStandby
) -> None:
    queue = "failover"
    async with AsyncClient(cluster.url) as client:
        await client.create_queue(queue)
        await client.create_group(queue, GROUP, visibility_timeout_seconds=VISIBILITY)
    work = Workload(cluster.url, queue, GROUP, VISIBILITY, pace=0.05)
    work.start_stream_consumer("stream-a")
    work.start_http_consumer("http-a")
    work.start_http_producer("hp-0")
    work.start_stream_producer("sp-0")
    h = work.history
    try:
        await _until("traffic flows", lambda: len(h.seen()) >= 500, 30)
        holder, before = _leader_epoch(pair.primary.url())

        killed_at = time.time()
        await asyncio.to_thread(pair.kill_primary)
        await asyncio.sleep(DOWN)  # the failover manager's detection time
        await asyncio.to_thread(pair.promote)
        promoted_at = time.time()
        new_queue_s = await _round_trip(cluster.url, "made-after", 30)
        await _until(
            "traffic after the promote",
            lambda: (
                any(d.at > promoted_at + 3 for d in h.seen())
                and any(t > promoted_at + 3 for t in h.acked.values())
            ),
            30,
        )
        stopped_at = time.time()
        await work.stop_producers()
        complete = await work.until_delivered(30)
    finally:
        await work.stop_producers()
        await work.stop_consumers()

    now_holder, after = _leader_epoch(pair.standby.url())
    report = h.report()
    deliveries = [d.at for d in h.seen()]
    publishes = list(h.acked.values())
    gaps = {
        "publish_gap_s": _stall(publishes, killed_at, stopped_at),
        "delivery_gap_s": _stall(deliveries, killed_at, stopped_at),
        "publish_back_s": _stall(publishes, promoted_at, stopped_at),
        "delivery_back_s": _stall(deliveries, promoted_at, stopped_at),
        "new_queue_round_trip_s": new_queue_s,
    }
    print(f"\n=== metadata failover (primary killed, standby promoted {DOWN:.0f} s later)")
    for key, value in {**report, **{k: round(v, 2) for k, v in gaps.items()}}.items():
        print(f"  {key}: {value}")
    print(f"  leader: {holder} epoch {before} -> {now_holder} epoch {after}")
    print(f"  timeline: {pair.timeline(pair.standby)}; all delivered: {complete}")
    for line in h.describe_pairs():
        print("  concurrent:", line)
    if h.error_samples:
        print("  error samples:", h.error_samples)

    assert report["acked"] > 500, report
    assert report["lost"] == 0, h.lost_bodies()
    assert report["unexpected"] == 0, report
    assert report["concurrent_duplicates"] == 0, h.describe_pairs()
    assert not h.consumer_failures, h.consumer_failures
    internal = {k: n for k, n in report["errors"].items() if k.endswith(":internal")}
    assert not internal, f"500 internal answered: {internal}"
    for key in ("publish_back_s", "delivery_back_s", "new_queue_round_trip_s"):
        assert gaps[key] <= BACK_WITHIN, gaps
    assert after >= TIMELINE > before, (before, after)  # forward: the new timeline's
