"""Ordering keys' cost on one node: consume+ack of a keyed backlog (each key's messages
one at a time, in order) beside an unkeyed one of the same size, in the same run.

    python benchmarks/keys.py [--messages 100000] [--keys 1000] [--consumers 4]
                              [--size 256] [--replicas 1] [--rounds 2] [--http]

Publishes N unkeyed messages to one queue and N messages with ``--keys`` keys (round
robin: every key gets N/keys messages) to another, through the streaming publisher;
then, for ``--rounds`` rounds, alternately consumes+acks the keyed and the unkeyed
backlog of a fresh group each with ``--consumers`` competing stream consumers (credit
4000 each; ``--http``: HTTP receive of 1000 and ack), and checks the keyed group's
order (per key, the order of acks is publish order). Prints msgs/s of each and keyed
as a share of unkeyed."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cherami.client.asyncclient import AsyncClient  # noqa: E402
from cherami.client.models import OutgoingMessage, Received  # noqa: E402
from cherami.devcluster.nodeproc import NodeProcess  # noqa: E402


async def publish(url: str, queue: str, total: int, size: int, keys: int) -> float:
    body = b"x" * size
    async with AsyncClient(url) as client, client.publisher(queue, max_in_flight=16) as pub:
        start = time.perf_counter()
        futures = []
        for sent in range(0, total, 500):
            n = min(500, total - sent)
            batch: list[OutgoingMessage | bytes] = (
                [OutgoingMessage(body, key=f"k{(sent + i) % keys}") for i in range(n)]
                if keys
                else [body] * n
            )
            futures.append(await pub.send(batch))
        await asyncio.gather(*futures)
        return total / (time.perf_counter() - start)


async def consume(
    url: str, queue: str, group: str, total: int, consumers: int, http: bool
) -> tuple[float, dict[str | None, list[int]]]:
    """msgs/s until every message is acked; the ack order per key (by sequence)."""
    done = 0
    finished = asyncio.Event()
    order: dict[str | None, list[int]] = {}

    def took(batch: list[Received]) -> None:
        nonlocal done
        for m in batch:
            order.setdefault(m.key, []).append(int(m.id.rsplit(":", 1)[1]))
        done += len(batch)
        if done >= total:
            finished.set()

    async def stream() -> None:
        async with AsyncClient(url) as client, client.consumer(queue, group, credit=4000) as c:
            while not finished.is_set():
                batch = await c.get_batch(1000, timeout=0.05)
                if batch:
                    took(batch)
                    c.ack(*batch)
            await c.flush()

    async def receive() -> None:
        async with AsyncClient(url) as client:
            while not finished.is_set():
                batch = await client.receive(queue, group, max_messages=1000, wait_seconds=0.05)
                if batch:
                    took(batch)
                    await client.ack(queue, group, batch)

    start = time.perf_counter()
    workers = [receive() if http else stream() for _ in range(consumers)]
    await asyncio.wait_for(asyncio.gather(*workers), 900)
    return done / (time.perf_counter() - start), order


def alternating(rounds: int) -> list[tuple[int, str, str]]:
    """(round, queue, group) of each consume: a fresh group of each queue a round, the
    keyed and the unkeyed one first in turn."""
    order = [("keyed", "plain"), ("plain", "keyed")]
    return [(r, q, f"{q}-{r}") for r in range(rounds) for q in order[r % 2]]


def _cpu(pid: int) -> float:
    """CPU seconds of the node's own process (its roles but the store hosts)."""
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        node = NodeProcess(Path(tmp) / "node").start()
        try:
            async with AsyncClient(node.url) as client:
                for queue in ("plain", "keyed"):
                    await client.create_queue(queue, replicas=args.replicas)
            plain = await publish(node.url, "plain", args.messages, args.size, 0)
            keyed = await publish(node.url, "keyed", args.messages, args.size, args.keys)
            print(f"publish: unkeyed {plain:,.0f} msgs/s, keyed {keyed:,.0f} msgs/s")
            rates: dict[str, list[float]] = {"plain": [], "keyed": []}
            for r, queue, group in alternating(args.rounds):
                async with AsyncClient(node.url) as client:
                    await client.create_group(queue, group)
                cpu = _cpu(node.proc.pid if node.proc else 0)
                rate, order = await consume(
                    node.url, queue, group, args.messages, args.consumers, args.http
                )
                cpu = _cpu(node.proc.pid if node.proc else 0) - cpu
                if queue == "keyed":
                    wrong = [k for k, seqs in order.items() if seqs != sorted(seqs)]
                    assert not wrong, f"keys out of order: {wrong[:5]}"
                rates[queue].append(rate)
                us = cpu / args.messages * 1e6
                print(f"round {r + 1}: {queue} consume+ack {rate:,.0f} msgs/s, "
                      f"node CPU {us:.1f} us/msg")  # fmt: skip
            p, k = statistics.mean(rates["plain"]), statistics.mean(rates["keyed"])
            print(f"mean: unkeyed {p:,.0f}, keyed {k:,.0f} msgs/s: keyed {k / p:.0%} of unkeyed")
        finally:
            node.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--http", action="store_true")
    uvloop.run(main(parser.parse_args()))
