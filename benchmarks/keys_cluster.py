"""Ordering keys' cost in a cluster (issue 30): consume+ack of a keyed backlog of an AP
queue written through 2 input hosts, beside an unkeyed one, on a local cluster (2 store
hosts, 2 input hosts, 2 output hosts, PostgreSQL metadata in a schema of its own).

    python benchmarks/keys_cluster.py [--messages 40000] [--keys 1000] [--consumers 4]
                                      [--rounds 2] [--metadata postgresql://...]

A keyed queue's group is served whole by one output host (docs/design/ordering-keys.md,
"A cluster"); an unkeyed one is spread over both. Publishes N messages to each queue
(``min_extents`` 2: an open extent on each input host) through the streaming publisher;
then, for ``--rounds`` rounds, alternately consumes+acks a fresh group of each with
``--consumers`` stream consumers (credit 4000), once the group's units are held, and
checks the keyed group's order per key (by the number in each body). Prints msgs/s, how
many output hosts held the group, and the output hosts' CPU seconds a message."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.keys import alternating  # noqa: E402

from cherami.client.asyncclient import AsyncClient  # noqa: E402
from cherami.client.models import OutgoingMessage  # noqa: E402
from cherami.devcluster.local import LocalCluster  # noqa: E402

COUNTS = {"storehost": 2, "controller": 1, "inputhost": 2, "outputhost": 2, "frontend": 1}


async def publish(url: str, queue: str, total: int, keys: int) -> float:
    async with AsyncClient(url) as client, client.publisher(queue, max_in_flight=16) as pub:
        start = time.perf_counter()
        for sent in range(0, total, 500):
            batch = [
                OutgoingMessage(
                    f"{i // max(keys, 1):08d}".ljust(256, "x"), key=f"k{i % keys}" if keys else None
                )
                for i in range(sent, min(sent + 500, total))
            ]
            await pub.publish(batch)  # one after another: the bodies' numbers are its order
        return total / (time.perf_counter() - start)


async def holders(url: str, queue: str, group: str) -> list[str]:
    """The output hosts serving the group (the consumers' routing call)."""
    async with AsyncClient(url) as client:
        route = await client.request("GET", f"/v1/queues/{queue}/groups/{group}/consumers")
    return [h["address"] for h in route["output_hosts"]]


async def consume(
    url: str, queue: str, group: str, total: int, consumers: int
) -> tuple[float, list[str]]:
    """msgs/s until every message is acked; the keys whose bodies came out of order."""
    done = 0
    finished = asyncio.Event()
    last: dict[str | None, int] = {}
    wrong: list[str] = []

    async def stream() -> None:
        nonlocal done
        async with AsyncClient(url) as client, client.consumer(queue, group, credit=4000) as c:
            while not finished.is_set():
                batch = await c.get_batch(1000, timeout=0.05)
                for m in batch:
                    n = int(m.text[:8])
                    if m.key is not None and n < last.get(m.key, -1):
                        wrong.append(m.key)
                    last[m.key] = max(n, last.get(m.key, -1))
                done += len(batch)
                if done >= total:
                    finished.set()
                if batch:
                    c.ack(*batch)
            await c.flush()

    start = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(stream() for _ in range(consumers))), 900)
    return done / (time.perf_counter() - start), wrong


@contextlib.contextmanager
def local_cluster(metadata: str) -> Iterator[LocalCluster]:
    """COUNTS' role processes up on a schema of their own, down and dropped after."""
    schema = f"b_{uuid.uuid4().hex[:12]}"
    with tempfile.TemporaryDirectory() as tmp:
        local = LocalCluster(Path(tmp) / "cluster", f"{metadata}?schema={schema}", COUNTS)
        try:
            local.up()
            yield local
        finally:
            local.down()
            with psycopg.connect(metadata, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


async def main(args: argparse.Namespace) -> None:
    with local_cluster(args.metadata) as local:
        outputs = [psutil.Process(local.procs[n].pid) for n in local.names("outputhost")]

        def cpu() -> float:
            return sum(p.cpu_times().user + p.cpu_times().system for p in outputs)

        async with AsyncClient(local.url) as client:
            for queue in ("plain", "keyed"):
                await client.create_queue(queue, replicas=1, min_extents=2)
                while (
                    len(
                        (await client.request("GET", f"/v1/queues/{queue}/publishers"))[
                            "input_hosts"
                        ]
                    )
                    < 2
                ):
                    await asyncio.sleep(0.2)
        for queue, keys in (("plain", 0), ("keyed", args.keys)):
            rate = await publish(local.url, queue, args.messages, keys)
            print(f"publish {queue}: {rate:,.0f} msgs/s")
        rates: dict[str, list[float]] = {"plain": [], "keyed": []}
        for r, queue, group in alternating(args.rounds):
            async with AsyncClient(local.url) as client:
                await client.create_group(queue, group)
            want = 1 if queue == "keyed" else 2
            waited = time.monotonic()
            while len(held := await holders(local.url, queue, group)) < want:
                assert time.monotonic() - waited < 30, f"{group} held by {held}"
                await asyncio.sleep(0.1)
            before = cpu()
            rate, wrong = await consume(local.url, queue, group, args.messages, args.consumers)
            us = (cpu() - before) / args.messages * 1e6
            rates[queue].append(rate)
            print(f"round {r + 1}: {queue} consume+ack {rate:,.0f} msgs/s on "
                  f"{len(held)} output host(s), their CPU {us:.1f} us/msg, "
                  f"{len(set(wrong))} keys out of order")  # fmt: skip
        p, k = statistics.mean(rates["plain"]), statistics.mean(rates["keyed"])
        print(f"mean: unkeyed {p:,.0f}, keyed {k:,.0f} msgs/s: keyed {k / p:.0%} of unkeyed; "
              f"load {psutil.getloadavg()}")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = {"messages": 40_000, "keys": 1000, "consumers": 4, "rounds": 2}
    for name, default in defaults.items():
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--metadata", default="postgresql://postgres@127.0.0.1:5432/test")
    uvloop.run(main(parser.parse_args()))
