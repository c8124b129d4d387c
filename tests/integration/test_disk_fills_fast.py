"""A node on a small disk that a fast producer fills is refused before the disk is full
(issue 33, part 2).

A 96 MB tmpfs with 16 MB taken by a filler holds the node's data directory (3 store
hosts and the SQLite metadata on the one disk). Batches of 50 random 4 KB messages are
published over HTTP as fast as they are acked. Before, the store hosts looked at the free
disk at most every 0.1 s, and the producer wrote 14 MB between two looks: the disk
reached 100%, SQLite logged `database or disk is full`, RocksDB's flush of the journal's
records failed for want of room, and publishes waited tens of seconds before being
refused. Now every refusal is a 429 `storage_full` answered within a second, the disk
never fills, no log line tells of a failed write, every acked message is delivered, and
publishing resumes by itself once the filler is removed. Needs root (mount)."""

from __future__ import annotations

import base64
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.errors import StorageFull, Unavailable
from tests.support.server import ServerProcess
from tests.support.smalldisk import small_disk as tmpfs

DISK_MB, FILLER_MB = 96, 16
BATCH, BODY_BYTES = 50, 4096
BAD_LINES = ("short write", "disk is full", "No space", "Traceback", "ERROR")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "disk", DISK_MB) as disk:
        yield disk


def _bodies(start: int) -> list[str]:
    """Incompressible 4 KB bodies that name their number (RocksDB compresses its files:
    repeated bytes would fit anywhere)."""
    raw = (BODY_BYTES - 12) * 3 // 4
    return [f"{start + i:010d}:" + base64.b64encode(os.urandom(raw)).decode() for i in range(BATCH)]


async def test_a_filling_disk_is_refused_before_it_is_full(small_disk: Path) -> None:
    filler = small_disk / "filler"
    with open(filler, "wb") as f:
        f.write(b"\0" * (FILLER_MB << 20))
    server = ServerProcess(small_disk / "node").start()
    acked: set[str] = set()
    refusals: list[float] = []  # seconds each refused publish took
    least_free = shutil.disk_usage(small_disk).free
    try:
        async with AsyncClient(server.url, timeout=30, throttled_retry_seconds=0) as client:
            await client.create_queue("fill")
            await client.create_group("fill", "g")
            n = 0
            deadline = time.monotonic() + 120
            while len(refusals) < 10:
                assert time.monotonic() < deadline, f"no refusal: {len(acked)} acked"
                bodies = _bodies(n)
                n += BATCH
                started = time.monotonic()
                try:
                    await client.publish("fill", bodies, retry_seconds=0)
                    acked.update(b[:10] for b in bodies)
                except StorageFull:
                    refusals.append(time.monotonic() - started)
                least_free = min(least_free, shutil.disk_usage(small_disk).free)
            full_at = shutil.disk_usage(small_disk)
            print(f"\n{len(acked)} acked, then refused at {full_at.used / full_at.total:.0%} "
                  f"used ({full_at.free:,} bytes free, least {least_free:,}); refusals took "
                  f"{max(refusals):.3f} s at most")  # fmt: skip
            assert max(refusals) < 1.0, refusals
            assert least_free > 0
            filler.unlink()  # space freed: publishing resumes by itself
            resumed = time.monotonic() + 30
            while True:
                bodies = _bodies(n)
                n += BATCH
                try:
                    await client.publish("fill", bodies, retry_seconds=0)
                    acked.update(b[:10] for b in bodies)
                    break
                except (StorageFull, Unavailable):  # an extent refused may be replaced
                    assert time.monotonic() < resumed, "publishing did not resume"
            got: set[str] = set()
            drained = time.monotonic() + 60
            while len(got) < len(acked) and time.monotonic() < drained:
                batch = await client.receive("fill", "g", max_messages=500, wait_seconds=1)
                got.update(m.text[:10] for m in batch)
                if batch:
                    await client.ack("fill", "g", batch)
            assert acked - got == set(), f"lost {len(acked - got)} of {len(acked)}"
    finally:
        code = server.stop()
    bad = [line for line in server.output if any(b in line for b in BAD_LINES)]
    assert not bad, "\n".join(bad[:10])
    assert code == 0
