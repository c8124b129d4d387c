"""A store host's load reports (loadmeter.py) over its real wire protocol: a report reads
the extents appended to or read from since the last one, not every extent the host
holds (issue 29: a store host's idle CPU grew with its extents, each report copying
every extent's counters every 2 s)."""

from __future__ import annotations

from cherami.loadmeter import LoadMeter, LoadSources
from cherami.roles.storehost.client import StoreClient, check_appended
from cherami.roles.storehost.server import StoreHostService
from cherami.storage.memory import MemoryExtentStore
from cherami.wire.handshake import derive_key
from cherami.wire.store import PLAIN, pack_records

SECRET = b"a store host's test secret, 32 b"
EXTENTS = 100


async def _append_and_read(client: StoreClient, extent: str, seq: int) -> None:
    appended = client.append_nowait(extent, seq, pack_records([b"x" * 10]), None)
    assert check_appended(await appended) == seq
    client.commit_nowait(extent, seq)
    read = await client.read(extent, b"", 100)
    assert len(read.records) == seq


async def test_a_report_reads_only_the_extents_that_moved() -> None:
    service = StoreHostService(MemoryExtentStore(), key=derive_key(SECRET))
    await service.start()
    client = StoreClient("s0", service.address, key=derive_key(SECRET))
    now = [100.0]
    meter = LoadMeter(
        LoadSources(changes=service.extent_changes, open_extents=service.open_extents),
        interval=2.0, clock=lambda: now[0], cpu_clock=lambda: 0.0,
    )  # fmt: skip
    try:
        for i in range(EXTENTS):
            await client.create_extent(f"e{i}", PLAIN)
            await _append_and_read(client, f"e{i}", 1)
        now[0] += 2
        first = meter.report()
        assert first is not None and len(first.extents) == EXTENTS
        load = first.extents["e7"]
        assert (load.msgs_in, load.bytes_in, load.msgs_out) == (0.5, 5.0, 0.5)

        version = service.activity.version
        now[0] += 2
        idle = meter.report()
        assert idle is not None and idle.extents == {}
        assert service.extent_changes(version) == (version, {})  # nothing walked

        await _append_and_read(client, "e7", 2)  # one more, read with the first
        version, changed = service.extent_changes(version)
        assert changed == {"e7": ("e7", (2, 20, 3, 30))}
        now[0] += 2
        busy = meter.report()
        assert busy is not None and list(busy.extents) == ["e7"]
        assert (busy.extents["e7"].msgs_in, busy.extents["e7"].msgs_out) == (0.5, 1.0)

        await client.drop("e7")
        assert service.extent_changes(version)[1] == {"e7": None}
    finally:
        await client.close()
        await service.stop()
