"""Streams never outlive what they were opened for: the close codes a client sees when
its queue or group is deleted or the server stops (docs/protocol.md §4.2), at the frame
level and through the Python client."""

from __future__ import annotations

import asyncio
import signal

import aiohttp
import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.errors import NotFound, QueueNotFound
from cherami.wire import close
from cherami.wire import stream as f
from tests.support.server import ServerProcess, unique


def _ws(server: ServerProcess, path: str) -> str:
    return server.url.replace("http", "ws") + path


async def _queue_with_group(client: AsyncClient) -> str:
    q = unique()
    await client.create_queue(q)
    await client.create_group(q, "g")
    return q


async def _closed_with(ws: aiohttp.ClientWebSocketResponse, timeout: float = 10) -> int | None:
    """Read until the server closes; the close code its close frame carried (None: the
    connection ended without one)."""
    async with asyncio.timeout(timeout):
        while True:
            msg = await ws.receive()
            if msg.type == aiohttp.WSMsgType.CLOSE:
                return int(msg.data)
            if msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                return None


async def test_deleting_a_queue_closes_its_streams_with_4004(
    server: ServerProcess, client: AsyncClient
) -> None:
    q = await _queue_with_group(client)
    async with aiohttp.ClientSession() as s:
        pub = await s.ws_connect(_ws(server, f"/v1/queues/{q}/publish"))
        con = await s.ws_connect(_ws(server, f"/v1/queues/{q}/groups/g/consume"))
        await con.send_bytes(f.encode(f.Credit(10)))
        await pub.send_bytes(f.encode(f.Publish(1, [f.OutMessage(b"before")])))
        reply = f.decode_server((await pub.receive(timeout=5)).data)
        assert isinstance(reply, f.Published)
        await client.delete_queue(q)
        assert await _closed_with(con) == close.DELETED
        assert await _closed_with(pub) == close.DELETED
    # the name made again is another queue: the old stream wrote nothing into it
    await client.create_queue(q)
    await client.create_group(q, "g")
    assert (await client.get_queue(q))["stats"]["messages_published"] == 0


async def test_deleting_a_group_closes_its_consume_streams_with_4004(
    server: ServerProcess, client: AsyncClient
) -> None:
    q = await _queue_with_group(client)
    async with aiohttp.ClientSession() as s:
        con = await s.ws_connect(_ws(server, f"/v1/queues/{q}/groups/g/consume"))
        await con.send_bytes(f.encode(f.Credit(10)))
        await client.delete_group(q, "g")
        assert await _closed_with(con) == close.DELETED


async def test_the_python_client_stops_on_a_deleted_queue(
    server: ServerProcess, client: AsyncClient
) -> None:
    q = await _queue_with_group(client)
    async with client.publisher(q) as pub, client.consumer(q, "g") as con:
        await pub.publish(["one"])
        first = await con.get(timeout=5)
        assert first is not None and first.text == "one"
        await client.delete_queue(q)
        with pytest.raises(NotFound):
            await asyncio.wait_for(con.get(), timeout=10)
        await client.create_queue(q)  # a new queue of the same name
        with pytest.raises(QueueNotFound):
            await asyncio.wait_for(pub.publish(["after"]), timeout=10)
    assert (await client.get_queue(q))["stats"]["messages_published"] == 0


async def test_sigterm_sends_every_stream_a_going_away_close(fresh_server: ServerProcess) -> None:
    fresh_server.start()
    async with AsyncClient(fresh_server.url) as client:
        q = await _queue_with_group(client)
    async with aiohttp.ClientSession() as s:
        pub = await s.ws_connect(_ws(fresh_server, f"/v1/queues/{q}/publish"))
        con = await s.ws_connect(_ws(fresh_server, f"/v1/queues/{q}/groups/g/consume"))
        await con.send_bytes(f.encode(f.Credit(10)))
        await asyncio.sleep(0.2)
        assert fresh_server.proc is not None
        fresh_server.proc.send_signal(signal.SIGTERM)
        assert await _closed_with(con) == close.GOING_AWAY
        assert await _closed_with(pub) == close.GOING_AWAY
