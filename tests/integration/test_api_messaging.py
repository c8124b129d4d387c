"""Publishing, receiving and settling over the connectionless HTTP API, on a real node."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import sqlite3
import time
from datetime import UTC, datetime

import httpx
import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.client.models import OutgoingMessage
from cherami.errors import InvalidRequest, MessageTooLarge
from tests.support.server import ServerProcess, unique


async def _setup(client: AsyncClient, *groups: str, **group_config: float) -> str:
    q = unique()
    await client.create_queue(q)
    for g in groups:
        await client.create_group(q, g, **group_config)
    return q


async def _drain(
    client: AsyncClient, q: str, g: str, expect: int, timeout: float = 20
) -> list[str]:
    bodies: list[str] = []
    deadline = time.monotonic() + timeout
    while len(bodies) < expect and time.monotonic() < deadline:
        got = await client.receive(q, g, max_messages=100, wait_seconds=1)
        if got:
            bodies += [m.text for m in got]
            await client.ack(q, g, [m.receipt for m in got if m.receipt])
    return bodies


async def test_every_group_gets_every_message(client: AsyncClient) -> None:
    q = await _setup(client, "a", "b")
    sent = [f"m{i}" for i in range(300)]
    ids = await client.publish(q, sent)
    assert len(ids) == len(set(ids)) == 300
    for g in ("a", "b"):
        assert sorted(await _drain(client, q, g, 300)) == sorted(sent)
        stats = (await client.get_group(q, g))["stats"]
        assert stats["backlog"] == 0 and stats["acked"] == 300 and stats["in_flight"] == 0


async def test_competing_consumers_get_disjoint_sets(client: AsyncClient) -> None:
    q = await _setup(client, "g")
    await client.publish(q, [f"m{i}" for i in range(400)])
    seen: list[list[str]] = [[], []]

    async def consume(k: int) -> None:
        while True:
            got = await client.receive(q, "g", max_messages=7, wait_seconds=1)
            if not got:
                return
            seen[k] += [m.text for m in got]
            await client.ack(q, "g", [m.receipt for m in got if m.receipt])

    await asyncio.gather(consume(0), consume(1))
    assert set(seen[0]).isdisjoint(seen[1])
    assert sorted(seen[0] + seen[1]) == sorted(f"m{i}" for i in range(400))
    assert seen[0] and seen[1]


async def test_forged_receipts_are_stale(client: AsyncClient) -> None:
    q = await _setup(client, "g", "other")
    await client.publish(q, ["x"])
    (m,) = await client.receive(q, "g", wait_seconds=5)
    assert m.receipt
    signed, index = m.receipt.split("~")
    forged = signed[:-3] + ("AAA" if not signed.endswith("AAA") else "BBB") + "~" + index
    beyond = signed + "~1"  # a place past what its receive delivered
    for bad in [forged, beyond, "garbage", "x" * 64]:
        assert (await client.ack(q, "g", [bad])) == {"acked": 0, "stale": [bad]}
    for too_long in ["x" * 65, "x" * 100_000, ""]:  # not echoed back: refused whole
        with pytest.raises(InvalidRequest):
            await client.ack(q, "g", [m.receipt, too_long])
    assert (await client.ack(q, "other", [m.receipt]))["stale"] == [m.receipt]
    # the same receipt twice in one request: the first settles, the repeat is reported
    assert await client.ack(q, "g", [m.receipt, m.receipt]) == {
        "acked": 1, "stale": [m.receipt],
    }  # fmt: skip


async def test_nack_with_delay(client: AsyncClient) -> None:
    q = await _setup(client, "g")
    await client.publish(q, ["x"])
    (m,) = await client.receive(q, "g", wait_seconds=5)
    t0 = time.monotonic()
    assert (await client.nack(q, "g", [m.receipt or ""], delay_seconds=1.0))["nacked"] == 1
    assert await client.receive(q, "g", wait_seconds=0.5) == []
    (again,) = await client.receive(q, "g", wait_seconds=5)
    assert time.monotonic() - t0 >= 1.0
    assert again.id == m.id and again.delivery_count == 2
    assert (await client.nack(q, "g", [m.receipt or ""]))["stale"] == [m.receipt]
    assert (await client.nack(q, "g", [again.receipt or ""]))["nacked"] == 1
    (third,) = await client.receive(q, "g", wait_seconds=5)
    assert third.delivery_count == 3


async def test_poison_message_goes_to_dlq_and_group_goes_on(client: AsyncClient) -> None:
    q = await _setup(client, "g", visibility_timeout_seconds=0.3, max_delivery_count=2)
    await client.publish(q, [OutgoingMessage("poison", {"kind": "bad"})])
    await client.publish(q, ["ok"])
    delivered: list[tuple[str, int]] = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        got = await client.receive(q, "g", max_messages=10, wait_seconds=0.5)
        for m in got:
            delivered.append((m.text, m.delivery_count))
            if m.text == "ok":
                await client.ack(q, "g", [m.receipt or ""])
        dlq = await client.dlq(q, "g")
        if dlq["depth"] == 1:
            break
    assert ("ok", 1) in delivered
    assert [c for t, c in delivered if t == "poison"] == [1, 2]
    dlq = await client.dlq(q, "g")
    assert dlq["depth"] == 1
    (dead,) = dlq["messages"]
    assert dead["body"] == "poison" and dead["attributes"] == {"kind": "bad"}
    stats = (await client.get_group(q, "g"))["stats"]
    assert stats["dlq_depth"] == 1 and stats["backlog"] == 0


def _open_extents(server: ServerProcess, queue: str) -> tuple[int, dict[str, int]]:
    """Open extents of the queue, and of each of its groups' dead-letter queues, as the
    node's metadata database holds them (read-only, beside the running node)."""
    path = f"file:{server.data_dir}/metadata.db?mode=ro"
    with contextlib.closing(sqlite3.connect(path, uri=True)) as db:
        mine = db.execute(
            "SELECT count(*) FROM extents WHERE queue = ? AND status = 'open'", (queue,)
        ).fetchone()[0]
        dlqs = db.execute(
            "SELECT g.name, (SELECT count(*) FROM extents e WHERE e.queue = g.dlq "
            "AND e.status = 'open') FROM groups g WHERE g.queue = ?",
            (queue,),
        ).fetchall()
    return int(mine), {str(name): int(n) for name, n in dlqs}


async def test_a_dead_letter_queue_opens_an_extent_at_its_first_dead_letter(
    client: AsyncClient, server: ServerProcess
) -> None:
    """A group's dead-letter queue held a plain and a timer extent from the group's
    creation (3 replicas each): 2 groups tripled a queue's extents, most of them never
    written. It now holds none until the first message is moved there, then one plain
    extent (no timer extent: nothing delayed is published to a dead-letter queue)."""
    q = await _setup(client, "g", "idle", visibility_timeout_seconds=0.3, max_delivery_count=1)
    await client.publish(q, ["first"])
    assert _open_extents(server, q) == (1, {"g": 0, "idle": 0})  # a plain one
    await _poison(client, q, "g", 1)
    assert _open_extents(server, q) == (1, {"g": 1, "idle": 0})
    (dead,) = (await client.dlq(q, "g"))["messages"]
    assert dead["body"] == "first"
    assert (await client.dlq(q, "idle"))["depth"] == 0
    assert await _drain(client, q, "idle", 1) == ["first"]
    assert await client.dlq_merge(q, "g") == 1
    assert await _drain(client, q, "g", 1) == ["first"]


async def test_a_queue_opens_its_timer_extent_at_its_first_delayed_message(
    client: AsyncClient, server: ServerProcess
) -> None:
    """Every queue held a timer extent (3 replicas) from its creation, for delayed
    messages most queues never take: the output host tailed it for every group and the
    store hosts kept it. A queue now opens one when its first delayed message comes (the
    publish waits for it), and one made with a delay has it from the start."""
    q = await _setup(client, "g")
    await client.publish(q, ["now"])
    assert _open_extents(server, q) == (1, {"g": 0})
    await client.publish(q, [OutgoingMessage("later", delay_seconds=0.3)])
    assert _open_extents(server, q) == (2, {"g": 0})  # the timer extent beside the plain one
    # both are due by the drain on a loaded machine (0.3 s), from two extents: any order
    assert sorted(await _drain(client, q, "g", 2)) == ["later", "now"]
    delayed = unique()
    await client.create_queue(delayed, delay_seconds=0.2)
    assert _open_extents(server, delayed) == (2, {})


async def _poison(client: AsyncClient, q: str, g: str, n: int) -> None:
    deadline = time.monotonic() + 20
    while (await client.dlq(q, g))["depth"] < n and time.monotonic() < deadline:
        await client.receive(q, g, max_messages=100, wait_seconds=0.2)
    assert (await client.dlq(q, g))["depth"] == n


async def test_dlq_merge_goes_to_that_group_only(client: AsyncClient) -> None:
    q = await _setup(client, "g", "other", visibility_timeout_seconds=0.2, max_delivery_count=1)
    ids = await client.publish(q, ["p1", "p2", "p3"])
    await _poison(client, q, "g", 3)
    assert sorted(await _drain(client, q, "other", 3)) == ["p1", "p2", "p3"]
    assert await client.dlq_merge(q, "g") == 3
    assert (await client.dlq(q, "g"))["depth"] == 0
    got = await client.receive(q, "g", max_messages=10, wait_seconds=5)
    while len(got) < 3:
        got += await client.receive(q, "g", max_messages=10, wait_seconds=5)
    assert sorted(m.text for m in got) == ["p1", "p2", "p3"]
    assert sorted(m.id for m in got) == sorted(ids)  # ids survive the round trip
    await client.ack(q, "g", [m.receipt or "" for m in got])
    assert await client.receive(q, "other", wait_seconds=0.5) == []
    stats = (await client.get_group(q, "g"))["stats"]
    assert stats["backlog"] == 0 and stats["dlq_depth"] == 0


async def test_dlq_purge(client: AsyncClient) -> None:
    q = await _setup(client, "g", visibility_timeout_seconds=0.2, max_delivery_count=1)
    await client.publish(q, ["p1", "p2"])
    await _poison(client, q, "g", 2)
    assert await client.dlq_purge(q, "g") == 2
    assert (await client.dlq(q, "g")) == {"messages": [], "depth": 0}
    assert await client.dlq_merge(q, "g") == 0
    assert await client.dlq_purge(q, "g") == 0


async def test_delayed_messages_never_early(client: AsyncClient) -> None:
    q = await _setup(client, "g")
    t0 = time.time()
    await client.publish(q, [OutgoingMessage("later", delay_seconds=1.5), OutgoingMessage("now")])
    first = await client.receive(q, "g", max_messages=10, wait_seconds=5)
    assert [m.text for m in first] == ["now"]
    await client.ack(q, "g", [m.receipt or "" for m in first])
    (later,) = await client.receive(q, "g", wait_seconds=5)
    assert later.text == "later" and time.time() - t0 >= 1.5


async def test_delayed_messages_come_in_delivery_order(client: AsyncClient) -> None:
    q = await _setup(client, "g")
    await client.publish(q, [OutgoingMessage(f"d{d}", delay_seconds=d / 10) for d in (9, 3, 6)])
    got: list[str] = []
    while len(got) < 3:
        got += [m.text for m in await client.receive(q, "g", max_messages=10, wait_seconds=5)]
    assert got == ["d3", "d6", "d9"]


async def test_queue_default_delay_and_group_delay(client: AsyncClient) -> None:
    q = unique()
    await client.create_queue(q, delay_seconds=0.8)
    await client.create_group(q, "g")
    t0 = time.time()
    await client.publish(q, ["x"])
    assert (await client.receive(q, "g", wait_seconds=5))[0].text == "x"
    assert time.time() - t0 >= 0.8
    q2 = unique()
    await client.create_queue(q2)
    await client.create_group(q2, "slow", delay_seconds=0.8)
    await client.create_group(q2, "fast")
    t0 = time.time()
    await client.publish(q2, ["y"])
    assert (await client.receive(q2, "fast", wait_seconds=5))[0].text == "y"
    fast_at = time.time() - t0
    assert (await client.receive(q2, "slow", wait_seconds=5))[0].text == "y"
    assert time.time() - t0 >= 0.8 > fast_at


async def test_long_poll_answers_when_a_message_arrives(client: AsyncClient) -> None:
    q = await _setup(client, "g")
    t0 = time.monotonic()
    waiter = asyncio.create_task(client.receive(q, "g", wait_seconds=10))
    await asyncio.sleep(0.5)
    await client.publish(q, ["wake"])
    (m,) = await waiter
    elapsed = time.monotonic() - t0
    assert m.text == "wake" and 0.5 <= elapsed < 5
    t0 = time.monotonic()
    assert await client.receive(q, "g", wait_seconds=1) == []
    assert time.monotonic() - t0 >= 1


async def test_binary_bodies_round_trip(client: AsyncClient, server: ServerProcess) -> None:
    q = await _setup(client, "g")
    payload = bytes(range(256)) * 4
    await client.publish(q, [payload, "text é"])
    got = await client.receive(q, "g", max_messages=10, wait_seconds=5)
    while len(got) < 2:
        got += await client.receive(q, "g", max_messages=10, wait_seconds=5)
    by_body = {m.body: m for m in got}
    assert payload in by_body and "text é".encode() in by_body
    raw = httpx.post(f"{server.url}/v1/queues/{q}/groups/g/receive", json={"wait_seconds": 0})
    assert raw.status_code == 200
    await client.nack(q, "g", [m.receipt or "" for m in got])
    raw_msgs = httpx.post(
        f"{server.url}/v1/queues/{q}/groups/g/receive", json={"max_messages": 10, "wait_seconds": 5}
    ).json()["messages"]
    kinds = {("body_b64" in m) for m in raw_msgs}
    assert kinds == {True, False}
    b64 = next(m for m in raw_msgs if "body_b64" in m)
    assert base64.b64decode(b64["body_b64"]) == payload


async def test_oversized_message_is_413_and_nothing_stored(client: AsyncClient) -> None:
    q = unique()
    await client.create_queue(q, max_message_bytes=1000)
    await client.create_group(q, "g")
    with pytest.raises(MessageTooLarge):
        await client.publish(q, ["small", "x" * 1001])
    assert (await client.get_queue(q))["stats"]["messages_published"] == 0
    assert await client.receive(q, "g", wait_seconds=0.5) == []
    await client.publish(q, ["x" * 1000])
    assert (await client.get_queue(q))["stats"]["messages_published"] == 1


async def test_huge_request_body_is_413(server: ServerProcess) -> None:
    q = unique()
    httpx.put(f"{server.url}/v1/queues/{q}")
    big = b'{"messages": [{"body": "' + b"x" * (65 << 20) + b'"}]}'
    resp = httpx.post(f"{server.url}/v1/queues/{q}/messages", content=big, timeout=60)
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "message_too_large"


async def test_start_from_latest_skips_older_messages(client: AsyncClient) -> None:
    q = await _setup(client)
    await client.publish(q, ["old"])
    await asyncio.sleep(0.05)
    await client.create_group(q, "late", start_from="latest")
    await client.create_group(q, "early")
    await client.publish(q, ["new"])
    assert [m.text for m in await client.receive(q, "late", max_messages=10, wait_seconds=3)] == [
        "new"
    ]
    got = await _drain(client, q, "early", 2)
    assert sorted(got) == ["new", "old"]


async def test_attributes_and_ids(client: AsyncClient) -> None:
    q = await _setup(client, "g")
    (mid,) = await client.publish(q, [OutgoingMessage("a", {"k": "v", "trace": "t1"})])
    (m,) = await client.receive(q, "g", wait_seconds=5)
    assert m.id == mid and m.attributes == {"k": "v", "trace": "t1"}
    assert isinstance(m.enqueued_at, datetime) and m.enqueued_at.tzinfo == UTC
    assert abs((datetime.now(UTC) - m.enqueued_at).total_seconds()) < 60


async def test_explicit_zero_delay_overrides_the_queue_default(client: AsyncClient) -> None:
    q = unique()
    await client.create_queue(q, delay_seconds=30)
    await client.create_group(q, "g")
    await client.publish(q, [OutgoingMessage("now", delay_seconds=0), OutgoingMessage("later")])
    got = await client.receive(q, "g", max_messages=10, wait_seconds=3)
    assert [m.text for m in got] == ["now"]
    assert await client.receive(q, "g", wait_seconds=0.5) == []


async def test_expired_messages_are_never_delivered(client: AsyncClient) -> None:
    q = unique()
    await client.create_queue(q, retention_seconds=1)
    await client.create_group(q, "g")
    await client.publish(q, ["old"])
    # read into the group before it expires, then not received until after
    await asyncio.sleep(1.3)
    assert await client.receive(q, "g", wait_seconds=0.5) == []
    await client.publish(q, ["fresh"])
    got = await client.receive(q, "g", max_messages=10, wait_seconds=5)
    assert [m.text for m in got] == ["fresh"]
    await client.ack(q, "g", [m.receipt or "" for m in got])
    await asyncio.sleep(0.1)
    assert (await client.get_group(q, "g"))["stats"]["backlog"] == 0


async def test_receive_and_consume_refuse_a_stream_mode_group(client: AsyncClient) -> None:
    """A stream-mode group is read by offsets (Spark); a receive of one answered an empty
    list forever (and `cherami consume` printed nothing and exited 0)."""
    q = await _setup(client)
    await client.create_group(q, "analytics", type="stream")
    await client.publish(q, ["x"])
    with pytest.raises(InvalidRequest, match="stream-mode group"):
        await client.receive(q, "analytics", wait_seconds=1)
    with pytest.raises(InvalidRequest, match="stream-mode group"):
        async with client.consumer(q, "analytics") as consumer:
            await consumer.get(timeout=1)


async def test_a_client_that_drops_mid_body_is_one_line_not_a_traceback(
    fresh_server: ServerProcess,
) -> None:
    """A client that went away in the middle of its request body logged a full ERROR
    traceback each time (100 in 0.1 s). Now it is one INFO line, and the node answers on."""
    fresh_server.start()
    host, port = fresh_server.url.rsplit("//", 1)[1].split(":")
    q = unique()
    async with AsyncClient(fresh_server.url) as client:
        await client.create_queue(q)
    for _ in range(20):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            f"POST /v1/queues/{q}/messages HTTP/1.1\r\nHost: x\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            '{"messages": [{"bo'.encode()
        )
        await writer.drain()
        writer.close()
        await writer.wait_closed()
    async with AsyncClient(fresh_server.url) as client:
        assert len(await client.publish(q, ["still here"])) == 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        gone = [line for line in fresh_server.output if "the client went away" in line]
        if len(gone) == 20:
            break
        await asyncio.sleep(0.1)
    assert len(gone) == 20
    assert not [line for line in fresh_server.output if "Traceback" in line or "ERROR" in line]
