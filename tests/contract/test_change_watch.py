"""MetadataStore.watch_changes: PostgreSQL notifies a listener of every write the change
log records (a queue made by one store, seen by another's listener, as a frontend's
write reaches the leading controller); SQLite has no listener (a node's process
writes and reads). Waits on the listener with a deadline."""

from __future__ import annotations

import asyncio

import pytest

from cherami.metadata.models import Queue, QueueConfig
from tests.contract.conftest import MetadataBackend

WAIT = 10.0


async def test_a_write_in_the_change_log_wakes_a_listener(
    metadata_backend: MetadataBackend,
) -> None:
    writer, reader = await metadata_backend.open(), await metadata_backend.open()
    woken = asyncio.Event()
    watch = reader.watch_changes(woken.set)
    if metadata_backend.kind == "sqlite":
        assert watch is None
        return
    assert watch is not None
    try:
        await asyncio.wait_for(woken.wait(), WAIT)  # once when it starts listening
        woken.clear()
        await writer.insert_queue(Queue(name="q", config=QueueConfig(), created_at=0.0))
        await asyncio.wait_for(woken.wait(), WAIT)
        woken.clear()
        with pytest.raises(TimeoutError):  # nothing written: no wake
            await asyncio.wait_for(woken.wait(), 0.5)
    finally:
        await watch.stop()
