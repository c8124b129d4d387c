"""Parked messages on a real node: a held or delayed message does not stop the messages
after it, a delivery count survives SIGKILL (the max_delivery_count bound holds), a
message ready again when the node dies is not counted as delivered, and a nack delay
survives a restart."""

from __future__ import annotations

import asyncio
import time

from cherami.client.asyncclient import AsyncClient
from cherami.client.models import Received
from tests.support.server import ServerProcess, unique

TOTAL = 50_000


async def _receive_one(client: AsyncClient, queue: str, group: str, **kw: float) -> Received:
    (got,) = await client.receive(queue, group, max_messages=1, wait_seconds=5, **kw)
    return got


async def test_a_held_and_two_delayed_messages_do_not_stop_the_rest(
    client: AsyncClient,
) -> None:
    queue, group = unique("q"), unique("g")
    await client.create_queue(queue)
    await client.create_group(queue, group, visibility_timeout_seconds=3600)
    await client.publish(queue, ["nacked-on-stream"])
    async with client.consumer(queue, group, credit=1) as stream:
        first = await stream.get(timeout=5)
        assert first is not None and first.text == "nacked-on-stream"
        await stream.nack(first, delay_seconds=3600)
        await stream.flush()
    await client.publish(queue, ["nacked-over-http"])
    second = await _receive_one(client, queue, group)
    assert second.text == "nacked-over-http"
    await client.nack(queue, group, [second.receipt or ""], delay_seconds=3600)
    await client.publish(queue, ["held"])
    held = await _receive_one(client, queue, group)  # never acked, visible again in 1 h
    assert held.text == "held"

    async with client.publisher(queue) as pub:
        for start in range(0, TOTAL, 1000):
            await pub.send([f"m{i}" for i in range(start, start + 1000)])
        await pub.flush()
    got: set[str] = set()
    deadline = time.monotonic() + 60
    async with client.consumer(queue, group, credit=2000) as stream:
        while len(got) < TOTAL and time.monotonic() < deadline:
            batch = await stream.get_batch(1000, timeout=1)
            got.update(m.text for m in batch)
            stream.ack(*batch)
        await stream.flush()
    assert len(got) == TOTAL, f"{TOTAL - len(got)} of {TOTAL} not delivered in 60 s"
    assert got == {f"m{i}" for i in range(TOTAL)}  # and none of the three came back


async def _nack_and_kill(
    server: ServerProcess, queue: str, group: str, counts: list[int], kill_in_flight: bool
) -> None:
    """Take the next delivery, if any comes; nack it (and let the nack land) unless the
    node is to die with it in flight; then SIGKILL the node and start it again."""
    async with AsyncClient(server.url, timeout=30) as client:
        got = await client.receive(queue, group, max_messages=1, wait_seconds=8)
        counts += [m.delivery_count for m in got]
        if got and not kill_in_flight:
            await client.nack(queue, group, [got[0].receipt or ""])
            await asyncio.sleep(0.5)  # the row is written in the next flush (50 ms)
    server.kill()
    server.start()


async def test_a_poison_message_gets_at_most_one_extra_delivery_across_four_kills(
    fresh_server: ServerProcess,
) -> None:
    server = fresh_server.start()
    queue, group = unique("q"), unique("g")
    async with AsyncClient(server.url) as client:
        await client.create_queue(queue)
        await client.create_group(queue, group, max_delivery_count=3)
        await client.publish(queue, ["poison"])
    counts: list[int] = []
    # the first kill catches the first delivery in flight (no row yet: the one extra)
    await _nack_and_kill(server, queue, group, counts, kill_in_flight=True)
    for _ in range(3):
        await _nack_and_kill(server, queue, group, counts, kill_in_flight=False)
    async with AsyncClient(server.url) as client:
        deadline = time.monotonic() + 20
        dead: list[dict[str, object]] = []
        while not dead and time.monotonic() < deadline:
            got = await client.receive(queue, group, max_messages=1, wait_seconds=1)
            counts += [m.delivery_count for m in got]
            if got:
                await client.nack(queue, group, [m.receipt or "" for m in got])
            dead = (await client.dlq(queue, group))["messages"]
        assert 3 <= len(counts) <= 4, f"deliveries counted {counts}"
        assert [m["body"] for m in dead] == ["poison"]
        assert await client.receive(queue, group, max_messages=1, wait_seconds=1) == []


async def _receive_both(client: AsyncClient, queue: str, group: str) -> list[Received]:
    """One delivery each of the two messages (in whatever order they come)."""
    got: dict[str, Received] = {}
    deadline = time.monotonic() + 30
    while len(got) < 2 and time.monotonic() < deadline:
        for m in await client.receive(queue, group, max_messages=2, wait_seconds=5):
            assert m.text not in got, f"{m.text} delivered twice at once"
            got[m.text] = m
    assert len(got) == 2, f"only {sorted(got)} came in 30 s"
    return list(got.values())


async def test_a_poison_message_reaches_a_consumer_max_times_across_a_kill_while_ready(
    fresh_server: ServerProcess,
) -> None:
    """Two poison messages (every delivery nacked), max_delivery_count 3. Both are nacked
    in one request, so they are due together and made ready together: taking one of them
    (and nacking it) shows the other is ready too, and the node is SIGKILLed then, with no
    delivery in flight. A delivery is counted only once a consumer is handed it, so each
    message reaches the consumer exactly 3 times, with counts 1, 2, 3, before the DLQ
    (counted when made ready, the ready one came back at 3 and went to the DLQ after 2)."""
    server = fresh_server.start()
    queue, group = unique("q"), unique("g")
    seen: dict[str, list[int]] = {"a": [], "b": []}

    def note(got: list[Received]) -> list[str]:
        for m in got:
            seen[m.text].append(m.delivery_count)
        return [m.receipt or "" for m in got]

    async with AsyncClient(server.url, timeout=30) as client:
        await client.create_queue(queue)
        await client.create_group(queue, group, max_delivery_count=3)
        await client.publish(queue, ["a", "b"])
        await client.nack(queue, group, note(await _receive_both(client, queue, group)))
        one = await client.receive(queue, group, max_messages=1, wait_seconds=5)
        assert len(one) == 1
        await client.nack(queue, group, note(one))  # answered once its row is written
    server.kill()
    server.start()
    async with AsyncClient(server.url, timeout=30) as client:
        await client.nack(queue, group, note(await _receive_both(client, queue, group)))
        dead: list[dict[str, object]] = []
        deadline = time.monotonic() + 30
        while len(dead) < 2 and time.monotonic() < deadline:
            got = await client.receive(queue, group, max_messages=2, wait_seconds=1)
            if got:
                await client.nack(queue, group, note(got))
            dead = (await client.dlq(queue, group))["messages"]
        assert sorted(str(m["body"]) for m in dead) == ["a", "b"], f"DLQ {dead}"
        assert seen == {"a": [1, 2, 3], "b": [1, 2, 3]}, f"deliveries seen {seen}"
        assert await client.receive(queue, group, max_messages=2, wait_seconds=1) == []


async def test_a_nack_delay_survives_a_restart(fresh_server: ServerProcess) -> None:
    server = fresh_server.start()
    queue, group = unique("q"), unique("g")
    async with AsyncClient(server.url) as client:
        await client.create_queue(queue)
        await client.create_group(queue, group)
        await client.publish(queue, ["later"])
        first = await _receive_one(client, queue, group)
        nacked_at = time.time()
        # long enough to outlast the kill and the restart (about 2 s here)
        await client.nack(queue, group, [first.receipt or ""], delay_seconds=10)
        # (a nack is answered once its row is written: nothing to wait for before the kill)
    server.kill()
    server.start()
    async with AsyncClient(server.url) as client:
        got: list[Received] = []
        while not got and time.time() < nacked_at + 40:
            got = await client.receive(queue, group, max_messages=1, wait_seconds=5)
        assert got, "the delayed message never came back:\n" + "\n".join(server.output)
        assert time.time() >= nacked_at + 10 - 0.05  # not before its due time
        assert got[0].text == "later" and got[0].delivery_count == 2
