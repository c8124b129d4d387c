"""How a node's costs grow with the number of queues: create N queues of G groups each
(one message in each), then measure the node's idle CPU (every process, over --idle
seconds, 60 by default: long enough to see anything that wakes every 30 s) and memory
(the resident set of every process), the latency of publishing and receiving one
message at a time on one more queue, a SIGTERM restart and a SIGKILL restart (until
/healthz answers 200), and that every message published before is delivered after, to
every group. Creating: the node's CPU a queue made and its metadata calls a queue made,
then its metadata calls a second over --settle (what the leader and the output host
still catch up on).

    .venv/bin/python benchmarks/breadth.py 25 50 100          # queue counts, 2 groups each
    .venv/bin/python benchmarks/breadth.py --groups 1 --idle 10 --concurrency 4 200
    .venv/bin/python benchmarks/breadth.py --idle 30 --settle 30 --no-restarts 10000
    .venv/bin/python benchmarks/breadth.py --cluster 1000 2000   # see breadth_cluster.py

Prints one row per N; nothing is estimated."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cherami.client.asyncclient import AsyncClient  # noqa: E402
from cherami.devcluster.nodeproc import NodeProcess  # noqa: E402


async def _create(url: str, queues: int, groups: int, concurrency: int) -> float:
    started = time.monotonic()
    async with AsyncClient(url, timeout=120) as client:
        limit = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with limit:
                await client.create_queue(f"q{i}")
                for g in range(groups):
                    await client.create_group(f"q{i}", f"g{g}")
                await client.publish(f"q{i}", [f"m{i}"])

        await asyncio.gather(*(one(i) for i in range(queues)))
    return time.monotonic() - started


async def _all_delivered(url: str, queues: int, groups: int) -> int:
    """How many (queue, group) pairs did not get their message back."""
    missing = 0
    async with AsyncClient(url, timeout=60) as client:
        for i in range(queues):
            for g in range(groups):
                got = await client.receive(f"q{i}", f"g{g}", max_messages=10, wait_seconds=5)
                if [m.text for m in got] != [f"m{i}"]:
                    missing += 1
                # not acked: the next restart delivers it again
    return missing


def _cpu_seconds(pids: list[str]) -> float:
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
    return total


async def _latency(url: str, rounds: int = 200) -> tuple[float, float]:
    """p50 and p99 (ms) of publishing one message and receiving it (then acking it), one
    at a time, on a queue of its own made among the idle ones: what a user of one queue
    sees on a node that holds many."""
    took = []
    async with AsyncClient(url, timeout=60) as client:
        await client.create_queue("latency")
        await client.create_group("latency", "g")
        for i in range(rounds):
            started = time.perf_counter()
            await client.publish("latency", [f"ping{i}"])
            got = await client.receive("latency", "g", max_messages=1, wait_seconds=5)
            took.append((time.perf_counter() - started) * 1000)
            assert [m.text for m in got] == [f"ping{i}"], got
            await client.ack("latency", "g", got)
    took.sort()
    return took[len(took) // 2], took[int(len(took) * 0.99)]


def _rss_mb(pids: list[str]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            pass
    return total / 1024


def _scrape_seconds(url: str) -> float:
    """How long one scrape of /metrics takes (what Prometheus asks every 15-60 s)."""
    started = time.perf_counter()
    with urllib.request.urlopen(url + "/metrics", timeout=600) as resp:
        resp.read()
    return time.perf_counter() - started


def _metadata_calls(url: str) -> dict[str, float]:
    """The node's calls to its metadata store so far, by operation (from /metrics)."""
    calls: dict[str, float] = {}
    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        for line in resp.read().decode().splitlines():
            match = _CALLS.match(line)
            if match:
                calls[match.group(1)] = float(match.group(2))
    return calls


_CALLS = re.compile(r'cherami_metadata_call_latency_seconds_count\{op="([^"]+)"\} (\S+)')


def _pids(node: NodeProcess) -> list[str]:
    """The node's process, then its store hosts'."""
    assert node.proc is not None
    children = subprocess.run(
        ["pgrep", "-P", str(node.proc.pid)], capture_output=True, text=True
    ).stdout.split()
    return [str(node.proc.pid), *children]


def _idle(
    node: NodeProcess, seconds: float, settle: float, made: dict[str, float]
) -> dict[str, Any]:
    """The node's CPU over ``seconds`` of idling (% of a core, every process), its RSS
    after (MB), its metadata calls a second while idle (in all, and the busiest), and
    a second over the ``settle`` seconds before (since ``made``, the calls once every
    queue was made: what the leader and the output host still had to catch up on)."""
    pids = _pids(node)
    started = time.monotonic()
    time.sleep(settle)  # what creating and the first deliveries left behind settles
    # the scrape that reads the call counters costs the node CPU too (3 s at 10,000
    # queues): the window starts after it, and ends before the one that closes it
    calls_before = _metadata_calls(node.url)
    settling = (sum(calls_before.values()) - sum(made.values())) / (time.monotonic() - started)
    before = _cpu_seconds(pids)
    time.sleep(seconds)
    cpu = (_cpu_seconds(pids) - before) / seconds * 100
    calls = _metadata_calls(node.url)
    rates = {op: (n - calls_before.get(op, 0)) / seconds for op, n in calls.items()}
    busiest = sorted(((r, op) for op, r in rates.items() if r > 0), reverse=True)[:3]
    return {
        "idle_cpu_pct": cpu, "rss_mb": _rss_mb(pids),
        "metadata_per_s": sum(rates.values()),
        "metadata_busiest": ", ".join(f"{op} {r:.2f}" for r, op in busiest) or "none",
        "metadata_settling_per_s": settling,
    }  # fmt: skip


def _restart(node: NodeProcess, kill: bool) -> float:
    if kill:
        node.kill()
    else:
        node.stop()
    started = time.monotonic()
    node.start(timeout=600)
    return time.monotonic() - started


def empty_latency() -> tuple[float, float]:
    """p50 and p99 (ms) of the same round trip on a node that holds nothing else."""
    with tempfile.TemporaryDirectory() as tmp:
        node = NodeProcess(Path(tmp) / "node").start()
        try:
            return asyncio.run(_latency(node.url))
        finally:
            node.stop()


def run(queues: int, groups: int, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        node = NodeProcess(Path(tmp) / "node").start()
        try:
            pids = _pids(node)
            calls = _metadata_calls(node.url)
            cpu = _cpu_seconds(pids[:1]), _cpu_seconds(pids[1:])
            created = asyncio.run(_create(node.url, queues, groups, args.concurrency))
            create_cpu = _cpu_seconds(pids[:1]) - cpu[0], _cpu_seconds(pids[1:]) - cpu[1]
            made = _metadata_calls(node.url)
            made_calls = (sum(made.values()) - sum(calls.values())) / queues
            idle = _idle(node, args.idle, args.settle, made)
            scrape = _scrape_seconds(node.url)
            p50, p99 = asyncio.run(_latency(node.url))
            sigterm = sigkill = float("nan")
            missing_term = missing_kill = 0
            if args.restarts:
                sigterm = _restart(node, kill=False)
                missing_term = asyncio.run(_all_delivered(node.url, queues, groups))
                sigkill = _restart(node, kill=True)
                # the deliveries above were not acked: a restart delivers them again
                missing_kill = asyncio.run(_all_delivered(node.url, queues, groups))
        finally:
            node.stop()
    return {
        "queues": queues, "groups": groups, "create_s": created, "create_cpu": create_cpu,
        "made_calls": made_calls, **idle, "scrape_s": scrape,
        "latency_p50_ms": p50, "latency_p99_ms": p99,
        "sigterm_restart_s": sigterm, "sigkill_restart_s": sigkill,
        "missing_after_sigterm": missing_term, "missing_after_sigkill": missing_kill,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("queues", nargs="+", type=int)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of idling measured")
    parser.add_argument(
        "--settle",
        type=float,
        default=3.0,
        help="seconds left after creating before the idle measure starts",
    )
    parser.add_argument("--concurrency", type=int, default=16, help="queues created at once")
    parser.add_argument(
        "--no-restarts",
        dest="restarts",
        action="store_false",
        help="leave the restarts out (and the check of every group after each: at 10,000 "
        "queues 20,000 receives, over 10 minutes)",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="a cluster on PostgreSQL "
        "(3 input, 3 output, 3 store hosts, 2 controllers): breadth_cluster.py",
    )
    parser.add_argument(
        "--postgres",
        default="postgresql://postgres@127.0.0.1:5432/test",
        help="--cluster: the database (a schema of its own, dropped after)",
    )
    args = parser.parse_args()
    if args.cluster:
        from breadth_cluster import main as cluster_main  # noqa: PLC0415

        cluster_main(args)
        return
    p50, p99 = empty_latency()
    print(f"empty node: publish to receive p50 / p99 {p50:.1f} / {p99:.1f} ms", flush=True)
    print("| queues x groups | create all (s) | queues/s "
          "| CPU to create: node / store hosts (s) | node CPU a queue (ms) "
          "| metadata calls a queue made | metadata calls/s settling "
          "| idle CPU (% of a core) | RSS (MB) "
          "| metadata calls/s idle (busiest) | /metrics scrape (s) "
          "| publish to receive p50 / p99 (ms) "
          "| SIGTERM restart (s) | SIGKILL restart (s) | not delivered after |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in args.queues:
        r = run(n, args.groups, args)
        print(
            f"| {n} x {args.groups} | {r['create_s']:.1f} | {n / r['create_s']:.0f} "
            f"| {r['create_cpu'][0]:.1f} / {r['create_cpu'][1]:.1f} "
            f"| {r['create_cpu'][0] / n * 1000:.2f} | {r['made_calls']:.1f} "
            f"| {r['metadata_settling_per_s']:.0f} "
            f"| {r['idle_cpu_pct']:.1f} | {r['rss_mb']:.0f} "
            f"| {r['metadata_per_s']:.2f} ({r['metadata_busiest']}) | {r['scrape_s']:.2f} "
            f"| {r['latency_p50_ms']:.1f} / {r['latency_p99_ms']:.1f} "
            f"| {r['sigterm_restart_s']:.1f} | {r['sigkill_restart_s']:.1f} "
            f"| {r['missing_after_sigterm'] + r['missing_after_sigkill']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
