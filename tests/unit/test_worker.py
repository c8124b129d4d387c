"""``Worker`` against an in-memory stand-in for the client and its stream."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from cherami.client.models import Received
from cherami.client.worker import Backoff, Worker


class FakeConsumer:
    def __init__(self, messages: list[Received]) -> None:
        self.ready: asyncio.Queue[Received] = asyncio.Queue()
        for m in messages:
            self.ready.put_nowait(m)
        self.acked: list[str] = []
        self.nacked: list[tuple[str, float]] = []
        self.extended: list[tuple[list[str], float]] = []
        self.open = False

    async def __aenter__(self) -> FakeConsumer:
        self.open = True
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.open = False

    async def get(self, timeout: float | None = None) -> Received | None:
        try:
            return await asyncio.wait_for(self.ready.get(), timeout)
        except TimeoutError:
            return None

    def ack(self, *messages: Received) -> None:
        assert self.open
        self.acked += [m.id for m in messages]

    async def nack(self, *messages: Received, delay_seconds: float = 0) -> None:
        self.nacked += [(m.id, delay_seconds) for m in messages]

    async def extend(self, *messages: Received, visibility_timeout_seconds: float) -> None:
        self.extended.append(([m.id for m in messages], visibility_timeout_seconds))

    async def flush(self) -> None:
        pass


class FakeClient:
    def __init__(self, messages: list[Received], visibility: float = 60.0) -> None:
        self.stream = FakeConsumer(messages)
        self.visibility = visibility
        self.credit = 0

    async def get_group(self, queue: str, group: str) -> dict[str, Any]:
        return {"visibility_timeout_seconds": self.visibility}

    def consumer(self, queue: str, group: str, credit: int = 2000) -> FakeConsumer:
        self.credit = credit
        return self.stream


def messages(n: int, delivery_count: int = 1) -> list[Received]:
    return [
        Received(id=f"m{i}", body=b"x", delivery_count=delivery_count, enqueued_ms=0, handle=i + 1)
        for i in range(n)
    ]


def worker(client: FakeClient, handler: Any, concurrency: int = 4, **options: Any) -> Worker:
    return Worker(client, "q", "g", handler, concurrency, **options)  # type: ignore[arg-type]


async def test_runs_at_most_concurrency_handlers_and_acks_each() -> None:
    client = FakeClient(messages(20))
    running = peak = 0

    async def handler(message: Received) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1

    w = worker(client, handler, 4, max_messages=20)
    await asyncio.wait_for(w.run(), 5)
    assert peak == 4
    assert client.credit == 4  # the stream holds no more than the handlers can take
    assert sorted(client.stream.acked) == sorted(f"m{i}" for i in range(20))
    assert (w.taken, w.acked, w.nacked) == (20, 20, 0)


async def test_failures_are_nacked_with_the_backoff_of_their_delivery_count() -> None:
    client = FakeClient(messages(3, delivery_count=3))

    async def handler(message: Received) -> None:
        if message.id != "m1":
            raise ValueError("boom")

    w = worker(client, handler, 2, max_messages=3, nack_backoff=Backoff(0.5, 3.0, 100.0))
    await asyncio.wait_for(w.run(), 5)
    assert sorted(client.stream.nacked) == [("m0", 4.5), ("m2", 4.5)]
    assert client.stream.acked == ["m1"]
    assert (w.acked, w.nacked) == (1, 2)


async def test_plain_handlers_run_in_worker_threads() -> None:
    client = FakeClient(messages(6))
    threads: set[str] = set()

    def handler(message: Received) -> None:
        threads.add(threading.current_thread().name)

    await asyncio.wait_for(worker(client, handler, 3, max_messages=6).run(), 5)
    assert threads and all(name.startswith("cherami-worker") for name in threads)
    assert len(client.stream.acked) == 6


async def test_long_handlers_get_their_visibility_extended() -> None:
    client = FakeClient(messages(1), visibility=0.1)  # default: extend every 0.05 s

    async def handler(message: Received) -> None:
        await asyncio.sleep(0.3)

    await asyncio.wait_for(worker(client, handler, max_messages=1).run(), 5)
    assert len(client.stream.extended) >= 3
    assert all(ids == ["m0"] and v == 0.1 for ids, v in client.stream.extended)


async def test_no_extension_once_handlers_are_done() -> None:
    client = FakeClient(messages(2))

    async def handler(message: Received) -> None:
        pass

    await asyncio.wait_for(worker(client, handler, extend_every=0.01, idle_timeout=0.1).run(), 5)
    assert client.stream.extended == []
    assert len(client.stream.acked) == 2


async def test_idle_timeout_waits_for_running_handlers() -> None:
    client = FakeClient(messages(1))
    done: list[str] = []

    async def handler(message: Received) -> None:
        await asyncio.sleep(0.3)  # longer than the idle timeout
        done.append(message.id)

    await asyncio.wait_for(worker(client, handler, idle_timeout=0.05).run(), 5)
    assert done == ["m0"] and client.stream.acked == ["m0"]


async def test_stop_before_run_takes_nothing() -> None:
    client = FakeClient(messages(3))
    w = worker(client, lambda m: None)
    w.stop()
    await asyncio.wait_for(w.run(), 5)
    assert w.taken == 0 and client.stream.acked == [] and client.stream.ready.qsize() == 3


async def test_stop_from_a_handler_thread_lets_the_others_finish() -> None:
    client = FakeClient(messages(10))
    finished: list[str] = []
    release = threading.Event()

    def handler(message: Received) -> None:
        if message.id == "m0":
            w.stop()
            release.set()
        else:
            release.wait(5)
        finished.append(message.id)

    w = worker(client, handler, 3)
    await asyncio.wait_for(w.run(), 5)
    assert sorted(client.stream.acked) == sorted(finished) and len(finished) == w.taken <= 3


def test_concurrency_must_be_positive() -> None:
    with pytest.raises(ValueError):
        worker(FakeClient([]), lambda m: None, 0)
