"""The blocking ``Client`` and the ``Worker`` against a real node."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from cherami import Client, OutgoingMessage, QueueNotFound, Received, Worker
from cherami.client.asyncclient import AsyncClient
from tests.support.server import ServerProcess, unique


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def stats_are(client: AsyncClient, queue: str, group: str, **expected: int) -> None:
    async def check() -> bool:
        stats = (await client.get_group(queue, group))["stats"]
        return all(stats[k] == v for k, v in expected.items())

    await eventually(check)


async def queue_with_group(client: AsyncClient, bodies: list[str], **group: Any) -> tuple[str, str]:
    queue, name = unique("q"), unique("g")
    await client.create_queue(queue)
    await client.create_group(queue, name, **group)
    if bodies:
        await client.publish(queue, bodies)
    return queue, name


# the blocking client
def receive_n(c: Client, queue: str, group: str, n: int) -> list[Received]:
    got: list[Received] = []
    deadline = time.monotonic() + 10
    while len(got) < n and time.monotonic() < deadline:
        got += c.receive(queue, group, max_messages=n - len(got), wait_seconds=2)
    return got


def test_sync_client_round_trip(server: ServerProcess) -> None:
    queue, group = unique("q"), unique("g")
    with Client(server.url) as c:
        assert c.create_queue(queue, min_extents=1)["name"] == queue
        assert queue in [q["name"] for q in c.list_queues()]
        assert c.create_group(queue, group, visibility_timeout_seconds=30)["name"] == group
        assert [g["name"] for g in c.list_groups(queue)] == [group]
        ids = c.publish(queue, ["one", b"\x00\xff", OutgoingMessage("three", {"k": "v"})])
        assert len(set(ids)) == 3

        got = receive_n(c, queue, group, 3)
        assert sorted(m.body for m in got) == [b"\x00\xff", b"one", b"three"]
        assert {m.body: m.attributes for m in got}[b"three"] == {"k": "v"}
        assert {m.id for m in got} == set(ids)
        by_body = {m.body: m for m in got}

        assert c.extend(queue, group, [by_body[b"one"].receipt or ""], 60)["extended"] == 1
        assert c.nack(queue, group, [by_body[b"three"].receipt or ""])["nacked"] == 1
        acked = c.ack(
            queue, group, [by_body[b"one"].receipt or "", by_body[b"\x00\xff"].receipt or ""]
        )
        assert acked == {"acked": 2, "stale": []}
        (again,) = receive_n(c, queue, group, 1)
        assert (again.body, again.delivery_count) == (b"three", 2)
        assert c.ack(queue, group, [again.receipt or ""])["acked"] == 1

        stats = c.get_group(queue, group)["stats"]
        assert (stats["backlog"], stats["in_flight"], stats["acked"]) == (0, 0, 3)
        assert stats["redelivered"] == 1
        assert c.get_queue(queue)["stats"]["messages_published"] == 3
        assert c.update_group(queue, group, max_delivery_count=3)["max_delivery_count"] == 3
        assert c.update_queue(queue, retention_seconds=3600)["retention_seconds"] == 3600
        assert c.dlq(queue, group) == {"messages": [], "depth": 0}
        assert c.dlq_purge(queue, group) == 0
        assert c.dlq_merge(queue, group) == 0

        c.delete_group(queue, group)
        assert c.list_groups(queue) == []
        c.delete_queue(queue)
        with pytest.raises(QueueNotFound):
            c.get_queue(queue)
    with pytest.raises(RuntimeError, match="closed"):
        c.list_queues()


def test_sync_publisher_and_consumer_stream(server: ServerProcess) -> None:
    queue, group = unique("q"), unique("g")
    with Client(server.url) as c:
        c.create_queue(queue)
        c.create_group(queue, group)
        with c.publisher(queue) as publisher:
            ids = publisher.publish([f"m{i}" for i in range(100)])
            futures = [
                publisher.send(OutgoingMessage(f"m{i}", {"n": str(i)}) for i in range(s, s + 100))
                for s in range(100, 500, 100)
            ]
            publisher.flush()
            for future in futures:
                ids += future.result(timeout=10)
        assert len(set(ids)) == 500

        seen: list[str] = []
        with c.consumer(queue, group, credit=100) as consumer:
            while len(seen) < 500:
                batch = consumer.get_batch(200, timeout=10)
                assert batch, f"stream stalled after {len(seen)} messages"
                seen += [m.text for m in batch]
                consumer.ack(*batch)
            consumer.flush()
            assert consumer.get(timeout=0.2) is None
        assert sorted(seen) == sorted(f"m{i}" for i in range(500))

        c.publish(queue, ["again", "once"])
        deliveries: list[tuple[str, int]] = []
        with c.consumer(queue, group, credit=10) as consumer:
            for message in consumer:
                deliveries.append((message.text, message.delivery_count))
                if message.text == "again" and message.delivery_count == 1:
                    consumer.nack(message)
                else:
                    consumer.ack(message)
                if len(deliveries) == 3:
                    break
        assert sorted(deliveries) == [("again", 1), ("again", 2), ("once", 1)]
        stats = c.get_group(queue, group)["stats"]
        assert (stats["backlog"], stats["acked"]) == (0, 502)


def test_sync_worker_runs_sync_handlers_and_stops_from_one(server: ServerProcess) -> None:
    queue, group = unique("q"), unique("g")
    handled: list[str] = []
    threads: set[str] = set()
    with Client(server.url) as c:
        c.create_queue(queue)
        c.create_group(queue, group)
        c.publish(queue, [str(i) for i in range(10)])
        c.run_worker(queue, group, lambda m: handled.append(m.text), 3, max_messages=4)
        assert len(handled) == 4

        def handler(message: Received) -> None:
            threads.add(threading.current_thread().name)
            handled.append(message.text)
            if len(handled) == 10:
                worker.stop()

        worker = c.worker(queue, group, handler, 2, idle_timeout=10)
        started = time.monotonic()
        worker.run()
        assert time.monotonic() - started < 5  # stopped by the handler, not the idle timeout
        assert sorted(handled, key=int) == [str(i) for i in range(10)]
        assert all(name.startswith("cherami-worker") for name in threads)
        assert c.get_group(queue, group)["stats"]["backlog"] == 0


def test_sync_worker_stops_gracefully_on_sigterm(server: ServerProcess) -> None:
    queue, group = unique("q"), unique("g")
    before = signal.getsignal(signal.SIGTERM)
    finished: list[str] = []

    def handler(message: Received) -> None:  # in a worker thread; the signal hits main
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)
        finished.append(message.text)

    with Client(server.url) as c:
        c.create_queue(queue)
        c.create_group(queue, group)
        c.publish(queue, [str(i) for i in range(5)])
        c.run_worker(queue, group, handler, 1)
        assert len(finished) == 1
        assert signal.getsignal(signal.SIGTERM) == before
        stats = c.get_group(queue, group)["stats"]
        assert (stats["acked"], stats["backlog"]) == (1, 4)


# the worker
async def test_worker_acks_on_success_within_its_concurrency(client: AsyncClient) -> None:
    queue, group = await queue_with_group(client, [str(i) for i in range(40)])
    handled: list[str] = []
    running = peak = 0

    async def handler(message: Received) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.02)
        handled.append(message.text)
        running -= 1

    worker = Worker(client, queue, group, handler, 8, max_messages=40)
    await asyncio.wait_for(worker.run(), 20)
    assert sorted(handled, key=int) == [str(i) for i in range(40)]
    assert 1 < peak <= 8
    assert (worker.acked, worker.nacked) == (40, 0)
    await stats_are(client, queue, group, backlog=0, in_flight=0, acked=40, redelivered=0)


async def test_worker_nacks_failures_and_acks_their_redelivery(client: AsyncClient) -> None:
    queue, group = await queue_with_group(client, [str(i) for i in range(12)])
    deliveries: dict[str, list[int]] = defaultdict(list)
    failed_at: dict[str, float] = {}
    redelivered_at: dict[str, float] = {}

    def handler(message: Received) -> None:  # a plain function: runs in a thread
        deliveries[message.text].append(message.delivery_count)
        if int(message.text) % 3 == 0:
            if message.delivery_count == 1:
                failed_at[message.text] = time.monotonic()
                raise RuntimeError("first attempt fails")
            redelivered_at[message.text] = time.monotonic()

    await asyncio.wait_for(
        client.run_worker(queue, group, handler, 4, max_messages=16, nack_backoff=(0.3, 2, 1)),
        20,
    )
    failing = {"0", "3", "6", "9"}
    assert {body: counts for body, counts in deliveries.items() if body in failing} == {
        body: [1, 2] for body in failing
    }
    assert all(deliveries[str(i)] == [1] for i in range(12) if str(i) not in failing)
    assert all(redelivered_at[b] - failed_at[b] >= 0.25 for b in failing)  # the backoff held
    await stats_are(client, queue, group, backlog=0, in_flight=0, acked=12, redelivered=4)


async def test_worker_extends_visibility_of_a_long_handler(client: AsyncClient) -> None:
    queue, group = await queue_with_group(client, ["slow"], visibility_timeout_seconds=1)
    calls: list[int] = []

    async def handler(message: Received) -> None:
        calls.append(message.delivery_count)
        await asyncio.sleep(2.5)

    worker = Worker(client, queue, group, handler, 2, idle_timeout=1.0)
    await asyncio.wait_for(worker.run(), 20)
    assert calls == [1]
    assert worker.acked == 1
    await stats_are(client, queue, group, backlog=0, in_flight=0, delivered=1, redelivered=0)


async def test_worker_stop_finishes_running_handlers_and_lands_their_acks(
    client: AsyncClient,
) -> None:
    queue, group = await queue_with_group(client, [str(i) for i in range(6)])
    started: list[str] = []
    finished: list[str] = []
    all_started = asyncio.Event()

    async def handler(message: Received) -> None:
        started.append(message.text)
        if len(started) == 3:
            all_started.set()
        await asyncio.sleep(0.1 if len(started) == 1 else 0.8)  # one frees its slot early
        finished.append(message.text)

    worker = Worker(client, queue, group, handler, 3)
    run = asyncio.create_task(worker.run())
    await asyncio.wait_for(all_started.wait(), 10)
    worker.stop()
    await asyncio.wait_for(run, 10)
    assert len(started) == 3  # nothing new was taken after stop()
    assert sorted(finished) == sorted(started)
    await stats_are(client, queue, group, backlog=3, in_flight=0, acked=3)

    rest: list[str] = []
    await client.run_worker(queue, group, lambda m: rest.append(m.text), 3, idle_timeout=0.5)
    assert sorted(started + rest, key=int) == [str(i) for i in range(6)]
    await stats_are(client, queue, group, backlog=0, in_flight=0, acked=6)


async def test_worker_stops_gracefully_on_sigterm(client: AsyncClient) -> None:
    queue, group = await queue_with_group(client, [str(i) for i in range(6)])
    before = signal.getsignal(signal.SIGTERM)
    started: list[str] = []
    finished: list[str] = []

    async def handler(message: Received) -> None:
        started.append(message.text)
        if len(started) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(0.5)
        else:
            await asyncio.sleep(0.05)
        finished.append(message.text)

    worker = Worker(client, queue, group, handler, 2)
    await asyncio.wait_for(worker.run(), 10)
    assert 1 <= len(started) <= 2
    assert sorted(finished) == sorted(started) and worker.acked == len(started)
    assert signal.getsignal(signal.SIGTERM) == before
    await stats_are(client, queue, group, backlog=6 - len(started), in_flight=0, acked=len(started))


def test_one_str_or_bytes_is_one_message_and_a_dict_is_refused(server: ServerProcess) -> None:
    """``publish(queue, "one string")`` once published a message per character (and a
    dict its keys); over HTTP and on a stream alike, a str or bytes is one message."""
    queue, group = unique("q"), unique("g")
    with Client(server.url) as c:
        c.create_queue(queue)
        c.create_group(queue, group)
        assert len(c.publish(queue, "one string")) == 1
        assert len(c.publish(queue, b"\x00one body")) == 1
        with c.publisher(queue) as publisher:
            assert len(publisher.publish("hey")) == 1
        with pytest.raises(TypeError, match="a dict is not a message"):
            c.publish(queue, {"id": 1})
        with pytest.raises(TypeError, match="not dict"):
            c.publish(queue, [{"id": 1}])
        with pytest.raises(TypeError, match="not int"):
            c.publish(queue, 7)  # type: ignore[arg-type]
        got = receive_n(c, queue, group, 3)
        assert sorted(m.body for m in got) == [b"\x00one body", b"hey", b"one string"]
        assert c.receive(queue, group, max_messages=10, wait_seconds=0.5) == []


def test_http_settlements_take_the_messages_a_receive_returned(server: ServerProcess) -> None:
    """``ack`` given message objects once failed with an unclear error; it takes them (or
    one), and a thing that is neither a receipt nor such a message is a clear TypeError."""
    queue, group = unique("q"), unique("g")
    with Client(server.url) as c:
        c.create_queue(queue)
        c.create_group(queue, group)
        c.publish(queue, ["a", "b", "c"])
        got = receive_n(c, queue, group, 3)
        assert c.extend(queue, group, got[0], visibility_timeout_seconds=60)["extended"] == 1
        assert c.ack(queue, group, got[:2])["acked"] == 2
        assert c.nack(queue, group, got[2])["nacked"] == 1
        with pytest.raises(TypeError, match="not int"):
            c.ack(queue, group, [1])
        stream_message = Received(handle=1, id="x:1", body=b"", delivery_count=1, enqueued_ms=0)
        with pytest.raises(TypeError, match="settle it through its consumer"):
            c.ack(queue, group, [stream_message])
