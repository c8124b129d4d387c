"""Back-pressure before the disk is full (issue 14): a node whose data directory is a
small tmpfs the test mounts. Publishing until the store hosts reach their free-disk floor
gets 429 ``storage_full`` (nothing of that batch stored) and /healthz says ``degraded``;
consuming and acking go on; once space is freed, publishing resumes by itself (the
client that waits on 429 gets through), and every acked message is delivered: lost 0.
The disk never fills, so RocksDB never enters its no-space state (which kept every
publish failing until a restart)."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.errors import StorageFull
from tests.support.server import ServerProcess
from tests.support.smalldisk import small_disk as tmpfs

DISK_MB = 192
BODY = b"x" * 16_000


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "disk", DISK_MB) as disk:
        yield disk


def _health(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url + "/healthz", timeout=5) as resp:
        result: dict[str, object] = json.load(resp)
        return result


@pytest.mark.timeout(240)
async def test_publishing_stops_at_the_floor_and_resumes_when_space_returns(
    small_disk: Path,
) -> None:
    node = ServerProcess(small_disk / "node").start()
    try:
        # leave about 45 MB free: the floor is 5% of the disk (9.6 MB)
        filler = small_disk / "filler"
        free = shutil.disk_usage(small_disk).free
        with open(filler, "wb") as f:
            f.truncate(0)
            f.write(b"\0" * max(0, free - 45_000_000))
        async with AsyncClient(node.url, throttled_retry_seconds=0) as client:
            await client.create_queue("fill", replicas=3)
            await client.create_group("fill", "workers")
            acked: set[str] = set()
            refused: StorageFull | None = None
            n = 0
            deadline = time.monotonic() + 120
            while refused is None and time.monotonic() < deadline:
                bodies = [f"{n + i}:".encode() + BODY for i in range(20)]
                try:
                    await client.publish("fill", bodies)
                except StorageFull as err:
                    refused = err
                    break
                acked.update(b.split(b":")[0].decode() for b in bodies)
                n += 20
                await asyncio.sleep(0.05)
            assert refused is not None, f"never refused; {len(acked)} acked"
            assert refused.retry_after > 0
            free_at_refusal = shutil.disk_usage(small_disk).free
            assert free_at_refusal > 0
            # the store hosts' next load reports (every 2 s) show the floor
            health = await asyncio.to_thread(_health, node.url)
            waited = time.monotonic() + 6
            while health["status"] != "degraded" and time.monotonic() < waited:
                await asyncio.sleep(0.2)
                health = await asyncio.to_thread(_health, node.url)
            assert health["status"] == "degraded", health
            assert health["storage_full"], health
            with pytest.raises(StorageFull):  # refused by the input host from the reports now
                await client.publish("fill", [b"refused:" + BODY])

            # consuming and acking go on while publishing is refused
            got: set[str] = set()
            while got != acked:
                batch = await client.receive("fill", "workers", max_messages=200, wait_seconds=2)
                assert batch, f"consuming stopped: {len(acked - got)} of {len(acked)} missing"
                got |= {m.body.split(b":")[0].decode() for m in batch}
                await client.ack("fill", "workers", [m.receipt or "" for m in batch])
            assert got == acked

        # space returns: a client that waits on 429 gets through by itself
        filler.unlink()
        async with AsyncClient(node.url, throttled_retry_seconds=60) as waiting:
            started = time.monotonic()
            ids = await waiting.publish("fill", [b"after:" + BODY])
            resumed_in = time.monotonic() - started
            batch = await waiting.receive("fill", "workers", max_messages=10, wait_seconds=5)
            assert [m.body[:6] for m in batch] == [b"after:"]
        health = await asyncio.to_thread(_health, node.url)
        print(
            f"\n=== disk floor: {len(acked)} acked before the floor, refused with "
            f"{free_at_refusal:,} bytes free of {DISK_MB} MB, all {len(got)} delivered after; "
            f"publishing resumed {resumed_in:.1f} s after space returned; ids {ids}; "
            f"health after {health}"
        )
        assert health["status"] == "ok", health
    finally:
        node.stop()
