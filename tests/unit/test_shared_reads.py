"""Groups of one output host share reads of a plain extent position: one store read for
groups asking at once or a moment apart; a failed or cancelled read is not passed on to
the groups that waited for it; kept chunks stay within their byte budget; the end of a
sealed extent and empty reads are never kept. Store hosts are canned answers here."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cherami.errors import Unavailable
from cherami.roles.outputhost.sharedreads import SharedReads
from cherami.wire.keys import plain_key, seq_of
from cherami.wire.records import Record, encode_record
from cherami.wire.store import ReadResult


class _Replica:
    def __init__(self, last: int, fail: bool = False, gate: asyncio.Event | None = None) -> None:
        self.last, self.fail, self.gate = last, fail, gate
        self.reads = 0

    async def read(self, extent: str, after: bytes, max_count: int, **_: Any) -> ReadResult:
        self.reads += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise Unavailable("replica down")
        start = seq_of(after) + 1 if after else 1
        seqs = list(range(start, min(self.last, start + max_count - 1) + 1))
        records = [encode_record(Record(1, 1, b"x" * 100)) for _ in seqs]
        end = (seqs[-1] if seqs else start - 1) >= self.last
        return ReadResult(0, [plain_key(s) for s in seqs], records, end)


class _Stores:
    def __init__(self, **replicas: _Replica) -> None:
        self.replicas = replicas

    def get(self, store_id: str) -> _Replica:
        return self.replicas[store_id]


def _shared(**replicas: _Replica) -> SharedReads:
    return SharedReads(_Stores(**replicas), keep_bytes=10_000)  # type: ignore[arg-type]


Task = asyncio.Task[Any]


async def _two_groups(lead: _Replica, follow: _Replica) -> tuple[SharedReads, Task, Task]:
    """Group 1 reads position 0 of e1 from ``lead`` (held until lead.gate is set), then
    group 2 asks for the same position from ``follow`` while that read is under way."""
    reads = _shared(lead=lead, follow=follow)
    leader = asyncio.create_task(reads.read("lead", "e1", b"", 10, 0))
    await asyncio.sleep(0)
    follower = asyncio.create_task(reads.read("follow", "e1", b"", 10, 0))
    await asyncio.sleep(0)
    return reads, leader, follower


def test_groups_reading_one_position_at_once_share_one_store_read() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        a, b = _Replica(100, gate=gate), _Replica(100)
        reads, first, second = await _two_groups(a, b)
        gate.set()
        one, two = await asyncio.gather(first, second)
        assert one is two and one.store_id == "lead"
        assert one.ids == [f"e1:{s}" for s in range(1, 11)]
        assert (a.reads, b.reads, reads.store_reads) == (1, 0, 1)
        # a moment later: answered from the kept chunk; the next position is a new read
        assert await reads.read("follow", "e1", b"", 10, 0) is one
        nxt = await reads.read("follow", "e1", one.keys[-1], 10, 0)
        assert nxt.ids[0] == "e1:11" and (b.reads, reads.store_reads) == (1, 2)

    asyncio.run(main())


def test_a_failed_read_is_not_passed_on_to_the_groups_waiting_for_it() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        down, up = _Replica(100, fail=True, gate=gate), _Replica(100)
        _, leader, follower = await _two_groups(down, up)
        gate.set()
        with pytest.raises(Unavailable):
            await leader
        chunk = await follower  # read again from its own replica
        assert chunk.store_id == "follow" and len(chunk.keys) == 10 and up.reads == 1

    asyncio.run(main())


def test_a_cancelled_read_lets_the_waiting_group_read_for_itself() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        _, leader, follower = await _two_groups(_Replica(100, gate=gate), _Replica(100))
        leader.cancel()
        chunk = await asyncio.wait_for(follower, 2)
        assert chunk.store_id == "follow" and leader.cancelled() and not gate.is_set()

    asyncio.run(main())


def test_kept_chunks_stay_within_the_budget_and_ends_are_not_kept() -> None:
    async def main() -> None:
        replica = _Replica(95)
        reads = SharedReads(_Stores(r=replica), keep_bytes=5_000)  # type: ignore[arg-type]
        positions, chunks = [b""], []
        while True:  # 10 chunks of about 1,100 record bytes each, the last one the end
            chunk = await reads.read("r", "e1", positions[-1], 10, 0)
            chunks.append(chunk)
            if chunk.end:
                break
            positions.append(chunk.keys[-1])
        assert len(chunks) == 10 and chunks[-1].end and len(chunks[-1].keys) == 5
        assert 0 < reads._kept_bytes <= 5_000
        before = replica.reads
        assert await reads.read("r", "e1", positions[8], 10, 0) is chunks[8]  # kept
        assert replica.reads == before
        assert await reads.read("r", "e1", positions[9], 10, 0) is not chunks[9]  # the end
        assert await reads.read("r", "e1", positions[0], 10, 0) is not chunks[0]  # evicted
        assert replica.reads == before + 2

    asyncio.run(main())
