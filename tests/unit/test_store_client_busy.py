"""A store host that answers others but not one request is busy, not gone: that request
alone fails, and the reads waiting on the same connection go on waiting (dropping the
connection failed every read of every idle group of a node, thousands, whose retries
made a loaded store host slower still). A host that answers nothing at all is still
dropped. Run on the in-process store host (the store host's own service and client)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from cherami.errors import Unavailable
from cherami.roles.outputhost.extentreader import TAIL_WAIT_MS, tail_wait_ms
from cherami.roles.storehost.client import StoreClient
from cherami.roles.storehost.directory import StoreDirectory
from cherami.roles.storehost.inprocess import InProcessStoreHost
from cherami.wire import store as w
from cherami.wire.handshake import derive_key
from cherami.wire.store import PLAIN

KEY = derive_key(b"the busy store test's secret, 32")


@pytest.fixture
async def host() -> AsyncIterator[tuple[InProcessStoreHost, StoreClient, asyncio.Event]]:
    """A store host whose creations of extent 'slow' wait until the event is set."""
    host = InProcessStoreHost("s0", key=KEY)
    await host.start()
    release = asyncio.Event()
    handle = host.service._handle

    async def slow_handle(request: w.Request) -> w.Reply:
        if isinstance(request, w.CreateExtent) and request.extent == "slow":
            await release.wait()
        return await handle(request)

    host.service._handle = slow_handle  # type: ignore[method-assign]
    directory = StoreDirectory(KEY, hosts=[host])
    await directory.set_address("s0", host.address)
    try:
        yield host, directory.get("s0"), release
    finally:
        release.set()
        await directory.close()
        await host.stop()


async def _until(check: Callable[[], Awaitable[bool] | bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        done = check()
        if done if isinstance(done, bool) else await done:
            return
        assert time.monotonic() < deadline, "not in time"
        await asyncio.sleep(0.02)


async def test_one_late_answer_fails_alone_while_the_host_answers_others(
    host: tuple[InProcessStoreHost, StoreClient, asyncio.Event],
) -> None:
    _, client, _ = host
    await client.create_extent("e", PLAIN)
    waiting = asyncio.create_task(client.read("e", b"", 10, wait_ms=20_000))
    await _until(lambda: bool(client._pending))
    connection = client._writer

    async def ask_often() -> None:  # the host answers these all along
        while True:
            await client.info(["e"])
            await asyncio.sleep(0.02)

    asker = asyncio.create_task(ask_often())
    try:
        with pytest.raises(Unavailable, match="busy"):
            await client.call(w.CreateExtent, "slow", PLAIN, timeout=0.5)
        assert not waiting.done()  # the read still waits, on the same connection
        assert client._writer is connection
        assert await client.info(["e"])  # and the connection serves
    finally:
        asker.cancel()
        waiting.cancel()
        await asyncio.gather(asker, waiting, return_exceptions=True)


async def test_a_host_that_answers_nothing_is_still_dropped(
    host: tuple[InProcessStoreHost, StoreClient, asyncio.Event],
) -> None:
    _, client, _ = host
    await client.create_extent("e", PLAIN)
    waiting = asyncio.create_task(client.read("e", b"", 10, wait_ms=20_000))
    await _until(lambda: bool(client._pending))
    await _until(lambda: time.monotonic() - client._replied_at > 0.5)  # no answer since
    with pytest.raises(Unavailable) as failed:
        await client.call(w.CreateExtent, "slow", PLAIN, timeout=0.5)
    assert "busy" not in str(failed.value)
    with pytest.raises(Unavailable):
        await waiting  # failed with the connection, which was dropped


def test_idle_reads_end_spread_over_a_fifth_of_their_wait() -> None:
    """The reads of many idle groups loaded together (a restart) do not all end in the
    same second ten minutes later: each waits between 80% and all of TAIL_WAIT_MS."""
    assert tail_wait_ms(lambda: 0.0) == TAIL_WAIT_MS * 8 // 10
    assert tail_wait_ms(lambda: 0.999999) <= TAIL_WAIT_MS
    waits = {tail_wait_ms() // 1000 for _ in range(1000)}
    assert len(waits) > 60 and min(waits) >= 480 and max(waits) <= 600
