"""Ordering keys on a real node (docs/api.md, "Ordering keys"): 50 keys x 200 messages
and unkeyed ones among them, 8 competing consumers (4 over HTTP, 4 streams) with random
processing times and 10% nacks: per key the order of first successful processing is
publish order and no two messages of a key are ever in hand at once; a poison message
of one key does not hold up the other keys, goes to the DLQ after max deliveries, and
its key goes on after it. The same while the node (its output host) is SIGKILLed and
started again, and while one of its store hosts is SIGKILLed mid-publish (the extents
on it are sealed and the keys move to their successors): a redelivery after a failure
is reported, not counted as a violation."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.client.models import OutgoingMessage, Received
from cherami.errors import CheramiError, InvalidRequest
from tests.support.keyorder import KeyOrder, http_consumer, stream_consumer
from tests.support.server import ServerProcess, unique

KEYS = 50
PER_KEY = 200
UNKEYED = 1000
POISON_KEY = "poison"
POISONED = 5  # messages of the poison key; the first is the poison


async def test_keys_are_delivered_one_at_a_time_in_publish_order(client: AsyncClient) -> None:
    queue, group = unique("q"), unique("g")
    await client.create_queue(queue)
    await client.create_group(queue, group, max_delivery_count=4, visibility_timeout_seconds=60)
    keys = [f"k{i}" for i in range(KEYS)]
    messages = [OutgoingMessage(f"{POISON_KEY}/{i}", key=POISON_KEY) for i in range(POISONED)]
    for n in range(PER_KEY):
        messages += [OutgoingMessage(f"{k}/{n}", key=k) for k in keys]
        messages += [OutgoingMessage(f"u/{n}/{j}") for j in range(UNKEYED // PER_KEY)]
    for start in range(0, len(messages), 1000):  # in order: each batch after the last
        await client.publish(queue, messages[start : start + 1000])

    check = KeyOrder(poison=frozenset({f"{POISON_KEY}/0"}))
    total = len(messages) - 1  # all but the poison are acked
    deadline = time.monotonic() + 120

    def done() -> bool:
        return sum(map(len, check.acked.values())) >= total or time.monotonic() > deadline

    consumers = [http_consumer(client, queue, group, check, done) for _ in range(4)]
    consumers += [stream_consumer(client, queue, group, check, done) for _ in range(4)]
    await asyncio.gather(*consumers)

    assert check.overlaps == [], check.overlaps[:5]
    assert check.span_overlaps() == [], check.span_overlaps()[:5]
    for k in keys:
        assert check.acked.get(k) == [f"{k}/{n}" for n in range(PER_KEY)], k
    assert len(check.acked.get(None, [])) == UNKEYED
    # the poison went to the DLQ after 4 deliveries, and its key went on after it
    assert check.acked[POISON_KEY] == [f"{POISON_KEY}/{i}" for i in range(1, POISONED)]
    dlq = await client.dlq(queue, group)
    assert [m["body"] for m in dlq["messages"]] == [f"{POISON_KEY}/0"]
    assert dlq["messages"][0]["key"] == POISON_KEY
    # ... and held its key only: the other keys were processed while it was in the way
    spans = sorted(check.spans[POISON_KEY])
    held_from = spans[0][0]  # its first delivery began
    held_until = next(span[0] for span in spans if span[2] != f"{POISON_KEY}/0")
    others = sum(1 for k in keys for span in check.spans[k] if held_from < span[0] < held_until)
    assert others > 0, "no other key was processed while the poison held its key"
    assert check.nacks >= 4  # the poison's 4 and about 10% of the rest
    stats = (await client.get_group(queue, group))["stats"]
    assert stats["backlog"] == 0 and stats["top_keys"] == []


async def test_a_key_is_returned_on_receive_and_peek_and_a_bad_key_is_refused(
    client: AsyncClient,
) -> None:
    queue, group = unique("q"), unique("g")
    await client.create_queue(queue)
    await client.create_group(queue, group)
    await client.publish(queue, [OutgoingMessage("a", key="order-17"), "b"])
    got: list[Received] = []
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:  # the keyed one may come second
        got += await client.receive(queue, group, max_messages=2, wait_seconds=1)
    assert sorted((m.text, m.key) for m in got) == [("a", "order-17"), ("b", None)]
    page = await client.peek(queue)
    assert [m.get("key") for m in page["messages"]] == ["order-17", None]
    stats = (await client.get_group(queue, group))["stats"]
    assert stats["top_keys"] == [{"key": "order-17", "backlog": 1}]  # delivered, not acked
    for bad in ["", "x" * 129, "line\nbreak", "nul\x00"]:
        with pytest.raises(InvalidRequest, match="key"):
            await client.publish(queue, [OutgoingMessage("c", key=bad)])
    async with client.publisher(queue) as pub:
        with pytest.raises(InvalidRequest):
            await (await pub.send([OutgoingMessage("c", key="tab\there")]))
    assert len(await client.receive(queue, group, max_messages=10, wait_seconds=0.5)) == 0


async def _consume(client: AsyncClient, queue: str, group: str, check: KeyOrder,
                   done: Callable[[], bool]) -> None:  # fmt: skip
    consumers = [http_consumer(client, queue, group, check, done) for _ in range(4)]
    consumers += [stream_consumer(client, queue, group, check, done) for _ in range(4)]
    await asyncio.gather(*consumers)


async def test_key_order_holds_across_a_sigkill_of_the_node(tmp_path: Path) -> None:
    with socket.socket() as s:  # one port for both runs: the consumers keep their URL
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ServerProcess(tmp_path / "node", extra=["--port", str(port)]).start()
    try:
        await _consume_across_a_kill(server)
    finally:
        server.stop()


async def _consume_across_a_kill(server: ServerProcess) -> None:
    queue, group = unique("q"), unique("g")
    keys, per_key = [f"k{i}" for i in range(30)], 100
    async with AsyncClient(server.url, timeout=30) as client:
        await client.create_queue(queue)
        await client.create_group(queue, group, visibility_timeout_seconds=5)
        messages = [OutgoingMessage(f"{k}/{n}", key=k) for n in range(per_key) for k in keys]
        for start in range(0, len(messages), 1000):
            await client.publish(queue, messages[start : start + 1000])
        check = KeyOrder()
        total = len(messages)
        deadline = time.monotonic() + 120

        def done() -> bool:
            return check.total_acked() >= total or time.monotonic() > deadline

        async def kill_midway() -> None:
            while check.total_acked() < total // 3:
                await asyncio.sleep(0.05)
            check.epoch += 1
            await asyncio.to_thread(server.kill)
            await asyncio.to_thread(server.start)

        await asyncio.gather(_consume(client, queue, group, check, done), kill_midway())
    print(f"\nkill of the node: {check.deliveries} deliveries, {check.nacks} nacks, "
          f"{check.errors} failed calls, {len(check.redelivered_after_ack)} redelivered "
          f"after a successful processing, {len(check.after_failure)} in hand twice across "
          "the kill")  # fmt: skip
    assert check.overlaps == [], check.overlaps[:5]
    assert check.span_overlaps() == [], check.span_overlaps()[:5]
    for k in keys:
        assert check.acked.get(k) == [f"{k}/{n}" for n in range(per_key)], k


async def test_key_order_holds_while_the_queue_scales_from_one_to_three_extents(
    client: AsyncClient,
) -> None:
    queue, group = unique("q"), unique("g")
    await client.create_queue(queue, min_extents=1)
    await client.create_group(queue, group)
    keys, per_key = [f"k{i}" for i in range(30)], 100
    check = KeyOrder()
    total = len(keys) * per_key
    extents_of: dict[str, set[str]] = {k: set() for k in keys}
    deadline = time.monotonic() + 120

    def done() -> bool:
        return check.total_acked() >= total or time.monotonic() > deadline

    async def publish() -> None:
        """In rounds of one message per key, each round answered before the next; the
        queue gets two more extents a third of the way in."""
        for n in range(per_key):
            if n == per_key // 3:
                await client.update_queue(queue, min_extents=3)
            await asyncio.sleep(0.03)  # a producer's pace: 3 s in all
            batch = [OutgoingMessage(f"{k}/{n}", key=k) for k in keys]
            for k, msg_id in zip(keys, await client.publish(queue, batch), strict=True):
                extents_of[k].add(msg_id.rsplit(":", 1)[0])

    await asyncio.gather(publish(), _consume(client, queue, group, check, done))
    moved = sum(len(e) > 1 for e in extents_of.values())
    print(f"\nscaling 1 -> 3 extents: {moved} of {len(keys)} keys moved extent, "
          f"{check.deliveries} deliveries, {check.nacks} nacks")  # fmt: skip
    assert len(set().union(*extents_of.values())) == 3
    assert moved > 0
    assert check.overlaps == [], check.overlaps[:5]
    assert check.span_overlaps() == [], check.span_overlaps()[:5]
    for k in keys:
        assert check.acked.get(k) == [f"{k}/{n}" for n in range(per_key)], k


def _store_pid(server: ServerProcess, index: int) -> int:
    pattern = f"cherami.roles.storehost --data-dir {server.data_dir}/store-{index}"
    return int(subprocess.check_output(["pgrep", "-f", pattern]).split()[0])


async def test_key_order_holds_across_a_sigkill_of_a_store_host(tmp_path: Path) -> None:
    """A third of the messages is published; once 8 consumers are at work on it, a store
    host holding the open extent (3 replicas: every one) is SIGKILLed: the extent is
    sealed and the rest of each key goes to its successor. The group's read window is
    kept small (200), so the sealed extent is read bit by bit beside its successor."""
    config = tmp_path / "node.json"
    config.write_text(json.dumps({"timing": {"read_ahead": 200}}))
    server = ServerProcess(tmp_path / "node", extra=["--config", str(config)]).start()
    try:
        async with AsyncClient(server.url, timeout=30) as client:
            await _publish_and_consume_across_a_store_kill(server, client)
    finally:
        server.stop()


async def _publish_and_consume_across_a_store_kill(
    server: ServerProcess, client: AsyncClient
) -> None:
    queue, group = unique("q"), unique("g")
    await client.create_queue(queue, replicas=3)
    await client.create_group(queue, group, visibility_timeout_seconds=5)
    keys, per_key = [f"k{i}" for i in range(30)], 100
    check = KeyOrder()
    total = len(keys) * per_key
    extents_of: dict[str, list[str]] = {k: [] for k in keys}
    deadline = time.monotonic() + 120

    def done() -> bool:
        return check.total_acked() >= total or time.monotonic() > deadline

    async def publish(rounds: range) -> None:
        """Rounds of one message per key, each answered before the next (a round that
        fails while the store host is down is sent again: at-least-once)."""
        for n in rounds:
            batch = [OutgoingMessage(f"{k}/{n}", key=k) for k in keys]
            while True:
                try:
                    ids = await client.publish(queue, batch)
                    break
                except CheramiError:
                    check.errors += 1
                    await asyncio.sleep(0.2)
            for k, msg_id in zip(keys, ids, strict=True):
                extent = msg_id.rsplit(":", 1)[0]
                if extent not in extents_of[k]:
                    extents_of[k].append(extent)

    async def kill_and_publish() -> None:
        while not check.deliveries:  # consumers at work on the backlog
            await asyncio.sleep(0.01)
        os.kill(_store_pid(server, 1), signal.SIGKILL)
        await publish(range(per_key // 3, per_key))

    await publish(range(per_key // 3))
    await asyncio.gather(kill_and_publish(), _consume(client, queue, group, check, done))
    moved = sum(len(e) > 1 for e in extents_of.values())
    print(f"\nkill of a store host: {moved} of {len(keys)} keys moved extent, "
          f"{check.deliveries} deliveries, {check.nacks} nacks, "
          f"{check.errors} failed calls")  # fmt: skip
    assert moved == len(keys)  # every key went on in the sealed extent's successor
    assert check.overlaps == [], check.overlaps[:5]
    assert check.span_overlaps() == [], check.span_overlaps()[:5]
    for k in keys:
        acked = check.acked.get(k)
        assert acked == [f"{k}/{n}" for n in range(per_key)], (k, acked)
