"""Recovery asks a store host that is slow to answer again before it counts its replicas
as unknown (an unanswered ask sealed every extent with a replica there: at 10,000
queues, tens of thousands of seals and opens at a node's start)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from cherami.errors import Unavailable
from cherami.metadata.models import OPEN, Extent, Queue, QueueConfig
from cherami.metadata.sqlite import SqliteMetadataStore
from cherami.roles.controller import recovery
from cherami.wire.store import PLAIN, ExtentInfo


class _Replica:
    """A store host's client: its first ``slow`` info asks fail as a timeout would."""

    def __init__(self, store_id: str, slow: int) -> None:
        self.store_id = store_id
        self.slow = slow
        self.asks = 0
        self.committed: list[tuple[str, int]] = []

    async def info(self, extents: list[str], timeout: float = 3.0) -> list[ExtentInfo]:
        self.asks += 1
        if self.asks <= self.slow:
            raise Unavailable(f"store {self.store_id} did not answer in {timeout}s")
        return [ExtentInfo(extent=e, kind=PLAIN, last_seq=7, count=7, bytes=70, sealed=False,
                           exists=e != "_ping")
                for e in extents]  # fmt: skip

    def commit_nowait(self, extent: str, seq: int) -> None:
        self.committed.append((extent, seq))


class _Stores:
    def __init__(self, replicas: dict[str, _Replica]) -> None:
        self.replicas = replicas

    def get(self, store_id: str) -> _Replica:
        return self.replicas[store_id]


async def test_a_store_host_slow_to_answer_is_asked_again(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(recovery.asyncio, "sleep", _no_pause)
    meta = SqliteMetadataStore(str(tmp_path / "meta.db"))
    try:
        await meta.insert_queue(Queue(name="q", config=QueueConfig(), created_at=time.time()))
        for i in range(3):
            await meta.insert_extent(Extent(id=f"e{i}", queue="q", kind=PLAIN, status=OPEN,
                                            input_host="in", stores=["s0", "s1", "s2"],
                                            created_at=time.time()))  # fmt: skip
        replicas = {"s0": _Replica("s0", 0), "s1": _Replica("s1", 2), "s2": _Replica("s2", 0)}
        sealed: list[str] = []

        async def seal(extent: Extent) -> int:
            sealed.append(extent.id)
            return 0

        async def ensure(queue: str) -> None:
            pass

        locks: dict[str, asyncio.Lock] = {}
        r = recovery.Recovery(
            meta, _Stores(replicas), seal, lambda q: locks.setdefault(q, asyncio.Lock()),  # type: ignore[arg-type]
            ensure,
        )  # fmt: skip
        await r.recover()
        assert sealed == []  # s1 answered at its third ask: every extent kept open
        assert replicas["s1"].asks == 3 + 1  # three for the ends, one ping after the commits
        assert sorted(replicas["s1"].committed) == [("e0", 7), ("e1", 7), ("e2", 7)]
        replicas["s1"].slow = 100  # never answers: its extents cannot be known, and are sealed
        replicas["s1"].asks = 0
        await r.recover()
        assert sorted(sealed) == ["e0", "e1", "e2"]
    finally:
        await meta.close()


_sleep = asyncio.sleep


async def _no_pause(seconds: float) -> None:
    await _sleep(0)
