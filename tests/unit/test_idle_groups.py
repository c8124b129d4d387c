"""What may be unloaded of an idle group, and what is kept of it (idlegroups.py): the
rules only, on a group consumer with no reader, store or metadata behind it."""

from __future__ import annotations

import itertools

from cherami.metadata.models import AckLevel, Extent, Group, GroupConfig, Queue, QueueConfig
from cherami.roles.outputhost.extentreader import ExtentCursor
from cherami.roles.outputhost.groupconsumer import GroupConsumer
from cherami.roles.outputhost.idlegroups import Unloaded, quiet
from cherami.wire.keys import plain_key


def _consumer() -> GroupConsumer:
    queue = Queue(name="q", config=QueueConfig(), created_at=0.0)
    group = Group(queue="q", name="g", config=GroupConfig(), created_at=0.0, start_ms=0, dlq="d")

    async def no_dlq(*_: object) -> None:
        raise AssertionError("nothing goes to the DLQ here")

    return GroupConsumer(queue, group, None, no_dlq, itertools.count(1))  # type: ignore[arg-type]


def _extent(extent_id: str) -> Extent:
    return Extent(
        id=extent_id, queue="q", kind="plain", status="open", input_host="i", stores=["s"],
        created_at=0.0,
    )  # fmt: skip


def _cursor(consumer: GroupConsumer, extent_id: str, acked: int = 0) -> ExtentCursor:
    level = AckLevel(queue="q", group="g", extent=extent_id, level=plain_key(acked), acked=acked)
    cursor = consumer.cursors[extent_id] = ExtentCursor(_extent(extent_id), level)
    return cursor


def test_a_group_with_nothing_under_way_is_quiet() -> None:
    consumer = _consumer()
    _cursor(consumer, "e", acked=4)
    assert quiet(consumer)
    consumer.users = 1  # a receive waits on it
    assert not quiet(consumer)
    consumer.users = 0
    consumer.halt()  # being unloaded already
    assert not quiet(consumer)


def test_an_unwritten_level_or_an_ack_above_the_level_keeps_it_loaded() -> None:
    consumer = _consumer()
    cursor = _cursor(consumer, "e")
    keys = [plain_key(i) for i in range(1, 4)]
    first = cursor.ack.next_ordinal()
    cursor.ack.track_many(keys, [None] * 3)  # type: ignore[list-item]
    assert quiet(consumer)  # read, not delivered: read again after a load
    cursor.ack.ack(first + 1)  # the second acked, the first not: not in any level row
    assert not quiet(consumer)
    cursor.ack.ack(first)  # the level moves past both: written at the next flush
    assert cursor.ack.dirty and not quiet(consumer)
    cursor.ack.dirty = False  # written
    assert quiet(consumer)


def test_what_is_kept_counts_on_after_a_load() -> None:
    consumer = _consumer()
    _cursor(consumer, "e", acked=7)
    consumer.delivered, consumer.acked, consumer.redelivered = 9, 7, 2
    consumer.end_to_end.observe(0.01)
    kept = Unloaded.of(consumer)
    assert kept.levels == {"e": (7, None, plain_key(7))} and kept.counted("acked") == 7
    again = _consumer()
    kept.restore(again)
    assert (again.delivered, again.acked, again.redelivered) == (9, 7, 2)
    assert again.end_to_end.count == 1
    assert Unloaded.of(_consumer()).counters is None  # nothing counted: nothing kept


def test_an_unloaded_groups_backlog_is_each_extents_count_above_its_acked_count() -> None:
    group = _consumer().group
    kept = Unloaded(group, levels={"e1": (7, None, b""), "dlq-e": (2, 5, b"")})
    extents = [_extent("e1"), _extent("e2"), _extent("dlq-e")]
    counts = {"e1": 10, "e2": 4, "dlq-e": 9}  # a merged DLQ range counts to its end (5)
    assert kept.backlog(extents, counts) == 3 + 4 + 3
    assert kept.backlog(extents, {"e1": 10}) == 3  # an extent no replica answered for
    assert Unloaded(group).backlog(extents[:2], counts) == 14  # never acked anything
    assert [e.id for e in kept.behind(extents[:2], counts)] == ["e1", "e2"]
    assert [e.id for e in kept.behind(extents[:2], {"e1": 7, "e2": 1})] == ["e2"]
