"""The SQLite metadata store commits writes that come together in one transaction (one
sync of the log for all of them: sqlite_commit.py), each atomic on its own."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from cherami.errors import AlreadyExists, Fenced
from cherami.metadata.models import OPEN, Extent, Fence, Queue, QueueConfig
from cherami.metadata.sqlite import SqliteMetadataStore


def _queue(name: str) -> Queue:
    return Queue(name=name, config=QueueConfig(replicas=1), created_at=time.time())


async def test_writes_that_come_together_share_a_commit(tmp_path: Path) -> None:
    meta = SqliteMetadataStore(str(tmp_path / "m.db"))
    await meta.insert_queue(_queue("taken"))
    commits = []
    meta._writer_db.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)
    names = [f"q{i}" for i in range(60)] + ["taken"] * 5
    results = await asyncio.gather(
        *(meta.insert_queue(_queue(n)) for n in names), return_exceptions=True
    )
    # the 5 that name a queue made before fail alone; the 60 others are there
    assert [type(r) for r in results[60:]] == [AlreadyExists] * 5
    assert results[:60] == [None] * 60
    listed = {q.name for q in await meta.list_queues()}
    assert listed == {"taken", *names[:60]}
    assert 1 <= len(commits) <= 10, commits  # 65 writes, not 65 syncs
    await meta.close()


async def test_a_fenced_write_fails_alone_and_leaves_no_part(tmp_path: Path) -> None:
    meta = SqliteMetadataStore(str(tmp_path / "m.db"))
    await meta.insert_queue(_queue("q"))
    epoch = await meta.try_lease("leader", "c1", 30)
    assert epoch is not None

    def extent(i: int) -> Extent:
        return Extent(
            id=f"e{i}", queue="q", kind="plain", status=OPEN, input_host="i0",
            stores=["s0"], created_at=time.time(),
        )  # fmt: skip

    stale = Fence(lease="leader", epoch=epoch + 1)
    good = Fence(lease="leader", epoch=epoch)
    results = await asyncio.gather(
        *(meta.insert_extent(extent(i), fence=stale if i % 2 else good) for i in range(10)),
        return_exceptions=True,
    )
    assert results[0::2] == [True] * 5
    assert all(isinstance(r, Fenced) for r in results[1::2])
    assert sorted(e.id for e in await meta.list_extents("q")) == ["e0", "e2", "e4", "e6", "e8"]
    await meta.close()


async def test_a_write_answers_after_it_is_committed(tmp_path: Path) -> None:
    """What a write returned is there for another connection to read (it was committed
    before the answer), and a store opened again finds it."""
    path = str(tmp_path / "m.db")
    meta = SqliteMetadataStore(path)
    await asyncio.gather(*(meta.insert_queue(_queue(f"q{i}")) for i in range(20)))
    other = SqliteMetadataStore(path)
    assert len(await other.list_queues()) == 20
    await other.close()
    await meta.close()
    again = SqliteMetadataStore(path)
    assert len(await again.list_queues()) == 20
    await again.close()
