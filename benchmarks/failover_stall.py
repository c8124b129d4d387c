"""The publish stall when a store host is killed: a producer publishes continuously
through the streaming client, a store host gets SIGKILL, and the longest gap between two
consecutive publish acks is reported (target: under 2 s). On a node (store hosts as
child processes, restarted by the node) and on a local cluster (every role its own
process, 4 store hosts, the killed one stays down).

    python benchmarks/failover_stall.py [--seconds 10] [--kill-at 3] [--metadata URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cherami.client.asyncclient import AsyncClient
from cherami.devcluster.local import LocalCluster
from cherami.devcluster.nodeproc import NodeProcess as ServerProcess


async def measure(url: str, kill: object, seconds: float, kill_at: float) -> dict[str, float]:
    async with AsyncClient(url, timeout=60) as client:
        await client.create_queue("stall")
        async with client.publisher("stall", max_in_flight=8) as pub:
            acks: list[float] = []
            start = time.monotonic()
            killed_at = 0.0
            pending: set[asyncio.Future[list[str]]] = set()
            while time.monotonic() - start < seconds:
                fut = await pub.send([b"x" * 256] * 100)
                fut.add_done_callback(lambda f: acks.append(time.monotonic()))
                pending.add(fut)
                pending = {p for p in pending if not p.done()}
                if not killed_at and time.monotonic() - start >= kill_at:
                    await asyncio.to_thread(kill)  # type: ignore[arg-type]
                    killed_at = time.monotonic()
            await asyncio.gather(*pending)
    acks.sort()
    gaps = [b - a for a, b in zip(acks, acks[1:], strict=False) if b >= killed_at]
    return {"acked_batches": len(acks), "longest_gap_s": max(gaps) if gaps else 0.0}


def _kill_node_store(data_dir: Path) -> None:
    pattern = f"cherami.roles.storehost --data-dir {data_dir}/store-1"
    pid = int(subprocess.check_output(["pgrep", "-f", pattern]).split()[0])
    os.kill(pid, signal.SIGKILL)


def _kill_a_replica(local: LocalCluster) -> None:
    """SIGKILL a store host that holds a replica of the queue's open plain extent."""
    with urllib.request.urlopen(local.url + "/v1/queues/stall/extents") as resp:
        extents = json.load(resp)["extents"]
    (extent,) = [e for e in extents if e["status"] == "open" and e["kind"] == "plain"]
    by_address = {p.address: name for name, p in local.procs.items()}
    local.kill(by_address[extent["stores"][0]])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--kill-at", type=float, default=3)
    parser.add_argument("--metadata", help="metadata URL of the cluster (default SQLite)")
    args = parser.parse_args()
    print(f"{'setup':>8} {'acked batches':>14} {'longest gap after the kill':>28}")
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(Path(tmp)).start()
        try:
            r = uvloop.run(measure(server.url, lambda: _kill_node_store(Path(tmp)),
                                   args.seconds, args.kill_at))  # fmt: skip
        finally:
            server.stop()
    print(f"{'node':>8} {r['acked_batches']:>14,.0f} {r['longest_gap_s']:>27.2f}s")
    with tempfile.TemporaryDirectory() as tmp:
        # four store hosts: with one dead, three are left to place 3 new replicas on
        counts = {"storehost": 4, "controller": 2, "inputhost": 2, "outputhost": 2, "frontend": 1}
        local = LocalCluster(Path(tmp), args.metadata or f"sqlite:///{tmp}/metadata.db", counts)
        local.up()
        try:
            r = uvloop.run(measure(local.url, lambda: _kill_a_replica(local),
                                   args.seconds, args.kill_at))  # fmt: skip
        finally:
            local.down()
    print(f"{'cluster':>8} {r['acked_batches']:>14,.0f} {r['longest_gap_s']:>27.2f}s")


if __name__ == "__main__":
    main()
