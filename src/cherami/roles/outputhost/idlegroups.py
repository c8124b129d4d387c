"""Idle groups on a node: loaded when asked for, unloaded when idle (issue 29).

A node's output host loads a group (its GroupConsumer: cursors, readers, read window,
timers) when something asks for it: a receive, a settle, a stream, or at the node's
start a group with parked messages. A loaded group is unloaded again once it has been
left alone for ``timing.group_idle_unload`` seconds with nothing that needs it loaded:
no stream open and no receive waiting, nothing in flight, no parked (redelivery) rows,
nothing on its way to the DLQ, every ack level and row written, and no ack above an ack
level (an ack there is not persisted: it would be delivered again). What is dropped
then is only what is read again from the persisted state: the messages read ahead and
not delivered yet. A group nobody consumes costs no reader, no store read and no
memory but what is kept here (its counters; its ack counts, read once, for its stats).

Unloaded groups' stats come from the metadata and the store hosts: the backlog is each
extent's message count above the group's persisted acked count; nothing is in flight."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cherami.metadata.base import MetadataStore
from cherami.metadata.models import Extent, Group
from cherami.roles.outputhost.groupconsumer import GroupConsumer
from cherami.telemetry import Histogram
from cherami.wire.store import PLAIN

# kept across an unload, so that the group's counters do not start again from 0
COUNTERS = ("delivered", "acked", "nacked", "redelivered", "dead_lettered")


# an extent's persisted acked count, a merged DLQ range's end (None: not merged) and the
# key of the last message acked
Level = tuple[int, int | None, bytes]


NONE_ACKED: Level = (0, None, b"")


def level_of(acked: int, limit: bytes | None, level: bytes) -> Level:
    return acked, None if limit is None else int.from_bytes(limit, "big"), level


def quiet(consumer: GroupConsumer) -> bool:
    """Whether nothing of the group is lost or delayed by unloading it now (its users,
    streams and the committer's writes are the service's to check)."""
    if consumer.stopped or consumer.users or len(consumer.flight) or consumer.dead:
        return False
    parked = consumer.parked
    if parked.rows or parked.pending or consumer.reading or consumer.keys.pending:
        return False
    for cursor in consumer.cursors.values():
        if cursor.ack.dirty or cursor.ack.acked_above_level():
            return False
    return True


def may_unload(consumer: GroupConsumer, since: float, streams: bool, busy: bool) -> bool:
    """Whether the group, last asked for at ``used_at``, may be unloaded now: left
    alone since ``since``, with no stream open and nothing for the committer to write."""
    return consumer.used_at <= since and not streams and not busy and quiet(consumer)


@dataclass(slots=True, eq=False)
class Unloaded:
    """What is kept of a group that is not loaded: its record, its counters and
    histogram (None while nothing was counted), and its persisted acked counts by
    extent (None until its stats are first asked: read then from the metadata) with a
    merged DLQ range's end where it has one."""

    group: Group
    counters: tuple[int, ...] | None = None
    end_to_end: Histogram | None = None
    expired: int = 0
    cancelled: int = 0
    levels: dict[str, Level] | None = None
    oldest_ms: int | None = None  # the oldest unacked message when it was unloaded

    @classmethod
    def of(cls, consumer: GroupConsumer) -> Unloaded:
        counters = tuple(getattr(consumer, name) for name in COUNTERS)
        hist = consumer.end_to_end
        return cls(
            consumer.group,
            counters if any(counters) else None,
            hist if hist.count else None,
            consumer.flight.expired,
            consumer.window.cancelled,
            {c.id: level_of(c.ack.acked, c.limit, c.ack.level) for c in consumer.cursors.values()},
            consumer.oldest_unacked_ms(),
        )  # fmt: skip

    def restore(self, consumer: GroupConsumer) -> None:
        """The group is loaded again: it counts on from here."""
        if self.counters is not None:
            for name, value in zip(COUNTERS, self.counters, strict=True):
                setattr(consumer, name, value)
        if self.end_to_end is not None:
            consumer.end_to_end = self.end_to_end
        consumer.flight.expired = self.expired
        consumer.window.cancelled = self.cancelled

    def counted(self, name: str) -> int:
        return 0 if self.counters is None else self.counters[COUNTERS.index(name)]

    def behind(self, extents: Iterable[Extent], counts: dict[str, int]) -> list[Extent]:
        """The plain extents with messages above the group's acked count, oldest first."""
        levels = self.levels or {}
        return sorted(
            (e for e in extents if e.kind == PLAIN
             and counts.get(e.id, 0) > levels.get(e.id, NONE_ACKED)[0]),
            key=lambda e: e.created_at,
        )  # fmt: skip

    def backlog(self, extents: Iterable[Extent], counts: dict[str, int]) -> int:
        """Messages published and not acked: each extent's count above the group's
        acked count (a merged DLQ range's, up to the range's end)."""
        levels = self.levels or {}
        total = 0
        for extent in extents:
            if extent.id in counts:
                acked, limit, _ = levels.get(extent.id, NONE_ACKED)
                count = counts[extent.id] if limit is None else min(counts[extent.id], limit)
                total += max(0, count - acked)
        return total


async def forget_merged(
    metadata: MetadataStore, unloaded: dict[str, Unloaded], keys: Iterable[str]
) -> None:
    """The kept acked counts of the groups ``keys`` (of queues written since the last
    look) that a merge of their DLQ may have changed, forgotten: read again when asked.
    On a node a merged range is the only write to a group's levels while it is not
    loaded but for deletions (whose extents no longer count) and a stream group's
    committed offsets (not counted in its stats); creating or sealing extents leaves
    them as they are. So a group is read again only if it has a merged range, now (one
    read of them all) or in what was kept, not every group of every queue written."""
    known = [
        (key, kept) for key in keys
        if (kept := unloaded.get(key)) is not None and kept.levels is not None
    ]  # fmt: skip
    if not known:
        return
    merged = {f"{queue}/{group}" for queue, group, _ in await metadata.list_merged_extents()}
    for key, kept in known:
        levels = kept.levels or {}
        if key in merged or any(limit is not None for _, limit, _ in levels.values()):
            kept.levels = None
