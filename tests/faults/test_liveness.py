"""Liveness and exclusivity of one competing group under faults (issue 12, "Proof"), on a
multi-process cluster with PostgreSQL metadata (2 output hosts, 2 input hosts, 2
controllers, 3 store hosts), checked from outside by tests/support/liveness.py:

1. the output host holding the group is paused (SIGSTOP) 8 s while stream and HTTP
   consumers run: the consumers already connected get every acked message (stream
   consumers reconnect by themselves), none is held by two consumers at once;
2. a 20 s metadata outage (a private PostgreSQL stopped and started): HTTP and stream
   producers go on publishing through it, consumers go on receiving and acking through
   it (the output hosts act on their peers' word that none reaches the store), the acks
   are persisted when it ends, and no message is held by two consumers at once;
3. an input host paused 10 s under load: no producer waits more than 10 s for an ack;
4. a queue deleted under an open publish stream and an open consume stream: both are
   closed with the documented close code; nothing of the old streams lands in a queue
   made again under the same name;
5. a poison message (max_delivery_count 3, every delivery nacked) across four SIGKILLs
   of the output host holding its group: at most 4 deliveries, then the group's DLQ.

Each test prints its accounting; lost and concurrent duplicates must be 0."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.client.models import OutgoingMessage
from cherami.devcluster.local import LocalCluster
from cherami.errors import CheramiError
from cherami.metadata.postgres_leases import held_leases
from cherami.roles.outputhost.ownership import LEASE_TTL, group_leases
from cherami.wire import close
from tests.support.drain import drain
from tests.support.liveness import Delivery, History, Workload, error_kind
from tests.support.pg import PrivatePostgres, private_postgres

__all__ = ["private_postgres"]  # the fixture, imported for pytest

PG = "postgresql://postgres@127.0.0.1:5432/test"
GROUP = "workers"
BURST_DELAY = 10.0  # the outage test's backlog comes due this long after it is published
PAUSE_RESUME_BOUND = 6.0  # seconds: a paused host's group is delivered again by then

pytestmark = pytest.mark.postgres


@dataclass
class Cluster:
    local: LocalCluster
    dsn: str  # libpq URL of the metadata database
    schema: str

    @property
    def url(self) -> str:
        return self.local.url

    def _ids(self, role: str) -> dict[str, str]:
        """host id (kept in the data dir) -> process name"""
        out = {}
        for name in self.local.names(role):
            path = self.local.procs[name].data_dir / f"{role}.id"
            if path.exists():
                out[path.read_text().strip()] = name
        return out

    def _query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'SET search_path TO "{self.schema}"')
            return conn.execute(sql, args).fetchall()  # type: ignore[arg-type]

    def group_holder(self, queue: str, group: str, extent: str | None = None) -> str | None:
        """The output host whose lease on the group's extent (None: the one holding
        most of the group's extents) has not run out (by the database's clock), by
        process name."""
        prefix = group_leases(queue, group) + (extent or "")
        rows = self._query(
            f"SELECT holder, count(*) FROM ({held_leases('left(l.name, %s) = %s')}) AS held "
            "GROUP BY holder ORDER BY count(*) DESC, holder",
            len(prefix), prefix,
        )  # fmt: skip
        return self._ids("outputhost").get(rows[0][0]) if rows else None

    async def wait_holder(
        self, queue: str, group: str, extent: str | None = None, timeout: float = 20.0
    ) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            holder = await asyncio.to_thread(self.group_holder, queue, group, extent)
            if holder is not None:
                return holder
            await asyncio.sleep(0.2)
        raise AssertionError(f"no output host holds {queue}/{group} {extent} after {timeout}s")

    def input_hosts(self, queue: str) -> list[str]:
        """Input hosts with an open extent of the queue, most extents first."""
        rows = self._query(
            "SELECT input_host, count(*) FROM extents WHERE queue = %s AND status = 'open' "
            "GROUP BY input_host ORDER BY count(*) DESC",
            queue,
        )
        ids = self._ids("inputhost")
        return [ids[r[0]] for r in rows if r[0] in ids]

    async def pause(self, name: str, seconds: float) -> tuple[float, float]:
        """SIGSTOP the process for ``seconds``; when it was stopped and continued."""
        stopped = time.time()
        self.local.signal(name, signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            self.local.signal(name, signal.SIGCONT)
        return stopped, time.time()

    def extents(self, queue: str) -> list[tuple[str, str, float]]:
        """(id, status, created_at) of every extent row of a queue name."""
        return [(r[0], r[1], r[2]) for r in self._query(
            "SELECT id, status, created_at FROM extents WHERE queue = %s ORDER BY created_at",
            queue,
        )]  # fmt: skip

    def dead(self) -> list[str]:
        return [
            n for n, p in self.local.procs.items()
            if p.popen is not None and p.popen.poll() is not None
        ]  # fmt: skip


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for the tests of this module: each uses queues of its own, and every
    pause ends with SIGCONT and every kill with a restart."""
    schema = f"l_{uuid.uuid4().hex[:12]}"
    local = LocalCluster(tmp_path_factory.mktemp("liveness") / "cluster", f"{PG}?schema={schema}")
    try:
        local.up()
        yield Cluster(local, PG, schema)
    finally:
        local.down()
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
def cluster(shared_cluster: Cluster) -> Cluster:
    """The shared cluster, whole: a process a failed test left dead is started again."""
    for name in shared_cluster.dead():
        shared_cluster.local.restart(name)
    return shared_cluster


@pytest.fixture
def outage_cluster(tmp_path: Path, private_postgres: PrivatePostgres) -> Iterator[Cluster]:
    """A cluster whose metadata database is private to the test (it gets stopped)."""
    local = LocalCluster(tmp_path / "cluster", f"{private_postgres.url()}&schema=cherami")
    try:
        local.up()
        yield Cluster(local, private_postgres.url(), "cherami")
    finally:
        local.down()


async def _make(url: str, queue: str, **group: Any) -> None:
    async with AsyncClient(url) as client:
        await client.create_queue(queue)
        await client.create_group(queue, GROUP, **group)


async def _start(
    url: str,
    queue: str,
    visibility: float,
    streams: int,
    https: int,
    http_producers: int,
    **group: Any,
) -> Workload:
    """Make the queue and group; start stream-a.. and http-a.. consumers, hp-0.. HTTP
    producers and one streaming publisher sp-0."""
    await _make(url, queue, visibility_timeout_seconds=visibility, **group)
    work = Workload(url, queue, GROUP, visibility)
    for i in range(streams):
        work.start_stream_consumer(f"stream-{'ab'[i]}")
    for i in range(https):
        work.start_http_consumer(f"http-{'ab'[i]}")
    for i in range(http_producers):
        work.start_http_producer(f"hp-{i}")
    work.start_stream_producer("sp-0")
    return work


async def _publish(client: AsyncClient, queue: str, bodies: list[Any]) -> None:
    """Publish with retries (a new queue may take a moment to get an input host)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            await client.publish(queue, bodies)
            return
        except CheramiError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


def _print(title: str, history: History, report: dict[str, Any], **extra: Any) -> None:
    print(f"\n=== {title}")
    for key, value in {**report, **extra}.items():
        print(f"  {key}: {value}")
    for line in history.describe_pairs():
        print("  concurrent:", line)
    for line in history.describe_duplicates():
        print("  duplicate:", line)
    if history.error_samples:
        print("  error samples:", history.error_samples)
    if history.consumer_failures:
        print("  consumer failures:", history.consumer_failures)


def _assert_checked(history: History, report: dict[str, Any]) -> None:
    assert report["lost"] == 0, f"lost {history.lost_bodies()}: {report}"
    assert report["unexpected"] == 0, report
    assert report["concurrent_duplicates"] == 0, history.describe_pairs()


def _logs(cluster: Cluster, names: list[str], tail: int = 1500) -> None:
    for name in names:
        proc = cluster.local.procs[name]
        with contextlib.suppress(OSError):
            print(f"--- {name} log tail:\n{proc.log.read_text(errors='replace')[-tail:]}")


# 1 ------------------------------------------------------------------------------------


@pytest.mark.timeout(150)
async def test_paused_output_host_connected_consumers_get_everything(cluster: Cluster) -> None:
    queue = "paused-out"
    visibility = 10.0
    work = await _start(cluster.url, queue, visibility, streams=2, https=1, http_producers=2)
    streams = {"stream-a", "stream-b"}

    await asyncio.sleep(4)
    holder = await cluster.wait_holder(queue, GROUP)
    paused_at, resumed_at = await cluster.pause(holder, 8)
    await asyncio.sleep(6)
    # the tail: only the stream consumers (never opened again) are left to take it
    await work.stop_consumers(["http-a"])
    tail_from = time.time()
    await asyncio.sleep(3)
    await work.stop_producers()
    tail = {b for b, t in work.history.acked.items() if t >= tail_from}
    complete = await work.until_delivered(30)
    await work.stop_consumers()

    h = work.history
    report = h.report()
    _print(
        "paused output host", h, report, paused=holder, pause_s=round(resumed_at - paused_at, 1),
        tail_acked=len(tail),
        tail_to_streams=sum(1 for d in h.seen() if d.body in tail and d.consumer in streams),
        stream_deliveries_after_resume=work.delivered_to(streams, resumed_at),
        stall_after_pause_s=round(h.longest_stall(since=paused_at), 2),
        stream_close_codes={n: work.taps[n].closes() for n in sorted(streams)},
        all_delivered=complete, lost_sample=h.lost_bodies(), dead=cluster.dead(),
    )  # fmt: skip
    _logs(cluster, [holder])
    assert report["acked"] > 500, "too little was published"
    stall = h.longest_stall(since=paused_at)
    assert stall < PAUSE_RESUME_BOUND, f"nothing delivered for {stall:.1f}s of the pause"
    assert tail, "nothing was published after the HTTP consumer stopped"
    assert not h.consumer_failures, h.consumer_failures
    _assert_checked(h, report)


# 2 ------------------------------------------------------------------------------------


@pytest.mark.timeout(180)
async def test_metadata_outage_deliveries_and_acks_go_on(
    outage_cluster: Cluster, private_postgres: PrivatePostgres
) -> None:
    cluster = outage_cluster
    queue = "outage"
    visibility = 10.0
    outage = 20.0
    work = await _start(cluster.url, queue, visibility, streams=2, https=1, http_producers=1)
    await asyncio.sleep(4)

    # a consumer of a group of its own receives and acks a batch every second through
    # the outage (in the workload's group the other consumers would leave it little)
    h = work.history
    acks: list[tuple[float, float, str]] = []  # (sent, answered, result)
    acked_by_holder = 0
    async with AsyncClient(cluster.url, timeout=30) as holder:
        await holder.create_group(queue, "holders", visibility_timeout_seconds=60)

        async def receive_and_ack() -> str:
            nonlocal acked_by_holder
            got = await holder.receive(queue, "holders", max_messages=20, wait_seconds=1)
            if not got:
                return "nothing received"
            reply = await holder.ack(queue, "holders", [m.receipt or "" for m in got])
            acked_by_holder += reply["acked"]
            return f"ok acked={reply['acked']} stale={len(reply['stale'])}"

        # a consumer at work before the outage (the processes have read its group: one
        # never read by a process before an outage is not known there during it)
        for _ in range(4):
            with contextlib.suppress(CheramiError):
                await receive_and_ack()

        # a backlog that comes due just after the database stops (delayed messages): what
        # is due within 5 s of the output hosts' last read of the change log is delivered
        # in the outage, by one host at a time; the rest once the store is back (a cancel
        # must be seen: docs/design/metadata-outage.md)
        burst = [f"burst-{i}" for i in range(40_000)]
        h.attempted.update(burst)
        due = time.time() + BURST_DELAY
        await _publish(
            holder, queue, [OutgoingMessage(b, delay_seconds=BURST_DELAY) for b in burst]
        )
        h.published("burst", burst, due)  # acked now, deliverable from then on
        await asyncio.sleep(max(0.0, due - 0.5 - time.time()))
        stopped_at = time.time()
        await asyncio.to_thread(private_postgres.stop)
        try:
            while time.time() - stopped_at < outage:
                await asyncio.sleep(1)
                sent = time.time()
                try:
                    result = await receive_and_ack()
                except CheramiError as err:
                    result = f"{error_kind(err)}: {str(err)[:120]}"
                    h.failed("holder", err, sent)
                acks.append((sent, time.time(), result))
        finally:
            await asyncio.to_thread(private_postgres.start)
        started_at = time.time()

    await asyncio.sleep(8)
    await work.stop_consumers(["http-a"])
    tail_from = time.time()
    await asyncio.sleep(4)
    await work.stop_producers()
    tail = {b for b, t in h.acked.items() if t >= tail_from}
    complete = await work.until_delivered(40)
    await work.stop_consumers()

    # the holder's acks of the outage were written when the store came back: its group's
    # ack levels (it received each extent in order and acked all it got) count them all
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(acked), 0) FROM cherami.ack_levels "
            "WHERE queue = %s AND grp = 'holders'", (queue,),
        ).fetchone()  # fmt: skip
    persisted = int(row[0]) if row else 0

    report = h.report()
    # leases run out LEASE_TTL after the stop: what is delivered and acked from then on
    # to the end is the output hosts acting on their peers' word (outage.py)
    riding_from = stopped_at + LEASE_TTL + 2
    settled = [r for s, e, r in acks if s >= riding_from and e <= started_at]
    ridden = [d for d in h.deliveries if riding_from < d.at < started_at]
    published_in_outage = {
        p: sum(1 for b, t in h.acked.items() if b.startswith(p) and stopped_at + 2 < t < started_at)
        for p in ("hp-0-", "sp-0-")
    }
    _print(
        "metadata outage", h, report, outage_s=round(started_at - stopped_at, 1),
        holder_results=[r for _, _, r in acks], acked_by_holder=acked_by_holder,
        holder_acks_persisted=persisted,
        delivered_in_outage=sum(1 for d in h.deliveries if stopped_at < d.at < started_at),
        delivered_past_lease_ttl_in_outage=len(ridden),
        burst_delivered_in_outage=len({d.body for d in ridden if d.body.startswith("burst")}),
        burst_any_in_outage=len({d.body for d in h.deliveries
                                 if stopped_at < d.at < started_at and d.body.startswith("burst")}),
        published_in_outage=published_in_outage, tail_acked=len(tail),
        all_delivered=complete, lost_sample=h.lost_bodies(), dead=cluster.dead(),
    )  # fmt: skip
    assert settled, "the holder settled nothing in the outage"
    assert all(r.startswith("ok acked=") for r in settled), settled
    assert ridden, "nothing was delivered in the outage past the leases' end"
    internal = {k: n for k, n in report["errors"].items() if k.endswith(":internal")}
    assert not internal, f"500 internal answered: {internal}"
    assert persisted >= acked_by_holder > 0, (persisted, acked_by_holder)
    assert all(published_in_outage.values()), f"publishing stopped: {published_in_outage}"
    assert tail, "nothing was published after the outage"
    assert not h.consumer_failures, h.consumer_failures
    _assert_checked(h, report)
    assert not cluster.dead(), cluster.dead()


# 3 ------------------------------------------------------------------------------------


@pytest.mark.timeout(150)
async def test_paused_input_host_stalls_no_producer(cluster: Cluster) -> None:
    queue = "paused-in"
    visibility = 10.0
    bound = 10.0  # a liveness bound (the pause is 10 s), not a speed benchmark
    work = await _start(cluster.url, queue, visibility, streams=1, https=1, http_producers=2)
    await asyncio.sleep(4)

    hosts = await asyncio.to_thread(cluster.input_hosts, queue)
    assert hosts, "no input host has an open extent of the queue"
    paused = hosts[0]
    paused_at, resumed_at = await cluster.pause(paused, 10)
    await asyncio.sleep(5)
    await work.stop_producers()
    complete = await work.until_delivered(30)
    await work.stop_consumers()

    h = work.history
    report = h.report()
    during = {p: 0 for p in h.producers}
    for body, t in h.acked.items():
        if paused_at < t < resumed_at:
            during[body.rsplit("-", 1)[0]] += 1
    _print(
        "paused input host", h, report, paused=paused, input_hosts=hosts,
        acked_during_pause=during, all_delivered=complete, lost_sample=h.lost_bodies(),
        dead=cluster.dead(),
    )  # fmt: skip
    _logs(cluster, [paused])
    assert report["acked"] > 500, "too little was published"
    for name, wait in report["longest_publish_wait_s"].items():
        assert wait <= bound, f"producer {name} waited {wait}s for a publish ack"
    _assert_checked(h, report)


# 4 ------------------------------------------------------------------------------------


@pytest.mark.timeout(150)
async def test_deleted_queue_closes_its_streams(cluster: Cluster) -> None:
    queue = "deleted"
    visibility = 5.0
    work = await _start(cluster.url, queue, visibility, streams=1, https=0, http_producers=0)
    await asyncio.sleep(4)
    work.producing.clear()  # the publish stream stays open, idle
    await asyncio.sleep(0.5)
    drained = await work.until_delivered(20)
    h = work.history
    before = h.report()

    # publishing again, then the queue is deleted under both streams
    work.prefix = "late-"
    work.producing.set()
    await asyncio.sleep(1)
    deleted_at = time.time()
    async with AsyncClient(cluster.url) as admin:
        await admin.delete_queue(queue)
        pub, con = work.taps["sp-0"], work.taps["stream-a"]
        deadline = time.monotonic() + 15
        # (a stream either client retired itself before the delete does not count)
        while time.monotonic() < deadline and not (
            pub.closes_since(deleted_at) and con.closes_since(deleted_at)
        ):
            await asyncio.sleep(0.1)
        closed_in = {
            t.owner: round(c.closed - deleted_at, 2) if (c := t.first) and c.closed else None
            for t in (pub, con)
        }
        # the name is made again at once, while the old clients may still try to write
        await admin.create_queue(queue)
        await admin.create_group(queue, GROUP, visibility_timeout_seconds=visibility)
        fresh = [f"fresh-{i}" for i in range(20)]
        await admin.publish(queue, fresh)
        await asyncio.sleep(4)
        await work.stop_producers()
        await work.stop_consumers()
        in_new = await drain(admin, queue, GROUP, wait_seconds=2)
        made_again = (await admin.get_queue(queue))["created_at"]
    # extents of the old queue that are not deleted (the new queue would read them)
    old_extents = [
        (e, status) for e, status, created in await asyncio.to_thread(cluster.extents, queue)
        if status != "deleted" and created < deleted_at
    ]  # fmt: skip

    old_in_new = sorted(b for b in in_new if not b.startswith("fresh-"))
    late = {b for b in h.acked if b.startswith("late-")}
    report = h.report(exclude=late)
    _print(
        "deleted queue", h, report, drained_before_delete=drained, before_delete=before,
        late_acked=len(late), publish_closes=pub.closes(), consume_closes=con.closes(),
        closed_after_delete_s=closed_in, documented=close.DELETED, in_new_queue=len(in_new),
        old_in_new=len(old_in_new), old_in_new_sample=old_in_new[:5],
        late_in_new=sum(1 for b in old_in_new if b.startswith("late-")),
        fresh_missing=sorted(set(fresh) - set(in_new)), made_again=made_again,
        old_extents_not_deleted=old_extents,
        dead=cluster.dead(),
    )  # fmt: skip
    assert drained and before["lost"] == 0, before
    # the first close each client saw after the delete (a producer spread over several
    # input hosts may have retired a stream itself before, with 1000)
    pub_after, con_after = pub.closes_since(deleted_at), con.closes_since(deleted_at)
    assert pub_after[:1] == [close.DELETED], f"publish stream closes: {pub.closes()}"
    assert con_after[:1] == [close.DELETED], f"consume stream closes: {con.closes()}"
    assert 4000 <= close.DELETED <= 4099
    assert old_in_new == [], f"{len(old_in_new)} old messages in the new queue"
    assert set(fresh) <= set(in_new)
    _assert_checked(h, report)


# 5 ------------------------------------------------------------------------------------


@pytest.mark.timeout(200)
async def test_poison_message_bounded_across_output_host_kills(cluster: Cluster) -> None:
    queue = "poison"
    visibility = 4.0
    await _make(cluster.url, queue, visibility_timeout_seconds=visibility, max_delivery_count=3)
    work = Workload(cluster.url, queue, GROUP, visibility)
    h = work.history
    poison = "poison"
    normal = [f"ok-{i}" for i in range(50)]
    kills: list[str] = []
    async with AsyncClient(cluster.url, timeout=30) as client:
        h.attempted.update([poison, *normal])
        await _publish(client, queue, [poison])
        await _publish(client, queue, normal)
        now = time.time()
        for b in [poison, *normal]:
            h.acked[b] = now

        async def take_poison(timeout: float) -> tuple[Any, Delivery] | None:
            """Receive (acking everything else) until the poison comes or time is up."""
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                started = time.time()
                try:
                    got = await client.receive(queue, GROUP, max_messages=20, wait_seconds=1)
                except CheramiError as err:
                    h.failed("receive", err, started)
                    await asyncio.sleep(0.2)
                    continue
                now = time.time()
                ds = [Delivery(m.text, m.id, "http", "http", now, m.delivery_count, seen=True)
                      for m in got]  # fmt: skip
                h.deliveries.extend(ds)
                rest = [(m, d) for m, d in zip(got, ds, strict=True) if m.text != poison]
                if rest:
                    await work.http_settle(client, "ack", [m for m, _ in rest],
                                           [d for _, d in rest])  # fmt: skip
                for m, d in zip(got, ds, strict=True):
                    if m.text == poison:
                        poison_extent[:] = [m.id.rsplit(":", 1)[0]]
                        return m, d
            return None

        poison_extent: list[str] = []  # the extent of the poison message, once seen

        async def kill_holder(round_: int) -> None:
            """Odd rounds keep the host down past its lease: the other one takes over;
            even rounds restart it at once (it takes its own lease back)."""
            extent = poison_extent[0] if poison_extent else None
            holder = await cluster.wait_holder(queue, GROUP, extent)
            kills.append(holder)
            await asyncio.to_thread(cluster.local.kill, holder)
            await asyncio.sleep(LEASE_TTL + 2 if round_ % 2 else 1)
            await asyncio.to_thread(cluster.local.restart, holder)

        for round_ in range(4):
            taken = await take_poison(3 * visibility + 8)
            if taken is not None:
                m, d = taken
                if round_ % 2 == 0:  # nacked, then the host dies: the count must survive
                    await work.http_settle(client, "nack", [m], [d])
                    await kill_holder(round_)
                else:  # the host dies with the delivery in flight, then the nack
                    await kill_holder(round_)
                    await work.http_settle(client, "nack", [m], [d])
            else:
                await kill_holder(round_)
        while (taken := await take_poison(3 * visibility + 4)) is not None:
            await work.http_settle(client, "nack", [taken[0]], [taken[1]])

        in_dlq: list[str] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(CheramiError):
                dlq = await client.dlq(queue, GROUP)
                in_dlq = [m.get("body", "") for m in dlq["messages"]]
                if poison in in_dlq:
                    break
            await asyncio.sleep(0.5)

    report = h.report()
    poison_ds = [d for d in h.deliveries if d.body == poison]
    _print(
        "poison message", h, report, kills=kills,
        poison_deliveries=[(d.count, d.settle, d.result()) for d in poison_ds],
        dlq=in_dlq, dead=cluster.dead(),
    )  # fmt: skip
    _logs(cluster, cluster.local.names("outputhost"))
    assert len(kills) == 4
    # a delivery counts when it is handed out, written at the host's next flush (50 ms):
    # a kill of the host with the poison in flight (rounds 1 and 3, and a restart that
    # makes the nack of a delivery stale) may cost that delivery's count, one delivery
    # more for each kill at most (docs/api.md, "The bound"); between kills the count holds
    assert len(poison_ds) <= 3 + len(kills), f"{len(poison_ds)} deliveries for max 3"
    assert poison in in_dlq, f"the poison message is not in the DLQ: {in_dlq}"
    _assert_checked(h, report)
