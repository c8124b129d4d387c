"""SIGKILL a node while it publishes and consumes, restart it on the same data dir and
prove that no acked message is lost and no acked delivery comes back."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from cherami.client.asyncclient import AsyncClient
from cherami.errors import CheramiError
from tests.support.checker import QueueHistory
from tests.support.drain import drain
from tests.support.server import ServerProcess, recovered

QUEUE, GROUP = "crash", "workers"


async def _publish_until_killed(url: str, history: QueueHistory, stop: asyncio.Event) -> None:
    n = 0
    async with AsyncClient(url, timeout=10) as client:
        with contextlib.suppress(CheramiError):
            async with client.publisher(QUEUE, max_in_flight=8) as pub:
                pending: set[asyncio.Future[list[str]]] = set()
                while not stop.is_set():
                    bodies = [f"m{n + i}" for i in range(200)]
                    n += 200
                    history.attempted.update(bodies)
                    try:
                        fut = await asyncio.wait_for(pub.send(bodies), 2)
                    except TimeoutError:
                        continue  # the node is gone; the stop flag ends the loop
                    fut.add_done_callback(
                        lambda f, b=bodies: (
                            None if f.cancelled() or f.exception() else history.acked.update(b)
                        )
                    )
                    pending.add(fut)
                    pending = {p for p in pending if not p.done()}
                await asyncio.wait(pending, timeout=5)


async def _consume_some(
    url: str, history: QueueHistory, settled: set[str], stop: asyncio.Event
) -> None:
    async with AsyncClient(url, timeout=10) as client:
        while not stop.is_set():
            try:
                got = await client.receive(QUEUE, GROUP, max_messages=100, wait_seconds=0.2)
                for m in got:
                    history.delivered[m.text] += 1
                result = await client.ack(QUEUE, GROUP, [m.receipt or "" for m in got])
                stale = set(result["stale"])
                settled.update(m.text for m in got if m.receipt not in stale)
            except CheramiError:
                return


async def _run(server: ServerProcess) -> tuple[dict[str, int], set[str], QueueHistory]:
    async with AsyncClient(server.url) as client:
        await client.create_queue(QUEUE)
        await client.create_group(QUEUE, GROUP, visibility_timeout_seconds=2)
    history = QueueHistory()
    settled: set[str] = set()  # deliveries whose ack the server confirmed before the crash
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(_publish_until_killed(server.url, history, stop)),
        asyncio.create_task(_consume_some(server.url, history, settled, stop)),
    ]
    deadline = time.monotonic() + 30
    while len(history.acked) < 20_000 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.to_thread(server.kill)
    stop.set()
    await asyncio.gather(*tasks)
    assert len(history.acked) >= 20_000, "the node published too little before the kill"
    assert settled, "nothing was consumed before the kill"

    await asyncio.to_thread(server.start)
    redelivered_acked: set[str] = set()
    async with AsyncClient(server.url) as client:
        # what was open at the crash was looked at: sealed where a publish was under
        # way (its replicas differ), kept open where every replica agrees
        total, kept, sealed = recovered(server)
        assert total >= 1 and kept + sealed == total  # its plain extent (no timer one yet)
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < 3:
            got = await client.receive(QUEUE, GROUP, max_messages=1000, wait_seconds=0.5)
            if got:
                idle_since = time.monotonic()
            for m in got:
                history.delivered[m.text] += 1
                if m.text in settled:
                    redelivered_acked.add(m.text)
            if got:
                await client.ack(QUEUE, GROUP, [m.receipt or "" for m in got])
        stats = (await client.get_group(QUEUE, GROUP))["stats"]
    assert stats["backlog"] == 0
    return history.report(), redelivered_acked, history


async def test_sigkill_loses_no_acked_message(fresh_server: ServerProcess) -> None:
    fresh_server.start()
    report, redelivered_acked, history = await _run(fresh_server)
    print("crash test:", report, "acked deliveries redelivered:", len(redelivered_acked))
    assert report["lost"] == 0
    assert report["unexpected"] == 0
    assert not redelivered_acked, "a delivery acked before the crash came back"
    assert report["delivered"] >= report["acked"]


async def test_clean_restart_keeps_messages_and_ack_levels(fresh_server: ServerProcess) -> None:
    fresh_server.start()
    async with AsyncClient(fresh_server.url) as client:
        await client.create_queue("restart")
        await client.create_group("restart", "g")
        await client.create_group("restart", "idle")
        await client.publish("restart", [f"m{i}" for i in range(1000)])
        acked: set[str] = set()
        while len(acked) < 400:
            got = await client.receive("restart", "g", max_messages=100, wait_seconds=2)
            assert (await client.ack("restart", "g", [m.receipt or "" for m in got]))[
                "acked"
            ] == len(got)
            acked.update(m.text for m in got)
    assert fresh_server.stop() == 0
    fresh_server.start()
    async with AsyncClient(fresh_server.url) as client:
        rest = await drain(client, "restart", "g")
        assert sorted(rest + sorted(acked)) == sorted(f"m{i}" for i in range(1000))
        assert (await client.get_group("restart", "idle"))["stats"]["backlog"] == 1000
        queue = await client.get_queue("restart")
        assert queue["stats"]["messages_published"] == 1000


async def test_retention_deletes_consumed_extents(tmp_path: Path) -> None:
    """An extent rolled over by size stays while a group has not consumed it, is
    deleted once every group has, and that holds across a restart."""
    node = ServerProcess(tmp_path / "node", extra=["--extent-max-messages", "50"]).start()
    try:
        async with AsyncClient(node.url) as client:
            await client.create_queue("kept")
            await client.create_group("kept", "a")
            await client.create_group("kept", "b")
            await client.publish("kept", [f"m{i}" for i in range(100)])  # past 50: rolled
            await drain(client, "kept", "a", max_messages=100, wait_seconds=2)

            async def sealed() -> int:
                return int((await client.get_queue("kept"))["stats"]["sealed_extents"])

            for _ in range(50):
                if await sealed() == 1:
                    break
                await asyncio.sleep(0.2)
            assert await sealed() == 1  # group b has not consumed it: it stays
        assert node.stop() == 0
        node.start()
        async with AsyncClient(node.url) as client:
            assert await sealed() == 1
            got = await drain(client, "kept", "b", max_messages=100, wait_seconds=2)
            assert len(got) == 100
            for _ in range(50):  # now every group consumed it: deleted
                if await sealed() == 0:
                    break
                await asyncio.sleep(0.2)
            assert await sealed() == 0
            await client.publish("kept", ["after"])
            assert [m.text for m in await client.receive("kept", "b", wait_seconds=5)] == ["after"]
    finally:
        node.stop()
