"""The in-process store host (roles/storehost/inprocess.py, the roles' test double) holds
to the store host's contract: every case here runs against a store host process
(RocksDB on a small tmpfs of its own) and against the double, each reached through a
StoreDirectory as the roles reach them, so the double cannot drift from the real thing.

Appends are acked in order and repeats acked again without a write; a record is readable
once a commit says every replica holds it (or the extent is sealed); a waiting read
answers at that commit; a seal refuses later appends and can cut back; a timer extent
shows what is due; an unknown extent, a gap and a full disk are refused with their codes."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from cherami.errors import ExtentSealed, StorageFull, Unavailable
from cherami.metadata.models import Extent
from cherami.roles.storehost.client import StoreClient, StoreError, check_appended
from cherami.roles.storehost.directory import StoreDirectory
from cherami.roles.storehost.inprocess import InProcessStoreHost
from cherami.roles.storehost.process import StoreProcess
from cherami.wire.handshake import derive_key
from cherami.wire.store import PLAIN, TIMER, pack_records
from tests.support.smalldisk import small_disk

SECRET = b"the store contract's secret, 32b"
KEY = derive_key(SECRET)


class Store:
    """One store host under test, its client from a StoreDirectory, and its disk."""

    def __init__(self, directory: StoreDirectory, fill: Callable[[bool], None]) -> None:
        self.directory = directory
        self.client: StoreClient = directory.get("s0")
        self.fill_disk = fill


async def _no_address(store_id: str, address: str) -> None:
    return None


@pytest.fixture(params=["process", "inprocess"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "inprocess":
        host = InProcessStoreHost("s0", key=KEY)
        await host.start()
        directory = StoreDirectory(KEY, hosts=[host])
        await directory.set_address("s0", host.address)
        yield Store(directory, host.fill_disk)
        await directory.close()
        await host.stop()
        return
    with small_disk(tmp_path / "disk", 48) as disk:
        proc = StoreProcess("s0", str(disk / "s0"), "127.0.0.1", _no_address, SECRET)
        await proc.start()
        filler = disk / "filler"

        def fill(full: bool) -> None:
            if not full:
                filler.unlink()
                return
            left = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
            with open(filler, "wb") as f:  # leave under a megabyte: below the floor
                f.write(b"\0" * max(0, left - (512 << 10)))

        directory = StoreDirectory(KEY)
        await directory.set_address("s0", proc.address)
        try:
            yield Store(directory, fill)
        finally:
            await directory.close()
            await proc.stop()


async def _until(check: Callable[[], Awaitable[bool]], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, "not in time"
        await asyncio.sleep(0.02)


async def _append(client: StoreClient, extent: str, first: int, n: int) -> int:
    await client.connect()
    records = [f"{extent}-{i}".encode() for i in range(first, first + n)]
    return check_appended(await client.append_nowait(extent, first, pack_records(records), None))


async def test_appends_are_acked_in_order_and_read_once_committed(store: Store) -> None:
    c = store.client
    await c.create_extent("e1", PLAIN)
    await c.create_extent("e1", PLAIN)  # again: changes nothing
    assert await _append(c, "e1", 1, 3) == 3
    assert await _append(c, "e1", 4, 2) == 5
    assert await _append(c, "e1", 1, 3) == 5  # a repeat: acked, not written again
    before = await c.read("e1", b"", 100)
    assert before.records == [] and not before.end  # no commit yet: nothing shown
    c.commit_nowait("e1", 2)
    await _until(lambda: _count(c, "e1", 2))
    c.commit_nowait("e1", 5)
    await _until(lambda: _count(c, "e1", 5))
    read = await c.read("e1", b"", 100)
    assert read.records == [f"e1-{i}".encode() for i in range(1, 6)]
    rest = await c.read("e1", read.keys[1], 100)
    assert rest.records == read.records[2:]
    (info,) = await c.info(["e1"])
    assert (info.kind, info.last_seq, info.count, info.sealed) == (PLAIN, 5, 5, False)
    extent = Extent(
        id="e1", queue="q", kind=PLAIN, status="open", input_host="", stores=["s0"], created_at=0.0
    )
    assert (await store.directory.info(extent)).last_seq == 5
    assert (await store.directory.read(extent, b"", 2)).records == read.records[:2]


async def _count(c: StoreClient, extent: str, n: int) -> bool:
    return len((await c.read(extent, b"", 100)).records) == n


async def test_a_waiting_read_answers_at_the_commit(store: Store) -> None:
    c = store.client
    await c.create_extent("e2", PLAIN)
    waiting = asyncio.create_task(c.read("e2", b"", 10, wait_ms=10_000))
    assert await _append(c, "e2", 1, 2) == 2
    await asyncio.sleep(0.05)  # not a synchronisation: the append alone must not wake it
    assert not waiting.done()
    c.commit_nowait("e2", 2)
    async with asyncio.timeout(5):
        read = await waiting
    assert read.records == [b"e2-1", b"e2-2"]
    short = await c.read("e2", read.keys[-1], 10, wait_ms=50)  # nothing comes: empty
    assert short.records == [] and not short.end


async def test_a_seal_refuses_later_appends_shows_all_and_can_cut_back(store: Store) -> None:
    c = store.client
    await c.create_extent("e3", PLAIN)
    await _append(c, "e3", 1, 6)  # never committed: a seal shows all it keeps
    assert await c.seal("e3") == 6
    with pytest.raises(ExtentSealed):
        await _append(c, "e3", 7, 1)
    assert await _append(c, "e3", 1, 6) == 6  # a repeat of what it holds is still acked
    assert await c.seal("e3", at_seq=4) == 4  # settled on what every replica holds
    assert await c.seal("e3", at_seq=5) == 4  # never grows back
    read = await c.read("e3", b"", 100)
    assert read.records == [f"e3-{i}".encode() for i in range(1, 5)] and read.end
    (info,) = await c.info(["e3"])
    assert info.sealed and info.last_seq == info.count == 4


async def test_unknown_extents_and_gaps_are_refused_with_their_codes(store: Store) -> None:
    c = store.client
    with pytest.raises(StoreError) as unknown:
        await _append(c, "nope", 1, 1)
    assert unknown.value.code == "extent_not_found"
    with pytest.raises(StoreError) as unread:
        await c.read("nope", b"", 1)
    assert unread.value.code == "extent_not_found"
    (info,) = await c.info(["nope"])
    assert not info.exists
    await c.create_extent("e4", PLAIN)
    await _append(c, "e4", 1, 2)
    with pytest.raises(StoreError) as gap:
        await _append(c, "e4", 4, 1)
    assert gap.value.code == "sequence_gap"
    with pytest.raises(StoreError) as kind:
        await c.create_extent("e5", "other")
    assert kind.value.code == "invalid_request"
    await c.drop("e4")
    assert not (await c.info(["e4"]))[0].exists


async def test_a_timer_extent_shows_what_is_due(store: Store) -> None:
    c = store.client
    await c.create_extent("t1", TIMER)
    now = int(time.time() * 1000)
    await c.connect()
    records = pack_records([b"late", b"due"])
    reply = await c.append_nowait("t1", 1, records, [now + 3_600_000, now - 1000])
    assert check_appended(reply) == 2
    c.commit_nowait("t1", 2)

    async def due() -> bool:
        return (await c.read("t1", b"", 10, until_ms=now)).records == [b"due"]

    await _until(due)  # ordered by delivery time; the late one is not due
    assert len((await c.read("t1", b"", 10, until_ms=now + 3_600_000)).records) == 2


async def test_a_full_disk_refuses_appends_and_new_extents_with_storage_full(
    store: Store,
) -> None:
    c = store.client
    await c.create_extent("f1", PLAIN)
    assert await _append(c, "f1", 1, 1) == 1
    store.fill_disk(True)

    async def refused() -> bool:
        try:
            await _append(c, "f1", 2, 1)
        except StorageFull:
            return True
        return False

    await _until(refused)  # the store looks at its disk every 0.1 s
    with pytest.raises(StorageFull):
        await c.create_extent("f2", PLAIN)
    store.fill_disk(False)

    async def taken() -> bool:
        try:
            return await _append(c, "f1", 2, 1) == 2
        except StorageFull:
            return False

    await _until(taken)
    (info,) = await c.info(["f1"])
    assert info.last_seq == 2


async def test_the_double_cut_fails_what_waits_and_the_client_connects_again() -> None:
    """The double's own fault: ``cut`` drops its connections as a cut-off store host's
    drop (a waiting read fails Unavailable), a stopped one refuses connections, and the
    directory reaches a TCP address over TCP, never through a pipe."""
    host = InProcessStoreHost("s0", key=KEY)
    await host.start()
    directory = StoreDirectory(KEY, hosts=[host])
    await directory.set_address("s0", host.address)
    await directory.set_address("s1", "127.0.0.1:1")  # nothing listens there
    c = directory.get("s0")
    try:
        await c.create_extent("e", PLAIN)
        waiting = asyncio.create_task(c.read("e", b"", 10, wait_ms=10_000))
        await _until(lambda: _pending(c))
        host.cut()
        with pytest.raises(Unavailable):
            await waiting
        assert await _append(c, "e", 1, 1) == 1  # connected again
        with pytest.raises(Unavailable, match="127.0.0.1:1"):
            await directory.get("s1").info(["e"])
        await host.stop()
        with pytest.raises(Unavailable):
            await c.info(["e"])
    finally:
        await directory.close()


async def _pending(c: StoreClient) -> bool:
    return bool(c._pending)  # the read was sent and waits for its answer
