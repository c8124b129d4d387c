"""The output host's ack-level committer, stopped in the middle of a write (a SIGTERM
while a flush waits on the metadata store): the stop cancelled the write after the
levels had been taken from the groups, so its last flush found nothing to write and
the acks were redelivered after the restart, and the settlements that waited for that
write were never answered. Logic only: the store and the groups are stand-ins."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from cherami.metadata.models import AckLevel, Fence, Group, GroupConfig
from cherami.roles.outputhost.committer import AckCommitter


class _Parked:
    pending = False


class _Consumer:
    """What the committer asks of a GroupConsumer: one extent's ack level to write."""

    def __init__(self, queue: str, name: str, acked: int) -> None:
        self.group = Group(queue=queue, name=name, config=GroupConfig(), created_at=0.0, start_ms=0,
                           dlq=f"{queue}.{name}.dlq")  # fmt: skip
        self.key = f"{queue}/{name}"
        self.cursors = {"e1": None}
        self.stopped = False
        self.parked = _Parked()
        self.acked, self.dirty = acked, True

    def unwritten(self) -> set[str]:
        return {"e1"} if self.dirty else set()

    def dirty_levels(self, extents: set[str] | None = None) -> list[AckLevel]:
        if not self.dirty:
            return []
        self.dirty = False
        return [AckLevel(queue=self.group.queue, group=self.group.name, extent="e1",
                         level=bytes([self.acked]), acked=self.acked)]  # fmt: skip

    def unwritten_again(self, extents: set[str] | None = None) -> None:
        self.dirty = True


class _Holdings:
    def fence(self, queue: str, group: str, extent: str) -> Fence:
        return Fence(lease=f"group:{queue}/{group}/{extent}", epoch=1)

    def fenced(self, queue: str, group: str, extent: str) -> None:
        raise AssertionError("no fence is stale here")


class _Store:
    """Its first write waits until cancelled; the others are kept."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.written: list[AckLevel] = []

    async def put_fenced_ack_levels(
        self, writes: Sequence[tuple[Fence, list[AckLevel]]]
    ) -> set[Fence]:
        if not self.entered.is_set():
            self.entered.set()
            await asyncio.Event().wait()  # a store that does not answer before the stop
        self.written += [level for _, levels in writes for level in levels]
        return set()


async def test_a_write_cut_short_by_a_stop_is_written_by_the_last_flush() -> None:
    store, consumer = _Store(), _Consumer("q", "g", acked=7)
    groups: dict[str, Any] = {consumer.key: consumer}
    committer = AckCommitter(store, groups, _Holdings(), lambda: False, 0.005)  # type: ignore[arg-type]
    committer.start()
    committer.mark(consumer.key)
    settled = asyncio.ensure_future(committer.flushed(consumer))  # type: ignore[arg-type]
    async with asyncio.timeout(10):
        await store.entered.wait()  # the flush's write is under way
        await committer.stop()
        assert [(a.extent, a.acked) for a in store.written] == [("e1", 7)]  # before: []
        assert await settled is None  # before: never answered
    assert not consumer.dirty
