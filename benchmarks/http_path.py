"""The connectionless path of one node: HTTP publish, then HTTP receive+ack, by N clients
(``--stream``: the streaming path, publisher and consumer, with the same counts) in
batches (issue 17's workload: 4 clients, batches of 500, 256 B, 3 replicas, fsync before
the publish ack).

    python benchmarks/http_path.py [--messages 100000] [--clients 4] [--batch 500]
                                   [--size 256] [--replicas 3] [--runs 1] [--profile DIR]

Each client publishes its share of the messages with ``POST …/messages`` (one batch
in flight per client), then receives and acks with ``POST …/receive`` and ``…/ack``
until the group has acked every message. Prints msgs/s of each phase and the node's
CPU seconds in it. ``--profile DIR`` records the node with py-spy (speedscope JSON) for
each phase."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cherami.client.asyncclient import AsyncClient  # noqa: E402
from cherami.devcluster.nodeproc import NodeProcess  # noqa: E402
from throughput import consume_phase  # noqa: E402


def _cpu(pid: int) -> float:
    """CPU seconds of the node process and its store hosts (child processes)."""
    proc = psutil.Process(pid)
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


LATENCY: dict[str, list[float]] = {"receive": [], "ack": []}


class Profiler:
    def __init__(self, out: Path | None, pid: int) -> None:
        self.out, self.pid = out, pid
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, name: str) -> None:
        if self.out is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(self.pid),
             "--subprocesses", "--format", "speedscope", "--rate", "200",
             "--output", str(self.out / f"{name}.json")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(30)
            self.proc = None


async def publish(url: str, queue: str, total: int, clients: int, batch: int, size: int) -> float:
    body = b"x" * size
    share = total // clients

    async def one() -> None:
        async with AsyncClient(url, timeout=60) as client:
            for sent in range(0, share, batch):
                await client.publish(queue, [body] * min(batch, share - sent))

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(clients)))
    return share * clients / (time.perf_counter() - start)


async def receive_ack(url: str, queue: str, total: int, clients: int, batch: int) -> float:
    """msgs/s from the start to the ack of the last message (the other clients' long
    polls still waiting then, up to 1 s, are not counted)."""
    acked = 0
    done = asyncio.Event()
    ended = 0.0

    async def one() -> None:
        nonlocal acked, ended
        async with AsyncClient(url, timeout=60) as client:
            while not done.is_set():
                t0 = time.perf_counter()
                got = await client.receive(queue, "workers", max_messages=batch, wait_seconds=1)
                if not got:
                    continue
                t1 = time.perf_counter()
                reply = await client.ack(queue, "workers", [m.receipt or "" for m in got])
                LATENCY["receive"].append(t1 - t0)
                LATENCY["ack"].append(time.perf_counter() - t1)
                acked += reply["acked"]
                if acked >= total and not done.is_set():
                    ended = time.perf_counter()
                    done.set()

    start = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(one() for _ in range(clients))), 600)
    return acked / (ended - start)


async def stream_publish(
    url: str, queue: str, total: int, clients: int, batch: int, size: int
) -> float:
    body = b"x" * size
    share = total // clients

    async def one() -> None:
        async with AsyncClient(url) as client, client.publisher(queue, max_in_flight=16) as pub:
            futures = [await pub.send([body] * min(batch, share - sent))
                       for sent in range(0, share, batch)]  # fmt: skip
            await asyncio.gather(*futures)

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(clients)))
    return share * clients / (time.perf_counter() - start)


async def run(url: str, pid: int, args: argparse.Namespace, run_no: int) -> dict[str, Any]:
    queue = f"http-{run_no}-{int(time.time())}"
    async with AsyncClient(url) as client:
        await client.create_queue(queue, replicas=args.replicas)
        await client.create_group(queue, "workers")
    total = args.messages // args.clients * args.clients
    prof = Profiler(Path(args.profile) if args.profile else None, pid)
    prof.start(f"publish-{run_no}")
    me = psutil.Process()
    cpu0, mine0 = _cpu(pid), sum(me.cpu_times()[:2])
    if args.stream:
        pub = await stream_publish(url, queue, total, args.clients, args.batch, args.size)
    else:
        pub = await publish(url, queue, total, args.clients, args.batch, args.size)
    cpu1, mine1 = _cpu(pid), sum(me.cpu_times()[:2])
    prof.stop()
    prof.start(f"receive-ack-{run_no}")
    if args.stream:
        con = await consume_phase(url, queue, "workers", total, args.clients)
    else:
        con = await receive_ack(url, queue, total, args.clients, args.batch)
    cpu2, mine2 = _cpu(pid), sum(me.cpu_times()[:2])
    prof.stop()
    async with AsyncClient(url) as client:
        await client.delete_queue(queue)
    return {"publish_msgs_s": pub, "receive_ack_msgs_s": con,
            "publish_node_cpu_s": cpu1 - cpu0, "receive_ack_node_cpu_s": cpu2 - cpu1,
            "publish_client_cpu_s": mine1 - mine0,
            "receive_ack_client_cpu_s": mine2 - mine1}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--stream",
        action="store_true",
        help="the streaming path instead (publisher, consumer: same counts)",
    )
    parser.add_argument("--profile", help="directory for py-spy profiles of the node")
    parser.add_argument("--url", help="an already running node (then no profile, no CPU)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cherami-http-") as tmp:
        server = NodeProcess(Path(tmp), stores=max(3, args.replicas)).start()
        assert server.proc is not None
        try:
            for i in range(args.runs):
                r = uvloop.run(run(server.url, server.proc.pid, args, i))
                path = "stream" if args.stream else "HTTP"
                print(f"run {i + 1}: {path} publish {r['publish_msgs_s']:,.0f} msgs/s "
                      f"(CPU s: node {r['publish_node_cpu_s']:.2f}, clients "
                      f"{r['publish_client_cpu_s']:.2f}), receive+ack "
                      f"{r['receive_ack_msgs_s']:,.0f} msgs/s (CPU s: node "
                      f"{r['receive_ack_node_cpu_s']:.2f}, clients "
                      f"{r['receive_ack_client_cpu_s']:.2f})", flush=True)  # fmt: skip
                for call, seconds in LATENCY.items():
                    seconds.sort()
                    if seconds:
                        print(f"  {call}: {len(seconds)} calls, p50 "
                              f"{seconds[len(seconds) // 2] * 1000:.1f} ms, p90 "
                              f"{seconds[len(seconds) * 9 // 10] * 1000:.1f} ms")  # fmt: skip
                    seconds.clear()
        finally:
            server.stop()
    os.sync()


if __name__ == "__main__":
    main()
