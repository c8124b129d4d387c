"""Publish limits and back-pressure on a real node: 429 ``throttled`` with Retry-After,
the client slowing to a limit and losing nothing, PATCH raising a limit at run time,
an API key's own limit across queues, the stream throttle frame, and
``max_backlog_bytes`` (``backlog_full`` until consumers catch up)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import aiohttp
import httpx
import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.errors import BacklogFull
from cherami.wire import stream as f
from tests.support.server import ServerProcess, unique

ADMIN = "throttle-admin"
LIMITED = "throttle-limited-producer"  # its own publish_rate over every queue
KEY_RATE, KEY_BURST = 300.0, 30.0


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("throttle")
    keys = root / "keys.json"
    keys.write_text(json.dumps([
        {"key": ADMIN, "scopes": ["admin"]},
        {"key": LIMITED, "scopes": ["produce"], "publish_rate": KEY_RATE,
         "publish_burst": KEY_BURST},
    ]))  # fmt: skip
    proc = ServerProcess(root / "node", stores=1, extra=["--auth-file", str(keys)]).start()
    yield proc
    assert proc.stop() == 0


def _admin(node: ServerProcess, **options: float) -> AsyncClient:
    return AsyncClient(node.url, ADMIN, **options)


async def _drain(client: AsyncClient, queue: str, group: str, until: int) -> list[str]:
    """Receive and ack until ``until`` messages came (or 10 s pass without one)."""
    got: list[str] = []
    idle_since = time.monotonic()
    while len(got) < until and time.monotonic() - idle_since < 10:
        batch = await client.receive(queue, group, max_messages=1000, wait_seconds=1)
        if batch:
            idle_since = time.monotonic()
            got += [m.id for m in batch]
            await client.ack(queue, group, [m.receipt for m in batch])
    return got


async def _pump(client: AsyncClient, queue: str, seconds: float, batch: int = 10) -> int:
    """Publish batches back to back for ``seconds``; how many messages were acked."""
    end = time.monotonic() + seconds
    sent = 0
    while time.monotonic() < end:
        sent += len(await client.publish(queue, [b"m"] * batch))
    return sent


def test_http_429_throttled_with_retry_after(node: ServerProcess) -> None:
    q, qb = unique(), unique()
    auth = {"Authorization": f"Bearer {ADMIN}"}
    with httpx.Client(base_url=node.url, headers=auth) as http:
        assert http.put(f"/v1/queues/{q}", json={"publish_rate": 10, "publish_burst": 10})
        assert http.put(f"/v1/queues/{qb}", json={"publish_bytes_rate": 1000}).status_code == 201
        ok = http.post(f"/v1/queues/{q}/messages", json={"messages": [{"body": "x"}] * 10})
        assert ok.status_code == 200  # the burst
        refused = http.post(f"/v1/queues/{q}/messages", json={"messages": [{"body": "x"}]})
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["code"] == "throttled" and "publish_rate" in error["message"]
        assert 0 < error["retry_after_ms"] <= 110  # one message at 10/s
        assert refused.headers["Retry-After"] == "1"  # whole seconds, rounded up
        metric = f'cherami_messages_refused_total{{code="throttled",queue="{q}"}} 1.0'
        assert metric in http.get("/metrics").text
        # a limit in bytes/s: 1000 bytes go, the next 100 wait
        big = {"messages": [{"body": "y" * 1000}]}
        assert http.post(f"/v1/queues/{qb}/messages", json=big).status_code == 200
        small = http.post(f"/v1/queues/{qb}/messages", json={"messages": [{"body": "z" * 100}]})
        assert small.status_code == 429 and "publish_bytes_rate" in small.text
        # bad limits are a 400, never a 500
        bad = http.put(f"/v1/queues/{unique()}", json={"publish_rate": -1})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"
        bad = http.patch(f"/v1/queues/{q}", json={"max_backlog_bytes": "lots"})
        assert bad.status_code == 400
        # a tiny rate names a wait of at most an hour (the bucket keeps what the old rate
        # refilled since the burst, at most its 10: those go first)
        assert http.patch(f"/v1/queues/{q}", json={"publish_rate": 1e-9}).status_code == 200
        for _ in range(11):
            long = http.post(f"/v1/queues/{q}/messages", json={"messages": [{"body": "x"}]})
            if long.status_code != 200:
                break
        assert long.status_code == 429 and long.headers["Retry-After"] == "3600"


async def test_client_slows_to_the_limit_and_loses_nothing(node: ServerProcess) -> None:
    q, rate, burst, total = unique(), 500.0, 50.0, 2000
    async with _admin(node) as client:
        await client.create_queue(q, publish_rate=rate, publish_burst=burst)
        await client.create_group(q, "g")

        async def producer(w: int) -> list[str]:  # 25 batches of 20, one after another
            ids: list[str] = []
            for j in range(0, total // 4, 20):
                ids += await client.publish(q, [f"{w}-{i}" for i in range(j, j + 20)])
            return ids

        start = time.monotonic()
        parts = await asyncio.gather(*(producer(w) for w in range(4)))
        elapsed = time.monotonic() - start
        acked = [i for part in parts for i in part]
        achieved = total / elapsed
        print(f"client publish: {total} messages in {elapsed:.2f} s = {achieved:.0f}/s "
              f"(limit {rate:.0f}/s, burst {burst:.0f})")  # fmt: skip
        assert (total - burst) / rate * 0.95 <= elapsed <= total / rate * 1.5
        consumed = await _drain(client, q, "g", total)
        assert len(acked) == total and sorted(consumed) == sorted(acked), "lost or doubled"


async def test_patch_raises_the_limit_at_run_time(node: ServerProcess) -> None:
    q = unique()
    async with _admin(node) as client:
        await client.create_queue(q, publish_rate=200, publish_burst=20)
        await _pump(client, q, 0.3)  # the burst is spent
        slow = sum(await asyncio.gather(*(_pump(client, q, 2.0) for _ in range(2)))) / 2.0
        patched = await client.update_queue(q, publish_rate=1000, publish_burst=100)
        assert patched["publish_rate"] == 1000
        fast = sum(await asyncio.gather(*(_pump(client, q, 2.0) for _ in range(2)))) / 2.0
        print(f"publish rate: {slow:.0f}/s at publish_rate 200, {fast:.0f}/s after PATCH to 1000")
        assert slow <= 200 * 1.15 and fast >= 3 * slow and fast <= 1000 * 1.2
        # 0 removes the limit
        await client.update_queue(q, publish_rate=0)
        assert (await client.get_queue(q))["publish_rate"] == 0


async def test_a_keys_limit_holds_across_queues(node: ServerProcess) -> None:
    q1, q2 = unique(), unique()
    async with _admin(node) as admin:
        await admin.create_queue(q1)
        await admin.create_queue(q2)
    async with AsyncClient(node.url, LIMITED) as client:
        await _pump(client, q1, 0.2)  # the burst is spent
        seconds = 3.0
        sent = await asyncio.gather(_pump(client, q1, seconds), _pump(client, q2, seconds))
    rate = sum(sent) / seconds
    print(f"one key over two queues: {sent[0]} + {sent[1]} in {seconds:.0f} s = {rate:.0f}/s "
          f"(the key's publish_rate {KEY_RATE:.0f})")  # fmt: skip
    assert min(sent) > 0 and KEY_RATE * 0.8 <= rate <= KEY_RATE * 1.1


async def test_stream_gets_a_throttle_frame_and_stays_open(node: ServerProcess) -> None:
    q = unique()
    async with _admin(node) as admin:
        await admin.create_queue(q, publish_rate=10, publish_burst=10)
        headers = {"Authorization": f"Bearer {ADMIN}"}
        url = admin.ws_url(f"/v1/queues/{q}/publish")
        async with aiohttp.ClientSession(headers=headers) as http, http.ws_connect(url) as ws:
            batch = [f.OutMessage(b"x")] * 10
            await ws.send_bytes(f.encode(f.Publish(1, batch)))
            await ws.send_bytes(f.encode(f.Publish(2, batch)))  # over the burst
            replies = [f.decode_server(await ws.receive_bytes(timeout=5)) for _ in range(2)]
            published = [r for r in replies if isinstance(r, f.Published)]
            refused = [r for r in replies if isinstance(r, f.Throttled)]
            assert len(published) == 1 and len(refused) == 1, replies
            throttled = refused[0]
            assert throttled.code == "throttled" and throttled.id == 3 - published[0].id
            assert 900 <= throttled.retry_ms <= 1100  # ten messages at 10/s
            await asyncio.sleep(throttled.retry_ms / 1000)
            await ws.send_bytes(f.encode(f.Publish(throttled.id, batch)))  # the same stream
            again = f.decode_server(await ws.receive_bytes(timeout=5))
            assert isinstance(again, f.Published) and again.id == throttled.id


async def test_stream_publisher_backs_off_by_itself_and_loses_nothing(node: ServerProcess) -> None:
    q, rate, burst, total = unique(), 500.0, 50.0, 2000
    async with _admin(node) as client:
        await client.create_queue(q, publish_rate=rate, publish_burst=burst)
        await client.create_group(q, "g")
        start = time.monotonic()
        async with client.publisher(q) as publisher:
            futures = [await publisher.send([f"s-{i + j}" for j in range(20)])
                       for i in range(0, total, 20)]  # fmt: skip
            acked = [i for ids in await asyncio.gather(*futures) for i in ids]
            throttled = publisher.throttled
        elapsed = time.monotonic() - start
        print(f"stream publish: {total} messages in {elapsed:.2f} s = {total / elapsed:.0f}/s "
              f"(limit {rate:.0f}/s), {throttled} frames throttled and sent again")  # fmt: skip
        assert throttled > 0 and (total - burst) / rate * 0.95 <= elapsed <= total / rate * 1.5
        consumed = await _drain(client, q, "g", total)
        assert len(acked) == total and sorted(consumed) == sorted(acked), "lost or doubled"


async def test_backlog_full_until_consumers_catch_up(node: ServerProcess) -> None:
    q, limit = unique(), 20_000
    body = "b" * 1000
    async with _admin(node) as client:
        await client.create_queue(q, max_backlog_bytes=limit)
        await client.create_group(q, "g")
        acked: list[str] = []
        auth = {"Authorization": f"Bearer {ADMIN}"}
        async with httpx.AsyncClient(base_url=node.url, headers=auth) as http:
            for _ in range(200):
                reply = await http.post(f"/v1/queues/{q}/messages",
                                        json={"messages": [{"body": body}] * 5})  # fmt: skip
                if reply.status_code != 200:
                    break
                acked += reply.json()["ids"]
                await asyncio.sleep(0.02)
        assert reply.status_code == 429, reply.text
        error = reply.json()["error"]
        assert error["code"] == "backlog_full" and "max_backlog_bytes" in error["message"]
        assert reply.headers["Retry-After"] == "1"
        assert limit <= len(acked) * 1000 <= limit + 5000  # refused within a batch of it
        assert (await client.get_queue(q))["stats"]["unconsumed_bytes"] >= limit
        # a client without retries gets the error; one with them waits for the consumers
        async with AsyncClient(node.url, ADMIN, throttled_retry_seconds=0) as impatient:
            with pytest.raises(BacklogFull):
                await impatient.publish(q, [body])
        waiting = asyncio.ensure_future(client.publish(q, [body] * 5))
        await asyncio.sleep(1.5)
        assert not waiting.done(), "published past a full backlog"
        consumed = await _drain(client, q, "g", len(acked))  # consuming goes on
        acked += await asyncio.wait_for(waiting, 10)  # and publishing resumes by itself
        consumed += await _drain(client, q, "g", 5)
        print(f"backlog: {len(acked)} acked, {len(consumed)} consumed, "
              f"lost {len(set(acked) - set(consumed))}")  # fmt: skip
        assert sorted(consumed) == sorted(acked)
        assert (await client.get_queue(q))["stats"]["unconsumed_bytes"] == 0
