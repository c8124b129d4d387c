"""A cluster with many queues comes back after its controllers and its store hosts are
restarted, and every message published before is delivered after (issue 34, part 1:
"the same for a cluster's controller and store hosts with many extents").

A cluster of role processes on loopback (3 store hosts, 2 controllers, an input host,
an output host, a frontend; PostgreSQL metadata in a schema of its own) with QUEUES
queues of 2 groups each: QUEUES * 2 open extents (2 plain per queue; a timer extent
opens at a queue's first delayed message, and a group's dead-letter queue holds none
until its first dead letter), 3 replicas each. One message is
published to every queue, then, one after another:

1. both controllers SIGKILLed and restarted;
2. storehost-0 SIGTERMed and restarted (an operator's rolling restart);
3. storehost-1 and the output host SIGKILLed and restarted (a machine running both
   power-cycles): the output host reads every group again from its ack levels, some of
   it from the restarted store host;
4. every store host SIGKILLed, down until the cluster counts them dead and the leader
   has tried to seal their extents (a power loss), then restarted together.

After each restart the cluster must serve again (within LIVE_WITHIN in the suite; the goal,
BACK_WITHIN, is measured alone and in benchmarks/cluster_restart.py): every queue
takes a publish, every group is delivered what was published before the restart and
that publish (received and acked; an ack refused for a while is sent again), and after
the controllers' a queue made after the restart takes a publish, which needs a leader to
open its extents. Each group's deliveries are counted: lost, late and unexpected must be
0; duplicates and redeliveries (of an ack not confirmed) are printed. A cluster runs no
node-style recovery (its input hosts live on; the leader seals what lost a host), so
there is no "recovered N open extents" line: the controllers' logs are checked instead
(a new leader that sealed nothing after the controllers' restart; after a store host's,
a successor opened for every extent the leader sealed, and its line "replaced the
extents of lost hosts: N sealed, M opened in T s").

Round 3 failed before the store host's change below: a restarted store host knows no
commit point of its open extents (they live in memory until the next append), showed
none of their records, and kept a reader waiting out its whole 10-minute tail wait while
the other replicas held them: 104 and 172 of the 400 deliveries (two runs) were not
made within 60 s; they came once the power loss's seals made them readable.

QUEUES is 100, not the issue's 1,000 (CHERAMI_RESTART_QUEUES sets it, to measure). The
leader used to open extents one queue after another: at 300 queues (2,103 extents) the
power loss took 45.6 s to serve again (10 s of seals, then 23 s of opens at about 90 a
second, and the lead changed hands when a tick outlasted its lease). It now seals 32 and
tends 8 queues at a time and renews its lease within a long tick (figures before and
after: benchmarks/README.md, "A cluster's power loss"). At 100 queues on a quiet machine
the rounds took 2.3, 3.3, 6.6 and 15.8 s; on one at load 10-12, 20-60 s."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from cherami import timing
from cherami.client.asyncclient import AsyncClient
from cherami.client.models import Received
from cherami.devcluster.local import LocalCluster
from cherami.errors import Unavailable
from cherami.roles.storehost.client import StoreClient, check_appended
from cherami.roles.storehost.process import StoreProcess
from cherami.wire.handshake import derive_key
from cherami.wire.keys import plain_key
from cherami.wire.store import PLAIN, pack_records
from tests.support.pgcluster import PG, cluster_on_postgres

# CHERAMI_RESTART_QUEUES: more queues, to measure (benchmarks/README.md)
QUEUES, GROUPS = int(os.environ.get("CHERAMI_RESTART_QUEUES", "100")), ("a", "b")
COUNTS = {"storehost": 3, "controller": 2, "inputhost": 1, "outputhost": 1, "frontend": 1}
BACK_WITHIN = 30.0  # seconds from a restart until the cluster serves every queue again
# asserted in the suite: a liveness bound, not the goal. The suite keeps 2 cores at load
# 7-9 (three workers of clusters), where the same rounds took 9.8-31.5 s against 2.8-12.9 s
# alone (2026-11-29); the 30 s goal is measured on a quiet machine (run this module
# alone, or benchmarks/cluster_restart.py), as speed is, not asserted under the suite's load
LIVE_WITHIN = BACK_WITHIN + 30
CONCURRENCY = 24  # requests under way at once
DEAD_AFTER = timing.DEFAULT.dead_after  # a host silent this long is dead
SEALED = re.compile(r"extent (\S+) of queue \S+ sealed at")
OPENED = re.compile(r"extent (\S+) opened for queue")
REPLACED = re.compile(r"replaced the extents of lost hosts: .*")

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(400)]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, str]]:
    with cluster_on_postgres(tmp_path / "cluster", COUNTS) as up:
        yield up


def _live_stores(schema: str) -> int:
    """How many store hosts the cluster counts alive (heartbeats within dead_after)."""
    with psycopg.connect(PG, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT count(*) FROM {schema}.hosts WHERE role = 'storehost' AND heartbeat_at >= %s",
            (time.time() - DEAD_AFTER,),
        ).fetchone()
    return int(row[0]) if row else 0


async def _seen_dead(local: LocalCluster, schema: str, sizes: dict[str, int]) -> float:
    """Wait until the cluster counts every store host dead and the leader has tried to
    seal their extents (its log says no replica is reachable); how long that took."""
    started = time.monotonic()
    while await asyncio.to_thread(_live_stores, schema) or not any(
        "no replica of extent" in line for line in _log_since(local, "controller", sizes)
    ):
        assert time.monotonic() - started < 30, "the leader never saw the store hosts gone"
        await asyncio.sleep(0.2)
    return time.monotonic() - started


async def _each(one: Callable[[int], Awaitable[None]]) -> None:
    """``one(i)`` for every queue, CONCURRENCY at a time."""
    limit = asyncio.Semaphore(CONCURRENCY)

    async def run(i: int) -> None:
        async with limit:
            await one(i)

    await asyncio.gather(*(run(i) for i in range(QUEUES)))


async def _publish(client: AsyncClient, queue: str, body: str, deadline: float) -> None:
    """Publish until it is acked (a queue whose extents are being replaced refuses for a
    while), up to the monotonic ``deadline``."""
    while True:
        try:
            await client.publish(queue, [body], retry_seconds=0)
            return
        except Unavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _create(client: AsyncClient) -> None:
    async def one(i: int) -> None:
        await client.create_queue(f"q{i}")
        for group in GROUPS:
            await client.create_group(f"q{i}", group)

    await _each(one)


async def _publish_all(client: AsyncClient, tag: str, deadline: float) -> None:
    async def one(i: int) -> None:
        await _publish(client, f"q{i}", f"{tag}-{i}", deadline)

    await _each(one)


async def _ack(
    client: AsyncClient,
    queue: str,
    group: str,
    batch: list[Received],
    deadline: float,
    refusals: Counter[str],
) -> list[str]:
    """Ack the batch, again while the request fails (up to the deadline; each failure
    is counted by its error); the bodies whose ack was not confirmed (refused as stale,
    or never answered): those may be delivered again once their visibility timeout ends."""
    receipts = [m.receipt or "" for m in batch]
    while True:
        try:
            stale = set((await client.ack(queue, group, receipts))["stale"])
            return [m.text for m in batch if m.receipt in stale]
        except Unavailable as err:
            refusals[f"ack: {_kind(err)}"] += 1
            if time.monotonic() > deadline:
                return [m.text for m in batch]
            await asyncio.sleep(0.2)


def _kind(err: Unavailable) -> str:
    """The error's message without the names and numbers in it."""
    return re.sub(r"\S*\d\S*", "N", str(err))


@dataclass
class Tally:
    """Every group's deliveries over the test: what each restart's check counted, and
    the messages whose ack was not confirmed (their redelivery is no fault)."""

    unconfirmed: set[tuple[str, str]] = field(default_factory=set)  # (queue/group, body)
    missed: set[tuple[str, str]] = field(default_factory=set)  # counted lost by a check
    notes: list[str] = field(default_factory=list)
    refusals: Counter[str] = field(default_factory=Counter)  # failed requests, by error

    async def served(
        self, client: AsyncClient, tags: tuple[str, str], deadline: float
    ) -> Counter[str]:
        """Publish ``tags[1]`` to every queue and receive (and ack) in every group until
        it and ``tags[0]`` (published before the restart) are delivered, or the
        deadline; the accounting over every group: delivered, lost, duplicates,
        redelivered (of an unconfirmed ack), late (counted lost by an earlier check)
        and unexpected."""
        report: Counter[str] = Counter()

        async def one(i: int) -> None:
            queue = f"q{i}"
            want = {f"{tag}-{i}" for tag in tags}
            await _publish(client, queue, f"{tags[1]}-{i}", deadline)
            for group in GROUPS:
                key, got = f"{queue}/{group}", Counter[str]()
                while want - set(got) and time.monotonic() < deadline:
                    try:
                        batch = await client.receive(queue, group, max_messages=10, wait_seconds=1)
                    except Unavailable as err:  # counted: a restart may refuse a while
                        self.refusals[f"receive: {_kind(err)}"] += 1
                        await asyncio.sleep(0.2)
                        continue
                    got.update(m.text for m in batch)
                    if not batch:
                        continue
                    for body in await _ack(client, queue, group, batch, deadline, self.refusals):
                        self.unconfirmed.add((key, body))
                        self.notes.append(f"{key}: the ack of {body} was not confirmed")
                report["delivered"] += len(want & set(got))
                report["lost"] += len(want - set(got))
                for body in sorted(want - set(got)):
                    self.missed.add((key, body))
                    self.notes.append(f"{key}: {body} lost")
                report["duplicates"] += sum(n - 1 for n in got.values())
                for body in set(got) - want:  # the ack not confirmed, or missed before
                    why = "redelivered" if (key, body) in self.unconfirmed else "unexpected"
                    why = "late" if (key, body) in self.missed else why
                    report[why] += 1
                    self.notes.append(f"{key}: {body} {why}")

        await _each(one)
        return report


def _log_sizes(local: LocalCluster, role: str) -> dict[str, int]:
    return {name: local.procs[name].log.stat().st_size for name in local.names(role)}


def _log_since(local: LocalCluster, role: str, sizes: dict[str, int]) -> list[str]:
    """The role's log lines written since its logs had ``sizes`` (every run's)."""
    lines = []
    for name, size in sizes.items():
        with open(local.procs[name].log, "rb") as log:
            log.seek(size)
            lines += log.read().decode(errors="replace").splitlines()
    return lines


async def _leader_log(local: LocalCluster, sizes: dict[str, int]) -> tuple[list[str], int, int]:
    """The controllers' log lines since ``sizes``, and how many extents they say were
    sealed and opened, once every one sealed has its successor and the leader said so
    (a seal may finish behind the leader's tick, its successor at the next; up to 20 s)."""
    deadline = time.monotonic() + 20
    while True:
        lines = _log_since(local, "controller", sizes)
        # distinct extents: a leader that lost the lead mid-seal and the next both log one
        sealed = len({m.group(1) for line in lines if (m := SEALED.search(line))})
        opened = len({m.group(1) for line in lines if (m := OPENED.search(line))})
        replaced = not sealed or any(REPLACED.search(line) for line in lines)
        if (opened >= sealed and replaced) or time.monotonic() > deadline:
            return lines, sealed, opened
        await asyncio.sleep(0.2)


async def _stop(local: LocalCluster, names: list[str], sig: signal.Signals) -> None:
    for name in names:
        local.signal(name, sig)
    for name in names:
        popen = local.procs[name].popen
        assert popen is not None
        await asyncio.to_thread(popen.wait, 20)


async def test_a_cluster_with_many_queues_restarts_its_controllers_and_store_hosts(
    cluster: tuple[LocalCluster, str],
) -> None:
    local, schema = cluster
    stores = local.names("storehost")
    faults = [  # what, the processes, the signal, whether they stay down until seen dead
        ("controllers SIGKILL", local.names("controller"), signal.SIGKILL, False),
        ("storehost-0 SIGTERM", stores[:1], signal.SIGTERM, False),
        ("storehost-1 and the output host SIGKILL", [stores[1], "outputhost-0"],
         signal.SIGKILL, False),
        ("every store host SIGKILL", stores, signal.SIGKILL, True),
    ]  # fmt: skip
    # The power loss (round 4) was out of CI until 2026-11-28: its deliveries were not
    # made within 60 s under load (the output host counted long ticks as an outage and
    # took no successor, its held units stopped acting while a tick took hundreds, one
    # lease call each; the leader lost its lease in long ticks), and with the store hosts
    # restarted together, back before the leader could seal anything, it kept their
    # extents open: a store host back from a power loss knows no commit point, so an idle
    # extent's messages stayed unseen (376 of 400 in one run). Each has a unit test;
    # the round then passed 5 runs in a row at load 2-12 (power loss 9.3-25.3 s). At
    # load 25-33 every round misses BACK_WITHIN, and in 2 of 4 runs the store-host
    # rounds left deliveries for after the 60 s (late, none lost): benchmarks/README.md.
    back: dict[str, float] = {}
    reports: dict[str, Counter[str]] = {}
    tally = Tally()
    async with AsyncClient(local.url, timeout=30) as client:
        started = time.monotonic()
        await _create(client)
        created = time.monotonic() - started
        await _publish_all(client, "b0", started + 120)  # once the leader opened extents
        print(f"\n{QUEUES} queues of {len(GROUPS)} groups made in {created:.1f} s, "
              f"publishable in {time.monotonic() - started:.1f} s")  # fmt: skip
        for r, (what, names, sig, until_dead) in enumerate(faults):
            sizes = _log_sizes(local, "controller")
            await _stop(local, names, sig)
            if until_dead:  # a power loss: down until the cluster notices
                dead = await _seen_dead(local, schema, sizes)
                print(f"the store hosts are counted dead {dead:.1f} s after the kill")
            restarted = time.monotonic()
            await asyncio.to_thread(local.restart, *names)  # together, as after a power cut
            deadline = restarted + LIVE_WITHIN  # what comes after is counted late
            served = tally.served(client, (f"b{r}", f"a{r}"), deadline)
            if r == 0:  # and a queue made now, whose extents need a leader
                await client.create_queue("made-after")
                made_after = _publish(client, "made-after", "x", deadline)
                reports[what], _ = await asyncio.gather(served, made_after)
            else:
                reports[what] = await served
            back[what] = time.monotonic() - restarted
            lines, sealed, opened = await _leader_log(local, sizes)
            summary = [m.group(0) for line in lines if (m := REPLACED.search(line))]
            print(f"{what}: served again in {back[what]:.1f} s; {dict(reports[what])}; "
                  f"the leader sealed {sealed} extents and opened {opened} ({summary}); "
                  f"requests refused: {dict(tally.refusals)}")  # fmt: skip
            tally.refusals.clear()
            if r == 0:  # a new leader, which found nothing to seal
                assert any(line.endswith(" leads") for line in lines), "no controller leads"
                assert sealed == 0, f"the leader sealed {sealed} extents"
            else:  # what the leader sealed has its successor
                assert sealed <= opened and (sealed or not until_dead), (what, sealed, opened)
                assert summary or not sealed, "the leader logged no summary of what it replaced"
            await _publish_all(client, f"b{r + 1}", time.monotonic() + 60)
    print("\n".join(tally.notes[:20]))
    for what, report in reports.items():
        assert not report["lost"] + report["late"] + report["unexpected"], (what, report)
        assert report["delivered"] == QUEUES * len(GROUPS) * 2, (what, report)
    assert all(t <= LIVE_WITHIN for t in back.values()), back
    print({what: ("within" if t <= BACK_WITHIN else "past") + f" {BACK_WITHIN:.0f} s"
           for what, t in back.items()})  # fmt: skip


async def test_a_restarted_store_host_sends_a_reader_on_from_what_it_cannot_show(
    tmp_path: Path,
) -> None:
    """A store host shows an open extent's records up to the commit point its input host
    told it, which it keeps in memory: restarted, it shows none of them until the next
    append, which an idle extent never gets. A read there waited out the whole tail wait
    (10 minutes) while the other replicas held the records (the cluster test above: a
    store host and the output host restarted, 104-172 of 400 deliveries over 60 s late).
    Now it answers within about a second, empty, and the reader tries another replica;
    a read after everything it holds still waits (an idle extent costs nothing)."""
    addresses: asyncio.Queue[str] = asyncio.Queue()

    async def on_address(store_id: str, address: str) -> None:
        addresses.put_nowait(address)

    secret = b"a store host's test secret, 32 b"
    proc = StoreProcess("s0", str(tmp_path / "s0"), "127.0.0.1", on_address, secret)
    await proc.start()
    client = StoreClient("s0", await addresses.get(), key=derive_key(secret))
    try:
        await client.create_extent("e1", PLAIN)
        await client.connect()
        check_appended(await client.append_nowait("e1", 1, pack_records([b"m1"]), None))
        client.commit_nowait("e1", 1)
        assert len((await client.read("e1", b"", 10, wait_ms=5_000)).keys) == 1
        await client.close()
        proc.kill()  # its supervisor starts it again on the same directory
        async with asyncio.timeout(30):
            client = StoreClient("s0", await addresses.get(), key=derive_key(secret))
        started = time.monotonic()
        got = await client.read("e1", b"", 10, wait_ms=30_000)
        answered = time.monotonic() - started
        assert got.keys == [] and not got.end and answered < 5, answered
        started = time.monotonic()
        got = await client.read("e1", plain_key(1), 10, wait_ms=1_500)
        assert got.keys == [] and time.monotonic() - started >= 1.4
        await client.connect()
        client.commit_nowait("e1", 1)  # the next append's commit shows it again
        assert len((await client.read("e1", b"", 10, wait_ms=5_000)).keys) == 1
    finally:
        await client.close()
        await proc.stop()
