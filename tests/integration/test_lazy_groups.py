"""A node loads a group when it is consumed and unloads it when it is left idle (issue
29; roles/outputhost/idlegroups.py), and nothing a group does changes for it: a real
node process with ``timing.group_idle_unload`` 0.5 s (the sweep looks every 0.5 s).

What is waited for is the node's own gauge of loaded groups
(``cherami_output_loaded_groups``), polled with a deadline. Before the change a group
was loaded at its creation and stayed loaded: the first wait for 0 loaded groups fails."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.client.models import OutgoingMessage
from tests.support.server import ServerProcess, unique

pytestmark = pytest.mark.timeout(180)

LOADED = re.compile(r"^cherami_output_loaded_groups (\S+)$", re.MULTILINE)
WAIT = 30.0  # a condition waited for this long at most


@pytest.fixture
def node(tmp_path: Path) -> Iterator[ServerProcess]:
    config = tmp_path / "node.json"
    config.write_text(json.dumps({"timing": {"group_idle_unload": 0.5}}))
    proc = ServerProcess(tmp_path / "node", 1, ["--config", str(config)]).start()
    try:
        yield proc
    finally:
        proc.stop()


async def loaded(client: AsyncClient) -> int:
    async with client.session.get(client.url + "/metrics") as resp:
        text = await resp.text()
    match = LOADED.search(text)
    assert match, "no cherami_output_loaded_groups in /metrics"
    return int(float(match.group(1)))


async def until_loaded(client: AsyncClient, n: int) -> None:
    deadline = time.monotonic() + WAIT
    while (now := await loaded(client)) != n:
        assert time.monotonic() < deadline, f"{now} groups loaded, not {n}, after {WAIT} s"
        await asyncio.sleep(0.1)  # polling the node's gauge, with a deadline


async def stats(client: AsyncClient, queue: str, group: str) -> dict[str, float]:
    return (await client.get_group(queue, group))["stats"]  # type: ignore[no-any-return]


async def test_an_idle_group_is_unloaded_and_loses_nothing(node: ServerProcess) -> None:
    async with AsyncClient(node.url, timeout=30) as c:
        queue = unique("q")
        await c.create_queue(queue)
        await c.create_group(queue, "g", visibility_timeout_seconds=1, max_delivery_count=5)
        await c.create_group(queue, "other")
        await c.publish(queue, ["a", "b", "c"])
        assert await loaded(c) == 0  # made and published to: nothing loads it
        s = await stats(c, queue, "g")  # from the metadata and the store hosts
        assert (s["backlog"], s["in_flight"]) == (3, 0)

        # a receive loads it; what is left in flight is delivered again after its
        # visibility timeout, however long the group is left alone meanwhile
        got = await c.receive(queue, "g", max_messages=3, wait_seconds=5)
        assert sorted(m.text for m in got) == ["a", "b", "c"]
        assert await loaded(c) == 1
        await c.ack(queue, "g", [m for m in got if m.text == "a"])
        again = await c.receive(queue, "g", max_messages=3, wait_seconds=10)
        assert sorted(m.text for m in again) == ["b", "c"]
        assert all(m.delivery_count == 2 for m in again)

        # nacked with a delay: parked, it keeps the group loaded and comes back
        await c.nack(queue, "g", [m for m in again if m.text == "b"], delay_seconds=1)
        await c.ack(queue, "g", [m for m in again if m.text == "c"])
        back = await c.receive(queue, "g", max_messages=3, wait_seconds=10)
        assert [m.text for m in back] == ["b"]
        await c.ack(queue, "g", back)

        # left alone with everything acked: unloaded; nothing acked comes back
        await until_loaded(c, 0)
        s = await stats(c, queue, "g")
        assert (s["backlog"], s["in_flight"]) == (0, 0)
        assert (s["delivered"], s["acked"], s["redelivered"]) == (6, 3, 3)  # kept
        assert await c.receive(queue, "g", max_messages=3, wait_seconds=0.5) == []
        await until_loaded(c, 0)

        # a delayed message published to an unloaded group is delivered when due
        await c.publish(queue, [OutgoingMessage("later", delay_seconds=1)])
        assert (await stats(c, queue, "g"))["backlog"] == 1
        got = await c.receive(queue, "g", max_messages=3, wait_seconds=10)
        assert [m.text for m in got] == ["later"]
        await c.ack(queue, "g", got)

        # the other group, never consumed, never loaded: its stats are right
        s = await stats(c, queue, "other")
        assert (s["backlog"], s["delivered"]) == (4, 0)
        assert s["oldest_unacked_age_seconds"] > 0  # "a" 's, read from a store host
        assert await loaded(c) == 1


async def test_an_unloaded_group_keeps_what_a_stream_left_and_the_ack_levels(
    node: ServerProcess,
) -> None:
    """A stream acks half and closes holding the rest: those are delivered again after
    the group was unloaded, the acked ones never (their ack levels were written before
    the unload); a restart after the unload changes nothing."""
    async with AsyncClient(node.url, timeout=30) as c:
        queue = unique("q")
        await c.create_queue(queue)
        await c.create_group(queue, "g")
        await c.publish(queue, [f"m{i}" for i in range(10)])
        async with c.consumer(queue, "g") as consumer:
            held = [await consumer.get(timeout=10) for _ in range(10)]
            assert all(m is not None for m in held)
            for msg in held[:5]:
                assert msg is not None
                await consumer.ack(msg)
            await consumer.flush()
        # what the stream held is parked (due at once): delivered again, to a receive
        got = await c.receive(queue, "g", max_messages=10, wait_seconds=10)
        assert sorted(m.text for m in got) == [f"m{i}" for i in range(5, 10)]
        await c.ack(queue, "g", got)
        await until_loaded(c, 0)
    node.stop()
    node.start()
    async with AsyncClient(node.url, timeout=30) as c:
        assert await loaded(c) == 0  # nothing parked: nothing loaded at the start
        assert (await stats(c, queue, "g"))["backlog"] == 0
        assert await c.receive(queue, "g", max_messages=10, wait_seconds=0.5) == []


CALLS = re.compile(r'^cherami_metadata_call_latency_seconds_count\{op="([^"]+)"\} (\S+)$', re.M)


async def metadata_calls(client: AsyncClient) -> dict[str, float]:
    """The node's metadata calls so far, by operation (a scrape: the unloaded groups'
    stats are worked out for it)."""
    async with client.session.get(client.url + "/metrics") as resp:
        return {op: float(n) for op, n in CALLS.findall(await resp.text())}


async def until_calls(client: AsyncClient, op: str, more: float) -> None:
    """Until the node made ``more`` calls of ``op`` than now."""
    start = (await metadata_calls(client)).get(op, 0.0)
    deadline = time.monotonic() + WAIT
    while (await metadata_calls(client)).get(op, 0.0) < start + more:
        assert time.monotonic() < deadline, f"fewer than {more} {op} calls in {WAIT} s"
        await asyncio.sleep(0.1)  # polling the node's counter, with a deadline


async def test_unloaded_groups_ack_levels_are_kept_and_read_in_bulk(tmp_path: Path) -> None:
    """The stats of unloaded groups come from their kept ack levels. After any write to
    their queues (a change of a queue's settings, an extent opened) every group's levels
    were forgotten and read again one group at a time at the next scrape (20,000 reads
    after making 10,000 queues): now they are kept until a merge of the group's DLQ
    changes them, and read in one statement for all groups when many are unknown (after
    a restart)."""
    config = tmp_path / "node.json"
    config.write_text(
        json.dumps({"timing": {"group_idle_unload": 0.5, "extent_refresh_interval": 0.1}})
    )
    node = ServerProcess(tmp_path / "node", 1, ["--config", str(config)]).start()
    try:
        async with AsyncClient(node.url, timeout=30) as c:
            queues = [unique("q") for _ in range(24)]
            for queue in queues:
                await c.create_queue(queue)
                await c.create_group(queue, "g", max_delivery_count=1)
                await c.publish(queue, ["a"])
            first = queues[0]
            got = await c.receive(first, "g", wait_seconds=20)
            assert [m.text for m in got] == ["a"]
            await c.ack(first, "g", got)
            await until_loaded(c, 0)
            await metadata_calls(c)  # a scrape works the unloaded groups' stats out
            before = await metadata_calls(c)
            for queue in queues:  # every queue written: their levels stay as they are
                await c.update_queue(queue, retention_seconds=3600)
            await until_calls(c, "changes_since", 10)  # the output host saw the writes
            await metadata_calls(c)
            after = await metadata_calls(c)
            assert after.get("get_ack_levels") == before.get("get_ack_levels")
            assert [(await stats(c, q, "g"))["backlog"] for q in queues[:2]] == [0, 1]

        node.stop()  # a new process knows no levels: one read of them all
        node.start()
        async with AsyncClient(node.url, timeout=30) as c:
            await metadata_calls(c)
            calls = await metadata_calls(c)
            assert calls.get("list_every_ack_level") == 1
            assert calls.get("get_ack_levels", 0) < len(queues) / 2, calls  # not one a group
            assert [(await stats(c, q, "g"))["backlog"] for q in queues[:2]] == [0, 1]

            # a merge of its DLQ writes the group's levels: read again, the merged
            # message counted in its backlog
            await c.publish(first, ["b"])
            got = await c.receive(first, "g", wait_seconds=20)
            assert [m.text for m in got] == ["b"]
            await c.nack(first, "g", got)  # to the DLQ: max_delivery_count 1
            await until_loaded(c, 0)
            assert (await stats(c, first, "g"))["backlog"] == 0
            assert await c.dlq_merge(first, "g") == 1
            deadline = time.monotonic() + WAIT
            while (await stats(c, first, "g"))["backlog"] != 1:
                assert time.monotonic() < deadline, "the merged message is not in the backlog"
                await asyncio.sleep(0.1)  # polling the group's stats, with a deadline
            got = await c.receive(first, "g", max_messages=2, wait_seconds=5)
            assert [m.text for m in got] == ["b"]
    finally:
        node.stop()
