"""Throughput of one node: 1 producer publishes N messages through the streaming client,
then 2 competing consumers in one group consume and ack them. Run for replicas 1 and 3.

    python benchmarks/throughput.py [--messages 200000] [--size 256] [--replicas 1,3]
                                    [--cluster] [--tls] [--floor] [--cpu]

``--floor`` measures the storage floor (storage_floor.py: as many synced RocksDB writers
as replicas, at once) right after each node setup and prints publishing's share of it.
``--tls`` runs every setup twice, plain and with TLS on every listener (a cluster's
internal links too; a test CA made with openssl), and prints the cost in percent.

Prints publish msgs/s, publish-ack latency p50/p99 (per batch), consume+ack msgs/s and
the peak RSS of the node (parent plus store-host children)."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tests.support.tlscerts import Certs, make_certs  # noqa: E402

import storage_floor  # noqa: E402
from cherami.client.asyncclient import AsyncClient  # noqa: E402
from cherami.client.stream import StreamConsumer  # noqa: E402
from cherami.devcluster.local import LocalCluster  # noqa: E402
from cherami.devcluster.nodeproc import NodeProcess as ServerProcess  # noqa: E402
from cherami.wire.tls import TLS_CA_ENV  # noqa: E402


class RssSampler:
    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        root = psutil.Process(self.pid)
        while not self._stop.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
                self.peak = max(self.peak, sum(p.memory_info().rss for p in procs))
            except psutil.Error:
                pass
            time.sleep(0.1)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 1000) - 1] if len(values) > 1 else values[0]


async def publish_phase(
    url: str, queue: str, total: int, size: int, batch: int
) -> tuple[float, list[float]]:
    body = b"x" * size
    latencies: list[float] = []
    async with AsyncClient(url) as client, client.publisher(queue, max_in_flight=16) as pub:
        start = time.perf_counter()
        futures = []
        for sent in range(0, total, batch):
            t0 = time.perf_counter()
            fut = await pub.send([body] * min(batch, total - sent))
            fut.add_done_callback(lambda _f, t0=t0: latencies.append(time.perf_counter() - t0))
            futures.append(fut)
        await asyncio.gather(*futures)
        return total / (time.perf_counter() - start), latencies


async def consume_phase(url: str, queue: str, group: str, total: int, consumers: int) -> float:
    """msgs/s from the start to the last message's ack written to its stream (as
    http_path.py counts to the last ack: the other consumers' polls still waiting then,
    up to 50 ms, and closing the streams are not counted)."""
    done = 0
    finished = asyncio.Event()
    ended = 0.0
    streams: list[StreamConsumer] = []

    async def consume() -> None:
        nonlocal done, ended
        async with AsyncClient(url) as client, client.consumer(queue, group, credit=4000) as c:
            streams.append(c)
            while not finished.is_set():
                batch = await c.get_batch(1000, timeout=0.05)  # a short tail after the last
                if batch:
                    c.ack(*batch)
                    done += len(batch)
                    if done >= total and not finished.is_set():
                        finished.set()
                        # every consumer's acks are on the wire
                        await asyncio.gather(*(s.flush() for s in streams))
                        ended = time.perf_counter()
            await c.flush()

    start = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(consume() for _ in range(consumers))), 600)
    return done / ((ended or time.perf_counter()) - start)


class CpuTimes:
    """CPU seconds of a node (its own process, its store-host children) and of this
    benchmark process (the clients), read around a phase."""

    def __init__(self, pid: int) -> None:
        self.node = psutil.Process(pid)
        self.me = psutil.Process()

    def read(self) -> tuple[float, float, float]:
        def cpu(p: psutil.Process) -> float:
            t = p.cpu_times()
            return float(t.user + t.system)

        children = self.node.children(recursive=True)
        return cpu(self.node), sum(map(cpu, children)), cpu(self.me)


def _per_message(before: tuple[float, ...], after: tuple[float, ...], n: int) -> str:
    node, stores, client = ((a - b) / n * 1e6 for a, b in zip(after, before, strict=True))
    return f"node {node:.2f}, store hosts {stores:.2f}, client {client:.2f} us/msg"


async def run_once(
    url: str, replicas: int, total: int, size: int, batch: int, cpu: CpuTimes | None = None
) -> dict[str, Any]:
    queue = f"bench-r{replicas}-{int(time.time())}"
    async with AsyncClient(url) as client:
        await client.create_queue(queue, replicas=replicas)
        await client.create_group(queue, "workers")
    t0 = cpu.read() if cpu else ()
    pub_rate, lat = await publish_phase(url, queue, total, size, batch)
    t1 = cpu.read() if cpu else ()
    con_rate = await consume_phase(url, queue, "workers", total, consumers=2)
    t2 = cpu.read() if cpu else ()
    return {
        "publish_msgs_s": pub_rate,
        "publish_p50_ms": quantile(lat, 0.5) * 1000,
        "publish_p99_ms": quantile(lat, 0.99) * 1000,
        "consume_ack_msgs_s": con_rate,
        "cpu": f"publish {_per_message(t0, t1, total)}; consume+ack {_per_message(t1, t2, total)}"
        if cpu
        else "",
    }


class RssOfPids:
    """Peak summed RSS of a fixed set of processes (a cluster's role processes)."""

    def __init__(self, pids: list[int]) -> None:
        self.samplers = [RssSampler(p) for p in pids]

    def stop(self) -> int:
        return sum(s.stop() for s in self.samplers)


def _tls_args(certs: Certs | None, cluster: bool) -> list[str]:
    if certs is None:
        return []
    args = ["--tls-cert", str(certs.cert), "--tls-key", str(certs.key)]
    return [*args, "--tls-ca", str(certs.ca)] if cluster else args


def _node(tmp: str, replicas: int, certs: Certs | None = None) -> tuple[str, Any, Any]:
    server = ServerProcess(
        Path(tmp), stores=max(3, replicas), extra=_tls_args(certs, False),
        ca=certs.ca if certs else None,
    ).start()  # fmt: skip
    assert server.proc is not None
    return server.url, RssSampler(server.proc.pid), server.stop


def _cluster(tmp: str, metadata: str | None, certs: Certs | None = None) -> tuple[str, Any, Any]:
    local = LocalCluster(
        Path(tmp), metadata or f"sqlite:///{tmp}/metadata.db", extra_args=_tls_args(certs, True)
    )
    local.up()
    return local.url, RssOfPids([p.pid for p in local.procs.values()]), local.down


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--replicas", default="1,3")
    parser.add_argument(
        "--cluster", action="store_true",
        help="also run on a local cluster: every role its own process (3 store hosts, "
        "2 input, 2 output hosts, 2 controllers, a frontend)",
    )  # fmt: skip
    parser.add_argument("--metadata", help="metadata URL for --cluster (default SQLite)")
    parser.add_argument("--tls", action="store_true", help="each setup plain, then with TLS")
    parser.add_argument(
        "--cpu", action="store_true",
        help="print the CPU per message of the node, its store hosts and the clients in "
        "each phase (node setups)",
    )  # fmt: skip
    parser.add_argument(
        "--floor", action="store_true",
        help="after each node setup, the storage floor for as many synced writers as it "
        "has replicas (storage_floor.py, same message count), and the ratio",
    )  # fmt: skip
    args = parser.parse_args()
    print(
        f"{args.messages} messages of {args.size} B, batches of {args.batch}, "
        "every batch synced on every replica"
    )
    header = ["setup", "replicas", "publish msg/s", "pub p50 ms", "pub p99 ms", "consume+ack/s"]
    certs_dir = tempfile.TemporaryDirectory()
    certs = make_certs(Path(certs_dir.name)) if args.tls else None
    if certs is not None:
        os.environ[TLS_CA_ENV] = str(certs.ca)  # the clients verify the test CA
    print(" ".join(f"{h:>14}" for h in [*header, "peak RSS MiB"]))
    setups = [("node", r) for r in (int(x) for x in args.replicas.split(","))]
    if args.cluster:
        setups.append(("cluster", 3))
    if certs is not None:
        setups = [(s + tls, r) for s, r in setups for tls in ("", "+tls")]
    plain: dict[tuple[str, int], dict[str, float]] = {}
    for setup, replicas in setups:
        with_tls = certs if setup.endswith("+tls") else None
        with tempfile.TemporaryDirectory() as tmp:
            url, sampler, stop = (
                _node(tmp, replicas, with_tls)
                if setup.startswith("node")
                else _cluster(tmp, args.metadata, with_tls)
            )
            cpu = CpuTimes(sampler.pid) if args.cpu and setup.startswith("node") else None
            try:
                r = uvloop.run(run_once(url, replicas, args.messages, args.size, args.batch, cpu))
            finally:
                peak = sampler.stop()
                stop()
        cells = [
            setup,
            f"{replicas}",
            f"{r['publish_msgs_s']:,.0f}",
            f"{r['publish_p50_ms']:.1f}",
            f"{r['publish_p99_ms']:.1f}",
            f"{r['consume_ack_msgs_s']:,.0f}",
            f"{peak / 2**20:.0f}",
        ]
        print(" ".join(f"{c:>14}" for c in cells), flush=True)
        if r["cpu"]:
            print(f"{'':>14} CPU {r['cpu']}", flush=True)
        if args.floor and setup == "node":
            _print_floor(replicas, args.messages, r["publish_msgs_s"])
        base = setup.removesuffix("+tls")
        if with_tls is None:
            plain[(base, replicas)] = r
        elif (base, replicas) in plain:
            p = plain[(base, replicas)]
            print(
                f"{'':>14} TLS cost: publish {_cost(p['publish_msgs_s'], r['publish_msgs_s'])}, "
                f"consume+ack {_cost(p['consume_ack_msgs_s'], r['consume_ack_msgs_s'])}"
            )
    certs_dir.cleanup()


def _print_floor(replicas: int, messages: int, published: float) -> None:
    """The floor for ``replicas`` synced writers measured now, beside the publish rate
    just measured: the fraction of the disk's ceiling that publishing reached."""
    with tempfile.TemporaryDirectory(prefix="cherami-floor-") as tmp:
        rates = storage_floor.run(replicas, max(messages, 400_000), 400, 290, Path(tmp))
    floor = rates[0][0]  # the slowest writer: an R-replica publish waits for all R
    print(f"{'':>14} floor for {replicas} synced writer(s): {floor:,.0f} msgs/s; "
          f"publish reached {published / floor * 100:.0f}% of it", flush=True)  # fmt: skip


def _cost(plain: float, tls: float) -> str:
    return f"{(plain - tls) / plain * 100:+.1f}%"


if __name__ == "__main__":
    main()
