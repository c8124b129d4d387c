"""WebSocket streaming publish and consume, at the frame level and through the client."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from cherami import Client
from cherami.client.asyncclient import AsyncClient
from cherami.client.models import OutgoingMessage
from cherami.errors import GroupNotFound, MessageTooLarge, QueueNotFound
from cherami.wire import stream as f
from tests.support.server import ServerProcess, unique


async def _queue(client: AsyncClient, *groups: str, **cfg: float) -> str:
    q = unique()
    await client.create_queue(q)
    for g in groups:
        await client.create_group(q, g, **cfg)
    return q


async def test_stream_publish_and_consume_round_trip(client: AsyncClient) -> None:
    q = await _queue(client, "g")
    async with client.publisher(q) as pub:
        futures = [await pub.send([f"b{i}-{j}" for j in range(100)]) for i in range(20)]
        ids = [i for fut in futures for i in await fut]
    assert len(set(ids)) == 2000
    got: list[str] = []
    async with client.consumer(q, "g", credit=300) as c:
        while len(got) < 2000:
            batch = await c.get_batch(500, timeout=5)
            assert batch, f"stalled after {len(got)}"
            got += [m.text for m in batch]
            c.ack(*batch)
        await c.flush()
    assert sorted(got) == sorted(f"b{i}-{j}" for i in range(20) for j in range(100))
    for _ in range(50):
        stats = (await client.get_group(q, "g"))["stats"]
        if stats["backlog"] == 0:
            break
        await asyncio.sleep(0.1)
    assert stats["backlog"] == 0 and stats["acked"] == 2000


async def test_a_settlement_frame_over_the_cap_is_refused_whole(
    server: ServerProcess, client: AsyncClient
) -> None:
    """An ack frame naming more handles than a stream can hold (100,000) is answered
    with an error frame and applies nothing (a million junk handles were all echoed in a
    settled frame); the stream goes on, and a frame within the cap acks."""
    q = await _queue(client, "g")
    await client.publish(q, ["one"])
    async with aiohttp.ClientSession() as s:
        url = server.url.replace("http", "ws") + f"/v1/queues/{q}/groups/g/consume"
        async with s.ws_connect(url) as ws:
            await ws.send_bytes(f.encode(f.Credit(1)))
            frame = f.decode_server((await ws.receive(timeout=5)).data)
            assert isinstance(frame, f.Deliver) and len(frame.messages) == 1
            handle = frame.messages[0].handle
            too_many = [handle, *range(10**9, 10**9 + 100_000)]
            await ws.send_bytes(f.encode(f.Ack(too_many)))
            refused = f.decode_server((await ws.receive(timeout=5)).data)
            assert isinstance(refused, f.Error) and refused.code == "invalid_request"
            assert "at most 100000" in refused.message
            assert (await client.get_group(q, "g"))["stats"]["acked"] == 0  # nothing applied
            await ws.send_bytes(f.encode(f.Ack([handle])))  # the stream goes on
            deadline = time.monotonic() + 10
            while (await client.get_group(q, "g"))["stats"]["acked"] != 1:
                assert time.monotonic() < deadline, "the ack within the cap was not applied"
                await asyncio.sleep(0.05)


async def test_credit_bounds_deliveries(server: ServerProcess, client: AsyncClient) -> None:
    q = await _queue(client, "g")
    await client.publish(q, [f"m{i}" for i in range(50)])
    async with aiohttp.ClientSession() as s:
        url = server.url.replace("http", "ws") + f"/v1/queues/{q}/groups/g/consume"
        async with s.ws_connect(url) as ws:
            await ws.send_bytes(f.encode(f.Credit(10)))
            frame = f.decode_server((await ws.receive(timeout=5)).data)
            assert isinstance(frame, f.Deliver) and len(frame.messages) == 10
            with pytest.raises(asyncio.TimeoutError):
                await ws.receive(timeout=0.5)
            await ws.send_bytes(f.encode(f.Ack([m.handle for m in frame.messages])))
            await ws.send_bytes(f.encode(f.Credit(5)))
            frame = f.decode_server((await ws.receive(timeout=5)).data)
            assert isinstance(frame, f.Deliver) and len(frame.messages) == 5
            held = frame.messages
            await ws.send_bytes(f.encode(f.Ack([held[0].handle, held[0].handle, 999_999_999])))
            settled = f.decode_server((await ws.receive(timeout=5)).data)
            assert isinstance(settled, f.Settled)
            assert settled.kind == "ack" and settled.stale == [held[0].handle, 999_999_999]
    # what the closed stream held is delivered again at once
    got = []
    while len(got) < 4 + 35:
        more = await client.receive(q, "g", max_messages=100, wait_seconds=5)
        assert more
        got += more
    again = {m.id: m.delivery_count for m in got}
    assert all(again[m.id] == 2 for m in held[1:])


async def test_negative_credit_is_answered_with_what_came_back(
    server: ServerProcess, client: AsyncClient
) -> None:
    q = await _queue(client, "g")
    async with aiohttp.ClientSession() as s:
        url = server.url.replace("http", "ws") + f"/v1/queues/{q}/groups/g/consume"
        async with s.ws_connect(url) as ws:
            await ws.send_bytes(f.encode(f.Credit(100)))  # nothing to deliver: all unused
            await ws.send_bytes(f.encode(f.Credit(-30)))
            back = f.decode_server((await ws.receive(timeout=5)).data)
            assert back == f.Returned(30)
            await ws.send_bytes(f.encode(f.Credit(-500)))  # more than it has: the 70 left
            back = f.decode_server((await ws.receive(timeout=5)).data)
            assert back == f.Returned(70)
            await client.publish(q, [f"m{i}" for i in range(5)])
            with pytest.raises(asyncio.TimeoutError):  # no credit: nothing is delivered
                await ws.receive(timeout=1.5)
            await ws.send_bytes(f.encode(f.Credit(3)))
            frame = f.decode_server((await ws.receive(timeout=5)).data)
            assert isinstance(frame, f.Deliver) and len(frame.messages) == 3
            await ws.send_bytes(f.encode(f.Credit(-10)))  # its 3 went to that delivery
            back = f.decode_server((await ws.receive(timeout=5)).data)
            assert back == f.Returned(0)


async def test_stream_nack_and_extend(client: AsyncClient) -> None:
    q = await _queue(client, "g", visibility_timeout_seconds=1)
    await client.publish(q, ["a", "b"])
    async with client.consumer(q, "g", credit=10) as c:
        first = await c.get_batch(2, timeout=5)
        while len(first) < 2:
            first += await c.get_batch(2, timeout=5)
        by_text = {m.text: m for m in first}
        # "b" is held through the nack below (its redelivery waits for two synced row
        # writes, slow on a busy machine), then kept from timing out by extends alone
        await c.extend(by_text["b"], visibility_timeout_seconds=30)
        t0 = time.monotonic()
        await c.nack(by_text["a"], delay_seconds=0.3)
        again = await c.get(timeout=5)
        assert again is not None and again.text == "a" and again.delivery_count == 2
        assert time.monotonic() - t0 >= 0.3
        c.ack(again)
        for _ in range(3):
            await asyncio.sleep(0.5)
            await c.extend(by_text["b"], visibility_timeout_seconds=1)
        assert await c.get(timeout=0.5) is None  # "b" never timed out
        c.ack(by_text["b"])
        await c.flush()
    deadline = time.monotonic() + 5  # the acks are settled as the server reads them
    while (await client.get_group(q, "g"))["stats"]["backlog"] and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert (await client.get_group(q, "g"))["stats"]["backlog"] == 0


async def test_stream_publish_errors_per_batch(server: ServerProcess, client: AsyncClient) -> None:
    q = unique()
    await client.create_queue(q, max_message_bytes=100)
    async with client.publisher(q) as pub:
        with pytest.raises(MessageTooLarge):
            await pub.publish([b"x" * 101])
        assert len(await pub.publish([b"x" * 100])) == 1
    async with aiohttp.ClientSession() as s:
        url = server.url.replace("http", "ws") + f"/v1/queues/{q}/publish"
        async with s.ws_connect(url) as ws:
            await ws.send_bytes(b"\xc1garbage")
            err = f.decode_server((await ws.receive(timeout=5)).data)
            assert isinstance(err, f.Error) and err.code == "invalid_request"
            await ws.send_str("text frame")
            err = f.decode_server((await ws.receive(timeout=5)).data)
            assert isinstance(err, f.Error) and err.code == "invalid_request"
            await ws.send_bytes(f.encode(f.Credit(5)))
            err = f.decode_server((await ws.receive(timeout=5)).data)
            assert isinstance(err, f.Error) and err.code == "invalid_request"
            await ws.send_bytes(f.encode(f.Publish(7, [f.OutMessage(b"ok")])))
            ok = f.decode_server((await ws.receive(timeout=5)).data)
            assert isinstance(ok, f.Published) and ok.id == 7 and len(ok.ids) == 1
            for bad in (-1, 30 * 86400 * 1000 + 1):  # a delay out of range, named
                batch = [
                    f.OutMessage(b"a"),
                    f.OutMessage(b"b", None, 5),
                    f.OutMessage(b"c", None, bad),
                ]
                await ws.send_bytes(f.encode(f.Publish(8, batch)))
                err = f.decode_server((await ws.receive(timeout=5)).data)
                assert isinstance(err, f.Error) and err.code == "invalid_request", err
                assert "messages[2].delay_ms" in err.message
    assert (await client.get_queue(q))["stats"]["messages_published"] == 2


async def test_a_batch_of_plain_and_delayed_messages_keeps_its_ids_in_order(
    client: AsyncClient,
) -> None:
    """A batch that mixes messages for now and delayed ones is split over a plain and a
    timer extent; its ids still come back in the batch's order."""
    q = await _queue(client, "g")
    batch = [b"now-0", OutgoingMessage(b"later-1", delay_seconds=1), b"now-2",
             OutgoingMessage(b"now-3", delay_seconds=0)]  # fmt: skip
    async with client.publisher(q) as pub:
        ids = await pub.publish(batch)
    plain = await client.publish(q, [b"x", b"y"])  # the fast path: one extent, in order
    assert len(set(ids)) == 4 and ids[0].rsplit(":", 1)[0] == ids[2].rsplit(":", 1)[0]
    assert ids[1].rsplit(":", 1)[0] != ids[0].rsplit(":", 1)[0]  # the timer extent
    assert [int(i.rsplit(":", 1)[1]) for i in plain] == [
        int(plain[0].rsplit(":", 1)[1]) + k for k in (0, 1)
    ]
    got: dict[str, bytes] = {}
    async with client.consumer(q, "g") as c:
        deadline = time.monotonic() + 10
        while len(got) < 6 and time.monotonic() < deadline:
            for m in await c.get_batch(10, timeout=0.5):
                got[m.id] = m.body
                c.ack(m)
    assert [got[i] for i in ids] == [b"now-0", b"later-1", b"now-2", b"now-3"]
    assert [got[i] for i in plain] == [b"x", b"y"]


async def test_stream_to_unknown_queue_or_group(client: AsyncClient) -> None:
    with pytest.raises(QueueNotFound):
        async with client.publisher(unique()):
            pass
    q = await _queue(client)
    with pytest.raises(GroupNotFound):
        async with client.consumer(q, "nope"):
            pass


async def test_competing_stream_consumers_share_the_work(client: AsyncClient) -> None:
    q = await _queue(client, "g")
    await client.publish(q, [f"m{i}" for i in range(3000)])
    seen: list[list[str]] = [[], []]

    async def run(k: int) -> None:
        async with client.consumer(q, "g", credit=100) as c:
            while True:
                batch = await c.get_batch(100, timeout=1.5)
                if not batch:
                    return
                seen[k] += [m.text for m in batch]
                await asyncio.sleep(0.005)
                c.ack(*batch)

    t0 = time.monotonic()
    await asyncio.gather(run(0), run(1))
    assert time.monotonic() - t0 < 60
    assert set(seen[0]).isdisjoint(seen[1]) and seen[0] and seen[1]
    assert len(seen[0]) + len(seen[1]) == 3000


async def test_large_messages_are_split_across_frames(client: AsyncClient) -> None:
    q = unique()
    await client.create_queue(q, max_message_bytes=2 << 20)
    await client.create_group(q, "g")
    big = [bytes([i]) * (1 << 20) for i in range(20)]
    async with client.publisher(q) as pub:
        for i in range(0, 20, 5):
            await pub.publish(big[i : i + 5])
    got = []
    async with client.consumer(q, "g", credit=100) as c:
        while len(got) < 20:
            batch = await c.get_batch(100, timeout=10)
            assert batch
            got += batch
            c.ack(*batch)
    assert sorted(m.body for m in got) == sorted(big)
    assert all(m.delivery_count == 1 for m in got)


async def test_plain_get_on_a_stream_path_is_a_json_400(server: ServerProcess) -> None:
    q = unique()
    async with aiohttp.ClientSession() as s:
        await s.put(f"{server.url}/v1/queues/{q}")
        async with s.get(f"{server.url}/v1/queues/{q}/publish") as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["code"] == "invalid_request"


async def test_concurrent_batches_share_frames_and_keep_their_own_ids(
    client: AsyncClient,
) -> None:
    q = await _queue(client, "g")
    async with client.publisher(q, max_in_flight=64) as pub:
        assert pub._ws is not None
        frames: list[int] = []
        send_bytes = pub._ws.send_bytes

        async def counting(data: bytes, *args: object, **kwargs: object) -> None:
            frame = f.decode_client(data)
            assert isinstance(frame, f.Publish)
            frames.append(len(frame.messages))
            await send_bytes(data, *args, **kwargs)  # type: ignore[arg-type]

        pub._ws.send_bytes = counting  # type: ignore[method-assign]
        batches = [[f"c{i}-{j}" for j in range(50)] for i in range(12)]
        results = await asyncio.gather(*(pub.publish(b) for b in batches))
    # 12 batches of 50 sent in one loop turn travel in frames of at most 400 messages
    assert sum(frames) == 600 and len(frames) < 12 and max(frames) <= 400
    told = {
        i: body
        for ids, b in zip(results, batches, strict=True)
        for i, body in zip(ids, b, strict=True)
    }
    assert len(told) == 600
    got: dict[str, str] = {}
    async with client.consumer(q, "g", credit=600) as c:
        while len(got) < 600:
            batch = await c.get_batch(600, timeout=5)
            assert batch, f"stalled after {len(got)}"
            got.update((m.id, m.text) for m in batch)
            c.ack(*batch)
    assert got == told  # every caller was given the ids of exactly its own messages


async def test_a_refused_batch_in_a_shared_frame_fails_alone(client: AsyncClient) -> None:
    q = unique()
    await client.create_queue(q, max_message_bytes=100)
    async with client.publisher(q) as pub:
        results = await asyncio.gather(
            pub.publish([b"a" * 10] * 5),
            pub.publish([b"a" * 10, b"x" * 101]),  # one oversized message refuses its batch
            pub.publish([b"b" * 10] * 3),
            return_exceptions=True,
        )
    assert isinstance(results[1], MessageTooLarge)
    assert [len(r) for r in (results[0], results[2]) if isinstance(r, list)] == [5, 3]
    assert (await client.get_queue(q))["stats"]["messages_published"] == 8


async def test_a_frame_nested_too_deeply_is_an_error_frame_not_a_crash(
    server: ServerProcess, client: AsyncClient
) -> None:
    """A msgpack value nested 100,000 deep once raised RecursionError in the decoder and
    the error middleware wrote an HTTP 500 into the upgraded WebSocket. Now it is the
    protocol's error frame, on a consume and a publish stream, and the stream goes on."""
    q = await _queue(client, "g")
    nested = b"\x93\xa6credit\x00" + b"\x91" * 100_000 + b"\xc0"
    nested_pub = b"\x93\xa3pub\x01" + b"\x91" * 100_000 + b"\xc0"
    base = server.url.replace("http", "ws") + f"/v1/queues/{q}"
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(base + "/groups/g/consume") as ws:
            await ws.send_bytes(nested)
            error = f.decode_server((await ws.receive(timeout=5)).data)
            assert isinstance(error, f.Error) and error.code == "invalid_request"
            assert "nested too deeply" in error.message
            await client.publish(q, ["after"])
            await ws.send_bytes(f.encode(f.Credit(10)))
            frame = f.decode_server((await ws.receive(timeout=5)).data)
            assert isinstance(frame, f.Deliver) and [m.body for m in frame.messages] == [b"after"]
        async with s.ws_connect(base + "/publish") as ws:
            await ws.send_bytes(nested_pub)
            error = f.decode_server((await ws.receive(timeout=5)).data)
            assert isinstance(error, f.Error) and error.code == "invalid_request"
    deep_json = b'{"messages": [{"body": "x", "attributes": ' + b"[" * 100_000 + b"]" * 100_000
    async with aiohttp.ClientSession() as s:
        resp = await s.post(f"{server.url}/v1/queues/{q}/messages", data=deep_json + b"}]}")
    assert resp.status == 400


async def test_a_consumer_used_without_async_with_acks_what_it_acks(
    client: AsyncClient,
) -> None:
    """``c = client.consumer(q, g); async for m in c: c.ack(m)`` once received up to its
    credit and never sent an ack: every message came back after its visibility timeout.
    Now the first iteration opens it, acks are sent, and the group's backlog empties."""
    q = await _queue(client, "g")
    await client.publish(q, [f"m{i}" for i in range(20)])
    c = client.consumer(q, "g", credit=50)
    seen = []
    async for m in c:
        seen.append(m.text)
        c.ack(m)
        if len(seen) == 20:
            break
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            stats = (await client.get_group(q, "g"))["stats"]
            if stats["acked"] == 20:
                break
            await asyncio.sleep(0.1)
        assert stats["acked"] == 20 and stats["backlog"] == 0
    finally:
        await c.close()
    assert sorted(seen) == sorted(f"m{i}" for i in range(20))


def test_the_sync_consumer_used_without_with_acks_what_it_acks(server: ServerProcess) -> None:
    """The blocking client's ``c = client.consumer(q, g); for m in c: c.ack(m)`` had the
    async consumer's fault: no flush task without ``with``, so no ack was sent. Its first
    get opens it now. The stats are read while it is still open: its ``close`` flushes the
    acks, which would hide a consumer that never sent them."""
    q = unique()
    with Client(server.url) as client:
        client.create_queue(q)
        client.create_group(q, "g")
        client.publish(q, [f"m{i}" for i in range(20)])
        c = client.consumer(q, "g", credit=50)
        seen = []
        try:
            for m in c:
                seen.append(m.text)
                c.ack(m)
                if len(seen) == 20:
                    break
            deadline = time.monotonic() + 10
            while (stats := client.get_group(q, "g")["stats"])["acked"] != 20:
                assert time.monotonic() < deadline, f"the acks were not sent: {stats}"
                time.sleep(0.05)
            assert (stats["backlog"], stats["in_flight"]) == (0, 0)
        finally:
            c.close()
    assert sorted(seen) == sorted(f"m{i}" for i in range(20))
