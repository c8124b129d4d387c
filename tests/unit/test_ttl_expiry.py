"""A message's own TTL on the output host, with an injected clock: taken from the ready
queue once its ``expires_ms`` has passed, it is acked past unseen (the ack level moves
over it) and counted; a run holding one is delivered message by message without it; a
parked one due after its TTL is forgotten, not redelivered or dead-lettered; and a
timer extent's cancelled messages are acked past when they come due; an expired message
does not hold its ordering key."""

from __future__ import annotations

import time
from typing import Any

import pytest

from cherami.metadata.models import AckLevel, Extent
from cherami.roles.outputhost import inflight as gcmod
from cherami.roles.outputhost.entry import Delivered, Entry
from cherami.roles.outputhost.extentreader import ExtentCursor, _run
from cherami.wire.keys import plain_key, timer_key
from cherami.wire.records import Record
from tests.unit.test_redelivery import _consumer

NOW_MS = int(time.time() * 1000)  # enqueued now: due and within retention at once
OWNER = object()


class Clock:
    def __init__(self) -> None:
        self.ms = NOW_MS

    def __call__(self) -> float:
        return self.ms / 1000


def _records(expiries: list[int | None]) -> list[Record]:
    return [Record(NOW_MS, NOW_MS, f"m{i}".encode(), expires_ms=e)
            for i, e in enumerate(expiries, start=1)]  # fmt: skip


def _bodies(taken: list[Any]) -> list[bytes]:
    out: list[bytes] = []
    for item in taken:
        out += [r.body for r in item.records] if isinstance(item, Delivered) else [item.record.body]
    return out


@pytest.fixture(autouse=True)
def _runs_of_any_length(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gcmod, "MIN_RUN", 1)


async def _admitted(expiries: list[int | None]) -> tuple[Any, Clock]:
    consumer, clock = _consumer(), Clock()
    consumer.flight.clock = clock
    consumer.window.group.start_ms = 0
    cursor = consumer.cursors["e1"]
    n = len(expiries)
    keys = [plain_key(s) for s in range(1, n + 1)]
    await consumer.window.admit(
        _run(cursor, keys, _records(expiries), [f"e1:{s}" for s in range(1, n + 1)])
    )
    return consumer, clock


@pytest.mark.parametrize("runs", [False, True])
async def test_expired_messages_are_acked_past_unseen_and_counted(runs: bool) -> None:
    consumer, clock = await _admitted([NOW_MS + 10, None, NOW_MS + 10, NOW_MS + 5000, None])
    clock.ms = NOW_MS + 10  # expires_ms is the first moment it is expired
    if runs:
        taken, _ = consumer.take_runs(100, OWNER, 1 << 20)
    else:
        taken = consumer.take(100, None, OWNER)
    assert _bodies(taken) == [b"m2", b"m4", b"m5"]
    assert consumer.flight.expired == 2
    numbers = [e.no for e in taken if isinstance(e, Entry)]
    assert consumer.ack(numbers, OWNER) == []
    ack = consumer.cursors["e1"].ack
    assert ack.window() == 0 and ack.level == plain_key(5)  # not held back by them


async def test_nothing_expires_before_its_time() -> None:
    consumer, clock = await _admitted([NOW_MS + 10, NOW_MS + 11])
    clock.ms = NOW_MS + 9
    taken, count = consumer.take_runs(100, OWNER, 1 << 20)
    assert count == 2 and consumer.flight.expired == 0
    assert isinstance(taken[0], Delivered)  # the fast path stays


async def test_a_parked_message_due_after_its_ttl_is_forgotten() -> None:
    consumer, clock = await _admitted([NOW_MS + 1000, None])
    first, second = consumer.take(2, 30.0)
    consumer.nack([first.no, second.no], delay=5.0)
    clock.ms = NOW_MS + 2000
    consumer._requeue(first.row, first, NOW_MS + 6000)
    consumer._requeue(second.row, second, NOW_MS + 6000)
    assert consumer.flight.expired == 1
    assert first.row is None and second.row is not None  # forgotten; the other goes again
    assert not consumer.dead  # and not to the DLQ either


async def test_cancelled_messages_of_a_timer_extent_are_acked_past() -> None:
    consumer = _consumer()
    extent = Extent(id="t1", queue="q", kind="timer", status="open", input_host="i",
                    stores=["s1"], created_at=0.0)  # fmt: skip
    cursor = consumer.cursors["t1"] = ExtentCursor(extent, AckLevel(queue="q", group="g",
                                                                    extent="t1"))  # fmt: skip
    asked: list[tuple[str, int, int, int]] = []

    async def cancelled_of(extent_id: str, lo: int, hi: int, due_ms: int) -> set[int]:
        asked.append((extent_id, lo, hi, due_ms))
        return {2, 4}

    consumer.window.cancelled_of = cancelled_of
    consumer.window.group.start_ms = 0
    keys = [timer_key(NOW_MS - 10, s) for s in (3, 1, 2, 4)]
    records = [Record(NOW_MS - 20, NOW_MS - 10, f"m{s}".encode()) for s in (3, 1, 2, 4)]
    await consumer.window.admit(_run(cursor, keys, records, ["t1:3", "t1:1", "t1:2", "t1:4"]))
    assert asked == [("t1", 1, 4, NOW_MS - 10)]
    assert consumer.window.cancelled == 2
    taken = consumer.take(10, None)
    assert [e.msg_id for e in taken] == ["t1:3", "t1:1"]


async def test_an_expired_message_does_not_hold_its_ordering_key() -> None:
    consumer, clock = _consumer(), Clock()
    consumer.flight.clock = clock
    consumer.window.group.start_ms = 0
    cursor = consumer.cursors["e1"]
    records = [Record(NOW_MS, NOW_MS, f"m{s}".encode(), key="k",
                      expires_ms=NOW_MS + 10 if s == 1 else None)
               for s in (1, 2)]  # fmt: skip
    keys = [plain_key(s) for s in (1, 2)]
    await consumer.window.admit(_run(cursor, keys, records, ["e1:1", "e1:2"]))
    clock.ms = NOW_MS + 10
    first = consumer.take(10, None)  # m1 expired: acked past, and its key moves on
    assert [e.msg_id for e in first] == ["e1:2"]
    assert consumer.flight.expired == 1
