"""A receive whose caller left before the answer gives back what it took (the caller is a
client that gave up on its long poll, or a frontend whose forward timed out): the next
receive gets those messages at once, not after their visibility timeout (60 s by
default), with the delivery counted."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import aiohttp
import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.devcluster.local import LocalCluster
from tests.support.pgcluster import cluster_fixture

DEADLINE = 30.0
COUNTS = {"storehost": 1, "controller": 1, "inputhost": 1, "outputhost": 1, "frontend": 1}


@pytest.fixture(scope="module")
def small_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A frontend that forwards receives to the output host, each a process of its own."""
    yield from cluster_fixture(tmp_path_factory, "caller-gone", COUNTS)


async def _stats(client: AsyncClient, q: str, g: str) -> dict[str, int]:
    return (await client.get_group(q, g))["stats"]  # type: ignore[no-any-return]


async def _wait_for(what: str, check: object, deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while not await check():  # type: ignore[operator]
        assert time.monotonic() < end, f"not within {deadline:.0f} s: {what}"
        await asyncio.sleep(0.05)


async def _receives_waiting(url: str) -> float:
    """The process's ``cherami_waiting_receive_requests`` gauge (its /metrics)."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    found = re.search(r"^cherami_waiting_receive_requests (\S+)$", text, re.M)
    assert found, "no cherami_waiting_receive_requests in /metrics"
    return float(found.group(1))


async def _abandoned_receive(url: str, q: str, g: str) -> None:
    """Ask for a long-polled receive on a raw connection, and close it unread once the
    receive waits (its handler goes on: aiohttp does not cancel it)."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    body = json.dumps({"max_messages": 10, "wait_seconds": 20}).encode()
    writer.write(
        f"POST /v1/queues/{q}/groups/{g}/receive HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()

    async def waits() -> bool:
        return await _receives_waiting(url) >= 1

    await _wait_for("the receive waits", waits)
    writer.close()
    await writer.wait_closed()


async def _given_back(url: str) -> None:
    q, g = f"gone-{uuid.uuid4().hex[:8]}", "g"
    async with AsyncClient(url) as client:
        await client.create_queue(q)
        await client.create_group(q, g)
        await _abandoned_receive(url, q, g)  # its handler long-polls for a caller gone
        await client.publish(q, ["lost in transit?"])

        async def taken() -> bool:  # by the abandoned receive: nobody else asked
            return (await _stats(client, q, g))["delivered"] >= 1

        await _wait_for("the abandoned receive takes the message", taken)
        # the visibility timeout is 60 s: only a message given back comes in this wait
        got = await client.receive(q, g, max_messages=10, wait_seconds=10)
        assert [m.text for m in got] == ["lost in transit?"]
        assert got[0].delivery_count == 2
        await client.ack(q, g, got)
        stats = await _stats(client, q, g)
        assert (stats["delivered"], stats["redelivered"], stats["in_flight"]) == (2, 1, 0)


async def test_a_node_gives_back_what_a_receive_took_for_a_caller_gone(server) -> None:  # type: ignore[no-untyped-def]
    await _given_back(server.url)


async def test_a_cluster_gives_back_what_a_routed_receive_took(
    small_cluster: LocalCluster,
) -> None:
    """Through a frontend that forwards to the output host holding the group: the
    frontend sees its caller gone and nacks the answer's receipts at that host."""
    await _given_back(small_cluster.url)
