"""How a node's costs grow with the number of queues: create N queues of G groups each
(one message in each), then measure the node's idle CPU (every process, over --idle
seconds, 60 by default: long enough to see anything that wakes every 30 s) and memory
(the resident set of every process), the latency of publishing and receiving one
message at a time on one more queue, a SIGTERM restart and a SIGKILL restart (until
/healthz answers 200), and that every message published before is delivered after, to
every group.

    .venv/bin/python benchmarks/breadth.py 25 50 100          # queue counts, 2 groups each
    .venv/bin/python benchmarks/breadth.py --groups 1 --idle 10 200

Prints one row per N; nothing is estimated."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cherami.client.asyncclient import AsyncClient  # noqa: E402
from cherami.devcluster.nodeproc import NodeProcess  # noqa: E402


async def _create(url: str, queues: int, groups: int) -> float:
    started = time.monotonic()
    async with AsyncClient(url, timeout=120) as client:
        limit = asyncio.Semaphore(4)

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


def _idle(node: NodeProcess, seconds: float) -> tuple[float, float]:
    """The node's CPU over ``seconds`` of idling (% of a core) and its RSS after (MB)."""
    assert node.proc is not None
    children = subprocess.run(
        ["pgrep", "-P", str(node.proc.pid)], capture_output=True, text=True
    ).stdout.split()
    pids = [str(node.proc.pid), *children]
    time.sleep(3)  # what creating and the first deliveries left behind settles
    before = _cpu_seconds(pids)
    time.sleep(seconds)
    return (_cpu_seconds(pids) - before) / seconds * 100, _rss_mb(pids)


def _restart(node: NodeProcess, kill: bool) -> float:
    if kill:
        node.kill()
    else:
        node.stop()
    started = time.monotonic()
    node.start(timeout=600)
    return time.monotonic() - started


def run(queues: int, groups: int, idle_seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        node = NodeProcess(Path(tmp) / "node").start()
        try:
            created = asyncio.run(_create(node.url, queues, groups))
            idle, rss = _idle(node, idle_seconds)
            p50, p99 = asyncio.run(_latency(node.url))
            sigterm = _restart(node, kill=False)
            missing_term = asyncio.run(_all_delivered(node.url, queues, groups))
            sigkill = _restart(node, kill=True)
            # the deliveries above were not acked: a restart delivers them again
            missing_kill = asyncio.run(_all_delivered(node.url, queues, groups))
        finally:
            node.stop()
    return {
        "queues": queues, "groups": groups, "create_s": created, "idle_cpu_pct": idle,
        "rss_mb": rss, "latency_p50_ms": p50, "latency_p99_ms": p99,
        "sigterm_restart_s": sigterm, "sigkill_restart_s": sigkill,
        "missing_after_sigterm": missing_term, "missing_after_sigkill": missing_kill,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("queues", nargs="+", type=int)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of idling measured")
    args = parser.parse_args()
    print("| queues x groups | create all (s) | idle CPU (% of a core) | RSS (MB) "
          "| publish to receive p50 / p99 (ms) | SIGTERM restart (s) | SIGKILL restart (s) "
          "| not delivered after |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for n in args.queues:
        r = run(n, args.groups, args.idle)
        print(
            f"| {n} x {args.groups} | {r['create_s']:.1f} | {r['idle_cpu_pct']:.1f} "
            f"| {r['rss_mb']:.0f} | {r['latency_p50_ms']:.1f} / {r['latency_p99_ms']:.1f} "
            f"| {r['sigterm_restart_s']:.1f} | {r['sigkill_restart_s']:.1f} "
            f"| {r['missing_after_sigterm'] + r['missing_after_sigkill']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
