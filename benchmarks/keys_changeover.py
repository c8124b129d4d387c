"""The change-over of a cluster's queue at its first keyed message (issue 30): how long
a spread group's deliveries stop while the group moves to one output host.

    python benchmarks/keys_changeover.py [--rate 200] [--before 10] [--after 15]
                                         [--rounds 3] [--metadata postgresql://...]

On a local cluster (2 store hosts, 2 input hosts, 2 output hosts, PostgreSQL metadata
in a schema of its own) an AP queue with an open extent on each input host, and a
group consumed by 2 stream consumers, which the two output hosts serve spread. A
publisher sends unkeyed messages at ``--rate`` a second, each carrying its publish
time; after ``--before`` seconds it sends one keyed message, then goes on unkeyed for
``--after`` seconds. Each round uses a fresh queue. Printed per round: the longest gap
between two deliveries, publish -> delivery latency of the unkeyed messages p50 / p99 /
max before and after the keyed one, how long the keyed message took, how many output
hosts held the group before and after (docs/design/ordering-keys.md, "A cluster")."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import time
from pathlib import Path

import psutil
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.keys_cluster import holders, local_cluster  # noqa: E402

from cherami.client.asyncclient import AsyncClient  # noqa: E402
from cherami.client.models import OutgoingMessage  # noqa: E402


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


async def wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.1)


async def one_round(url: str, queue: str, args: argparse.Namespace) -> dict[str, float]:
    group = "g"
    async with AsyncClient(url) as client:
        await client.create_queue(queue, replicas=1, min_extents=2)

        async def two_input_hosts() -> bool:
            route = await client.request("GET", f"/v1/queues/{queue}/publishers")
            return len(route["input_hosts"]) >= 2

        await wait_for(two_input_hosts, 30, "2 input hosts")
        await client.create_group(queue, group)

    async def spread() -> bool:
        return len(await holders(url, queue, group)) >= 2

    await wait_for(spread, 30, "the group spread over 2 output hosts")
    arrivals: list[tuple[float, float, bool]] = []  # (delivered at, latency, keyed)
    seen: set[str] = set()
    again: list[float] = []  # when a message came a second time, seconds after the keyed one
    stop = asyncio.Event()

    async def consumer() -> None:
        async with AsyncClient(url) as client, client.consumer(queue, group, credit=500) as c:
            while not stop.is_set():
                batch = await c.get_batch(100, timeout=0.05)
                now = time.time()
                for m in batch:
                    if m.text in seen:
                        again.append(now)
                        continue
                    seen.add(m.text)
                    sent = float(m.text.split()[0])
                    arrivals.append((now, now - sent, m.key is not None))
                if batch:
                    c.ack(*batch)
            await c.flush()

    tasks = [asyncio.create_task(consumer()) for _ in range(2)]
    keyed_at = 0.0
    published = 0
    async with AsyncClient(url) as client, client.publisher(queue) as pub:
        start = time.monotonic()
        total = args.before + args.after
        while (elapsed := time.monotonic() - start) < total:
            if not keyed_at and elapsed >= args.before:
                keyed_at = time.time()
                await pub.publish([OutgoingMessage(f"{keyed_at} keyed", key="k1")])
                published += 1
            await pub.publish([OutgoingMessage(f"{time.time()} plain")])
            published += 1
            await asyncio.sleep(max(0.0, start + published / args.rate - time.monotonic()))
    after_holders = len(await holders(url, queue, group))
    deadline = time.monotonic() + 60
    while len(arrivals) < published and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    stop.set()
    await asyncio.gather(*tasks)
    times = sorted(a[0] for a in arrivals)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    before = [lat for at, lat, k in arrivals if not k and at - lat < keyed_at]
    after = [lat for at, lat, k in arrivals if not k and at - lat >= keyed_at]
    keyed = [lat for _, lat, k in arrivals if k]
    return {
        "published": published,
        "delivered": len(arrivals),
        "gap": max(gaps),
        "before_p50": pct(before, 0.5) * 1000,
        "before_p99": pct(before, 0.99) * 1000,
        "after_p50": pct(after, 0.5) * 1000,
        "after_p99": pct(after, 0.99) * 1000,
        "after_max": max(after) * 1000,
        "keyed": keyed[0] if keyed else float("nan"),
        "holders_after": after_holders,
        "again": len(again),
        "again_from": min(again, default=keyed_at) - keyed_at,
        "again_to": max(again, default=keyed_at) - keyed_at,
    }


async def main(args: argparse.Namespace) -> None:
    with local_cluster(args.metadata) as local:
        gaps = []
        for r in range(args.rounds):
            load = psutil.getloadavg()[0]
            got = await one_round(local.url, f"changeover{r}", args)
            gaps.append(got["gap"])
            print(
                f"round {r + 1} (load {load:.1f}): {got['delivered']:.0f} of "
                f"{got['published']:.0f} delivered, {got['again']:.0f} twice (from "
                f"{got['again_from']:.1f} to {got['again_to']:.1f} s after the keyed one); "
                f"longest gap between deliveries "
                f"{got['gap']:.2f} s; unkeyed latency before p50/p99 "
                f"{got['before_p50']:.0f}/{got['before_p99']:.0f} ms, after p50/p99/max "
                f"{got['after_p50']:.0f}/{got['after_p99']:.0f}/{got['after_max']:.0f} ms; "
                f"the keyed message {got['keyed']:.2f} s; output hosts holding the group "
                f"after: {got['holders_after']:.0f}"
            )
        print(f"median longest gap {statistics.median(gaps):.2f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--before", type=float, default=10)
    parser.add_argument("--after", type=float, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--metadata", default="postgresql://postgres@127.0.0.1:5432/test")
    uvloop.run(main(parser.parse_args()))
