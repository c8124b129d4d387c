"""Publishes deduplicated by ``dedup_id``: over HTTP and streams, within one batch, off when
the queue's window is 0, and after the input host dies (the new one rebuilds its window
from the stored records)."""

from __future__ import annotations

import asyncio

import httpx

from cherami.client.asyncclient import AsyncClient
from cherami.client.models import OutgoingMessage
from tests.support.server import ServerProcess, unique


async def stored(client: AsyncClient, queue: str) -> int:
    return int((await client.get_queue(queue))["stats"]["messages_published"])


async def test_a_repeated_dedup_id_is_stored_once(
    client: AsyncClient, server: ServerProcess
) -> None:
    queue = unique()
    await client.create_queue(queue)
    first = await client.publish(
        queue, [OutgoingMessage(f"m{i}", dedup_id=f"d{i}") for i in range(5)]
    )
    # again, with one new id, a repeat inside the batch and a message without an id
    again = await client.publish(queue, [
        OutgoingMessage("m0", dedup_id="d0"), OutgoingMessage("m5", dedup_id="d5"),
        OutgoingMessage("m5", dedup_id="d5"), OutgoingMessage("plain"),
        OutgoingMessage("later", delay_seconds=60, dedup_id="d4"),
    ])  # fmt: skip
    assert again[0] == first[0] and again[1] == again[2] and again[4] == first[4]
    assert len(set(again)) == 4
    assert await stored(client, queue) == 7

    # streams: the same ids through the streaming publisher
    async with client.publisher(queue) as publisher:
        ids = await (await publisher.send([OutgoingMessage("m1", dedup_id="d1"),
                                           OutgoingMessage("m6", dedup_id="d6")]))  # fmt: skip
    assert ids[0] == first[1]
    # at the same moment: stored once
    both = await asyncio.gather(*(client.publish(queue, [OutgoingMessage("x", dedup_id="dx")])
                                  for _ in range(4)))  # fmt: skip
    assert len({tuple(b) for b in both}) == 1
    assert await stored(client, queue) == 9

    reply = httpx.post(f"{server.url}/v1/queues/{queue}/messages",
                       json={"messages": [{"body": "a", "dedup_id": ""}]})  # fmt: skip
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "invalid_request"
    reply = httpx.post(f"{server.url}/v1/queues/{queue}/messages",
                       json={"messages": [{"body": "a", "dedup_id": "d2"}]})  # fmt: skip
    assert reply.json()["ids"] == [first[2]]


async def test_a_window_of_0_turns_it_off(client: AsyncClient) -> None:
    queue = unique()
    await client.create_queue(queue, dedup_window_seconds=0)
    for _ in range(2):
        await client.publish(queue, [OutgoingMessage("m", dedup_id="same")])
    assert await stored(client, queue) == 2


async def test_the_window_survives_the_input_host(fresh_server: ServerProcess) -> None:
    queue = unique()
    fresh_server.start()
    async with AsyncClient(fresh_server.url) as client:
        await client.create_queue(queue, min_extents=2)
        first = await client.publish(queue, [OutgoingMessage(f"m{i}", dedup_id=f"d{i}")
                                             for i in range(300)])  # fmt: skip
    fresh_server.kill()  # kill -9: the input host and its window are gone
    fresh_server.start()
    async with AsyncClient(fresh_server.url) as client:
        again = await client.publish(queue, [OutgoingMessage(f"m{i}", dedup_id=f"d{i}")
                                             for i in range(300, -1, -1)])  # fmt: skip
        assert again[1:] == first[::-1], "the repeats answer the ids stored the first time"
        assert await stored(client, queue) == 301
