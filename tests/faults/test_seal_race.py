"""Extents sealed while producers append to them (retention rolling small extents over)
must keep every acked message: a seal that looked at the replicas first and sealed them
afterwards lost the appends acked in between."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cherami.client.asyncclient import AsyncClient
from tests.support.checker import QueueHistory
from tests.support.server import ServerProcess

QUEUE, GROUP = "rolling", "g"
PUBLISH_SECONDS = 5.0  # retention looks every 2 s: a few rolls while appends are in flight


async def test_extents_sealed_under_load_keep_every_acked_message(tmp_path: Path) -> None:
    node = ServerProcess(tmp_path / "node", extra=["--extent-max-messages", "3000"]).start()
    history = QueueHistory()
    try:
        async with AsyncClient(node.url, timeout=30) as client:
            await client.create_queue(QUEUE)
            await client.create_group(QUEUE, GROUP, visibility_timeout_seconds=60)
            async with client.publisher(QUEUE, max_in_flight=16) as pub:
                futures = []
                deadline = asyncio.get_running_loop().time() + PUBLISH_SECONDS
                n = 0
                while asyncio.get_running_loop().time() < deadline:
                    bodies = [f"m{i}" for i in range(n, n + 100)]
                    history.attempted.update(bodies)
                    future = await pub.send(bodies)
                    future.add_done_callback(
                        lambda f, b=bodies: None if f.exception() else history.acked.update(b)
                    )
                    futures.append(future)
                    n += 100
                await asyncio.gather(*futures, return_exceptions=True)
            stats = (await client.get_queue(QUEUE))["stats"]
            async with client.consumer(QUEUE, GROUP, credit=2000) as consumer:
                while True:
                    batch = await consumer.get_batch(1000, timeout=5)
                    if not batch:
                        break
                    history.delivered.update(m.text for m in batch)
                    consumer.ack(*batch)
    finally:
        node.stop()
    report = history.report()
    print("seal race:", report, stats)
    assert stats["sealed_extents"] >= 2, "retention never rolled an extent during the run"
    assert report["acked"] > 0.9 * report["attempted"]
    assert report["lost"] == 0 and report["unexpected"] == 0, report
