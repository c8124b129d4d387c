"""A store host as a real child process, spoken to over its wire protocol: append rounds
run on its event loop while seals run in a thread, so the two must still happen one
after the other. A seal that lands between pipelined append rounds must leave exactly
the acked appends in the extent, readable in order, and refuse every later one."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from cherami.errors import Unavailable
from cherami.roles.storehost.client import StoreClient, check_appended
from cherami.roles.storehost.process import StoreProcess
from cherami.roles.storehost.server import StoreHostService
from cherami.storage.memory import MemoryExtentStore
from cherami.wire.handshake import derive_key
from cherami.wire.keys import seq_of
from cherami.wire.store import PLAIN, TIMER, array_header, pack_records

APPENDS, PER_APPEND = 300, 10
SECRET = b"a store host's test secret, 32 b"


async def _no_address(store_id: str, address: str) -> None:
    return None


async def test_a_seal_between_pipelined_append_rounds_keeps_exactly_the_acked_appends(
    tmp_path: Path,
) -> None:
    proc = StoreProcess("s0", str(tmp_path / "s0"), "127.0.0.1", _no_address, SECRET)
    await proc.start()
    client = StoreClient("s0", proc.address, key=derive_key(SECRET))
    try:
        for extent in ("e1", "e2", "e3"):  # the race is timing: try it more than once
            await _seal_mid_stream(client, extent)
    finally:
        await client.close()
        await proc.stop()


async def _seal_mid_stream(client: StoreClient, extent: str) -> None:
    await client.create_extent(extent, PLAIN)
    await client.connect()
    futures: list[asyncio.Future[Any]] = []
    seal: asyncio.Task[int] | None = None

    def append(i: int) -> None:
        records = [f"r{i * PER_APPEND + j + 1}".encode() for j in range(PER_APPEND)]
        futures.append(
            client.append_nowait(extent, i * PER_APPEND + 1, pack_records(records), None)
        )

    append(0)
    await futures[0]  # something is acked before the seal
    i = 1
    while i < APPENDS:
        for _ in range(min(10, APPENDS - i)):  # a few frames per turn: several rounds
            append(i)
            i += 1
        if seal is None and i >= APPENDS // 3:
            seal = asyncio.create_task(client.seal(extent))  # races the rounds in flight
        await asyncio.sleep(0.0005)
    assert seal is not None
    sealed_at = await seal
    append(APPENDS)  # after the seal's answer: refused for certain
    replies = await asyncio.gather(*futures, return_exceptions=True)

    acked: list[int] = []
    refused = 0
    for reply in replies:
        try:
            acked.append(check_appended(reply))  # type: ignore[arg-type]
        except Exception as err:  # noqa: BLE001 - every refusal must be a seal
            assert "sealed" in str(err), err
            refused += 1
    assert acked == sorted(acked), "appends were acked out of order"
    assert acked and refused, (len(acked), refused)  # the seal landed mid-stream
    assert acked[-1] == sealed_at == len(acked) * PER_APPEND
    assert len(acked) + refused == APPENDS + 1

    info = (await client.info([extent]))[0]
    assert info.sealed and info.last_seq == sealed_at
    read = await client.read(extent, b"", sealed_at + 100)
    assert read.records == [f"r{n}".encode() for n in range(1, sealed_at + 1)]
    assert read.end


async def test_packed_and_unpacked_appends_and_a_malformed_one(tmp_path: Path) -> None:
    """Appends with their size are kept packed, those without are decoded record by
    record: both read back alike. An append whose size its array cannot hold is a
    malformed frame: the connection closes (what waits on it fails), nothing of it is
    stored, and the next connection goes on."""
    proc = StoreProcess("s0", str(tmp_path / "s0"), "127.0.0.1", _no_address, SECRET)
    await proc.start()
    client = StoreClient("s0", proc.address, key=derive_key(SECRET))
    records = [f"r{n}".encode() * (n % 90) for n in range(1, 31)]  # bin8 and longer
    try:
        await client.create_extent("e1", PLAIN)
        await client.connect()
        size = sum(map(len, records[:10]))
        first = client.append_nowait("e1", 1, pack_records(records[:10]), None, size)
        second = client.append_nowait("e1", 11, pack_records(records[10:20]), None)
        assert [check_appended(await f) for f in (first, second)] == [10, 20]
        bad = client.append_nowait("e1", 21, pack_records(records[20:]), None, size=1)
        with pytest.raises(Unavailable):
            await bad
        await client.connect()
        size = sum(map(len, records[20:]))
        again = client.append_nowait("e1", 21, pack_records(records[20:]), None, size)
        assert check_appended(await again) == 30
        client.commit_nowait("e1", 30)  # readers see what every replica holds
        read = await client.read("e1", b"", 100)
        assert read.records == records and read.joined is None
        # a joined read: the same keys, the records behind one array header
        joined = await client.read("e1", read.keys[4], 100, joined=True)
        assert joined.keys == read.keys[5:] and joined.records == [] and joined.end is False
        assert bytes(joined.joined or b"") == array_header(25) + b"".join(records[5:])
        info = (await client.info(["e1"]))[0]
        assert (info.count, info.bytes) == (30, sum(map(len, records)))
    finally:
        await client.close()
        await proc.stop()


async def test_a_waiting_timer_read_answers_when_its_record_comes_due(tmp_path: Path) -> None:
    """A reader of a timer extent may wait long at the store host (an idle one costs
    nothing then): the record that comes due while it waits is given to it at once,
    not at the end of the wait."""
    proc = StoreProcess("s0", str(tmp_path / "s0"), "127.0.0.1", _no_address, SECRET)
    await proc.start()
    client = StoreClient("s0", proc.address, key=derive_key(SECRET))
    try:
        await client.create_extent("t1", TIMER)
        await client.connect()
        now = int(time.time() * 1000)
        due = [now + 400, now + 3_600_000]  # soon, and in an hour
        check_appended(await client.append_nowait("t1", 1, pack_records([b"soon", b"later"]), due))
        client.commit_nowait("t1", 2)
        # nothing is due yet; the read may wait 30 s, the test gives it 10 s
        async with asyncio.timeout(10):
            got = await client.read("t1", b"", 10, until_ms=now, wait_ms=30_000)
        assert [seq_of(k) for k in got.keys] == [1]
        assert int.from_bytes(got.keys[0][:8], "big") == due[0]
        # the one due in an hour is not given early: the wait runs out empty
        got = await client.read("t1", got.keys[0], 10, until_ms=now + 1000, wait_ms=300)
        assert got.keys == []
    finally:
        await client.close()
        await proc.stop()


async def test_a_long_read_on_a_store_host_that_stops_answering_fails_soon(
    tmp_path: Path,
) -> None:
    """Reads wait up to 30 s at the store host; one whose host stops answering (SIGSTOP:
    as a host cut off) fails within seconds, by the connection's liveness check, so its
    reader moves to another replica instead of waiting the read out."""
    proc = StoreProcess("s0", str(tmp_path / "s0"), "127.0.0.1", _no_address, SECRET)
    await proc.start()
    client = StoreClient("s0", proc.address, key=derive_key(SECRET))
    try:
        await client.create_extent("e1", PLAIN)
        read = asyncio.ensure_future(client.read("e1", b"", 10, wait_ms=30_000))
        await asyncio.sleep(0)  # sent
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            async with asyncio.timeout(10):
                with pytest.raises(Unavailable):
                    await read
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        # the next request connects again
        assert [i.exists for i in await client.info(["e1"])] == [True]
    finally:
        await client.close()
        await proc.stop()


async def test_silent_connections_are_capped_and_closed_after_the_hello_timeout() -> None:
    """A flood of connects that say nothing: past ``max_greeting`` of them waiting for
    their hello, one more is closed at once; each of the others is closed when its hello
    time is up, which frees the cap again. Every one is counted refused (/metrics)."""
    service = StoreHostService(
        MemoryExtentStore(), key=derive_key(SECRET), hello_timeout=3.0, max_greeting=20
    )
    await service.start()
    host, port = service.address.rsplit(":", 1)
    try:
        conns = [await asyncio.open_connection(host, int(port)) for _ in range(20)]
        deadline = time.monotonic() + 10
        while service.connections() < 20 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert service.connections() == 20
        extra, extra_writer = await asyncio.open_connection(host, int(port))
        assert await asyncio.wait_for(extra.read(), 2.0) == b""  # before the others' time
        assert service.refused == 1
        extra_writer.close()
        for reader, _ in conns:  # each closed by the server, without a byte
            assert await asyncio.wait_for(reader.read(), 10) == b""
        assert service.refused == 21
        late, late_writer = await asyncio.open_connection(host, int(port))
        while service.connections() < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert service.connections() == 1  # the cap freed: it waits for its hello
        late_writer.close()
        for _, writer in conns:
            writer.close()
    finally:
        await service.stop()


async def test_connections_that_send_no_hello_hold_little_and_leave_nothing(
    tmp_path: Path,
) -> None:
    """Each connection to a store host's port allocated a 256 KiB read buffer before its
    hello, so connects that sent nothing took a store host from 50 to 540 MB. Now one
    holds a few KiB until it has said its hello, and nothing stays once it is gone
    (measured with tracemalloc, with the store host's server in this process; its cap
    of connections yet to say their hello raised above the 300 it opens)."""
    service = StoreHostService(MemoryExtentStore(), key=derive_key(SECRET), max_greeting=400)
    await service.start()
    host, port = service.address.rsplit(":", 1)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        conns = [await asyncio.open_connection(host, int(port)) for _ in range(300)]
        deadline = time.monotonic() + 10
        while service.connections() < 300 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert service.connections() == 300
        held = tracemalloc.get_traced_memory()[0] - before
        assert held < 300 * 32 * 1024, f"{held / 300:.0f} bytes a silent connection"
        for _, writer in conns:
            writer.close()
        while service.connections() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert service.connections() == 0
        conns.clear()
        gc.collect()  # the test's own client connections refer to themselves too
        left = tracemalloc.get_traced_memory()[0] - before
        assert left < 1 << 20, f"{left} bytes left after every connection closed"
    finally:
        tracemalloc.stop()
        await service.stop()
