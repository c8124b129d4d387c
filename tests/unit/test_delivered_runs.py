"""A stream's fast path on the output host (entry.py): messages read in a row are
delivered as runs and settled by ranges; anything else a run cannot say turns it into
entries first. Every outcome must match the per-message path."""

from __future__ import annotations

import random
import time
from typing import Any

import msgspec
import pytest

from cherami.roles.outputhost import inflight as gcmod
from cherami.roles.outputhost.entry import Delivered, Entry, Run
from cherami.roles.outputhost.extentreader import _run
from cherami.roles.outputhost.groupconsumer import GroupConsumer
from cherami.wire import stream as f
from cherami.wire.keys import plain_key
from cherami.wire.records import Record
from tests.unit.test_redelivery import _consumer, _Metadata, _read_run, write

OWNER, OTHER = object(), object()
REAL_MIN_RUN = {
    "test_acks_of_runs_match_acks_of_entries",
    "test_a_stream_taking_a_few_at_a_time_gets_entries_and_the_run_stays",
}


@pytest.fixture(autouse=True)
def _runs_of_any_length(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Most tests take a few messages at a time; as runs (a stream taking fewer than
    MIN_RUN at once gets entries: tested on its own, and mixed in the random test)."""
    if request.node.name not in REAL_MIN_RUN:
        monkeypatch.setattr(gcmod, "MIN_RUN", 1)


def _numbers(taken: list[Entry | Delivered]) -> list[int]:
    out: list[int] = []
    for item in taken:
        if isinstance(item, Delivered):
            out += range(item.first, item.first + item.n)
        else:
            out.append(item.no)
    return out


def _state(consumer: GroupConsumer) -> tuple[Any, ...]:
    ack = consumer.cursors["e1"].ack
    return (ack.level, ack.acked, ack.window(), ack.acked_above_level(), consumer.acked,
            consumer.in_flight, consumer.end_to_end.count)  # fmt: skip


async def test_a_run_is_delivered_whole_and_says_what_entries_would() -> None:
    by_runs, by_entries = _consumer(), _consumer()
    now_ms = int(time.time() * 1000)
    keys = [plain_key(s) for s in range(1, 11)]
    records = [Record(now_ms, now_ms, f"m{s}".encode(), {"k": str(s)} if s % 3 else None)
               for s in range(1, 11)]  # fmt: skip
    ids = [f"e1:{s}" for s in range(1, 11)]
    await by_runs.window.admit(_run(by_runs.cursors["e1"], keys, records, ids))
    await by_entries.window.admit(_run(by_entries.cursors["e1"], keys, records, ids))
    taken, count = by_runs.take_runs(100, OWNER, 1 << 20)
    (run,) = taken
    assert isinstance(run, Delivered) and count == 10 and by_runs.in_flight == 10
    entries = by_entries.take(100, None, owner=OWNER)
    shift = run.first - entries[0].no  # both count from 1, on their own counters
    assert run.tuples() == [
        (e.no + shift, e.msg_id, e.record.body, e.record.attributes, e.count,
         e.record.enqueued_ms)
        for e in entries
    ]  # fmt: skip
    frame = f.decode_server(f.encode_deliver(run.tuples()))
    assert isinstance(frame, f.Deliver) and frame.messages[3].id == "e1:4"
    assert frame.messages[3].delivery_count == 1 and frame.messages[3].body == b"m4"
    assert by_runs.delivered == 10 and by_runs.cursors["e1"].delivered == 10
    assert by_runs.cursors["e1"].delivered_bytes == sum(len(e.record.body) for e in entries)


async def test_acks_of_runs_match_acks_of_entries() -> None:
    """Random acks (in order, shuffled, repeated, unknown, of another stream, of numbers
    never given) on both paths: the same stale answers and the same ack state."""
    rng = random.Random(5)
    for _ in range(30):
        by_runs, by_entries = _consumer(), _consumer()
        size = rng.randrange(1, 60)
        for lo in range(1, 200, size):
            hi = min(lo + size, 200)
            await by_runs.window.admit(_read_run(by_runs.cursors["e1"], range(lo, hi)))
            await by_entries.window.admit(_read_run(by_entries.cursors["e1"], range(lo, hi)))
        runs: list[int] = []
        entries: list[int] = []
        while by_runs.ready:
            limit = rng.randrange(1, 80)
            runs += _numbers(by_runs.take_runs(limit, OWNER, 1 << 20)[0])
            entries += [e.no for e in by_entries.take(limit, None, owner=OWNER)]
        assert len(runs) == len(entries) == 199
        pairs = list(zip(runs, entries, strict=True))
        while pairs:
            picked = pairs[: rng.randrange(1, 120)]
            del pairs[: len(picked)]
            kind = rng.randrange(6)
            if kind == 1:
                rng.shuffle(picked)
            elif kind == 2:
                picked += picked[:3]  # repeats
            elif kind == 3:
                picked.append((10_000, 10_000))  # never given
            elif kind == 5:  # a few nacked (or extended) first: those are entries now
                some = picked[:: rng.randrange(2, 9)]
                if rng.randrange(2):
                    stale_runs = by_runs.nack([r for r, _ in some], 3600.0, OWNER)
                    stale_entries = by_entries.nack([e for _, e in some], 3600.0, OWNER)
                else:
                    stale_runs = by_runs.extend([r for r, _ in some], 3600.0, OWNER)
                    stale_entries = by_entries.extend([e for _, e in some], 3600.0, OWNER)
                assert len(stale_runs) == len(stale_entries)
                assert _state(by_runs) == _state(by_entries)
            owner = OTHER if kind == 4 else OWNER
            stale_runs = by_runs.ack([r for r, _ in picked], owner)
            stale_entries = by_entries.ack([e for _, e in picked], owner)
            assert len(stale_runs) == len(stale_entries)
            mapping = dict(picked)  # (stale numbers of runs come in ascending order)
            assert sorted(mapping.get(r, r) for r in stale_runs) == sorted(stale_entries)
            assert _state(by_runs) == _state(by_entries)
            if kind == 4:  # another stream's acks are stale: settle them for real now
                by_runs.ack([r for r, _ in picked], OWNER)
                by_entries.ack([e for _, e in picked], OWNER)
                assert _state(by_runs) == _state(by_entries)
        assert by_runs.in_flight == 0 and not by_runs.flight._runs and not by_runs.flight.entries
        assert by_runs.nacked == by_entries.nacked
        assert by_runs.acked + by_runs.nacked == 199  # the nacked hold the level: parked


async def test_a_byte_budget_splits_a_run_and_the_rest_stays_ready() -> None:
    consumer = _consumer()
    await consumer.window.admit(_read_run(consumer.cursors["e1"], range(1, 11)))  # bodies of 2 B
    taken, count = consumer.take_runs(100, OWNER, 7)
    assert count == 3 and len(consumer.ready) == 1 and len(consumer.ready[0]) == 7
    taken, count = consumer.take_runs(100, OWNER, 1)  # never less than one
    assert count == 1
    taken, count = consumer.take_runs(2, OWNER, 1 << 20)
    assert count == 2
    assert consumer.in_flight == 6 and consumer.delivered == 6


async def test_a_nack_in_a_run_parks_that_message_and_the_rest_stay_settleable() -> None:
    consumer, meta = _consumer(), _Metadata()
    cursor = consumer.cursors["e1"]
    await consumer.window.admit(_read_run(cursor, range(1, 6)))
    numbers = _numbers(consumer.take_runs(10, OWNER, 1 << 20)[0])
    assert consumer.nack([numbers[1]], delay=3600.0, owner=OWNER) == []
    assert len(consumer.flight._runs) == 1 and consumer.in_flight == 4  # the rest stay a run
    assert consumer.ack(numbers, OWNER) == [numbers[1]]  # nacked: no longer current
    await write(meta, [consumer.parked], None)  # type: ignore[arg-type]
    assert cursor.ack.acked == 5 and meta.rows[("e1", plain_key(2))].count == 1
    assert consumer.nacked == 1 and consumer.acked == 4


async def test_a_visibility_timeout_parks_a_run_delivery() -> None:
    consumer, meta = _consumer(), _Metadata()
    await consumer.window.admit(_read_run(consumer.cursors["e1"], range(1, 4)))
    numbers = _numbers(consumer.take_runs(10, OWNER, 1 << 20)[0])
    consumer.ack([numbers[0]], OWNER)
    consumer._expire(time.monotonic() + 10_000)
    assert consumer.in_flight == 0 and not consumer.flight._runs
    assert consumer.ack(numbers[1:], OWNER) == numbers[1:]  # too late
    await write(meta, [consumer.parked], None)  # type: ignore[arg-type]
    assert sorted(meta.rows) == [("e1", plain_key(2)), ("e1", plain_key(3))]


async def test_a_closed_stream_gives_back_only_its_own_runs() -> None:
    consumer = _consumer()
    await consumer.window.admit(_read_run(consumer.cursors["e1"], range(1, 7)))
    mine = _numbers(consumer.take_runs(3, OWNER, 1 << 20)[0])
    theirs = _numbers(consumer.take_runs(3, OTHER, 1 << 20)[0])
    consumer.ack(mine[:1], OWNER)
    consumer.release_owner(OWNER)
    assert consumer.in_flight == 3 and len(consumer.flight._runs) == 1
    assert consumer.ack(theirs, OTHER) == [] and consumer.acked == 4
    assert len(consumer.parked.pending_extents()) == 1  # the two left of mine


async def test_extend_moves_a_run_deliverys_deadline() -> None:
    consumer = _consumer()
    await consumer.window.admit(_read_run(consumer.cursors["e1"], range(1, 4)))
    numbers = _numbers(consumer.take_runs(10, OWNER, 1 << 20)[0])
    assert consumer.extend(numbers[:1], 3600.0, OWNER) == []
    consumer._expire(time.monotonic() + 60)  # past the group's 30 s, not the hour
    assert list(consumer.flight.entries) == numbers[:1]
    assert consumer.extend([numbers[2]], 60.0, OWNER) == [numbers[2]]  # expired


async def test_a_dropped_extent_makes_its_run_deliveries_stale() -> None:
    consumer = _consumer()
    await consumer.window.admit(_read_run(consumer.cursors["e1"], range(1, 4)))
    numbers = _numbers(consumer.take_runs(2, OWNER, 1 << 20)[0])
    assert consumer.flight.cursor_of(numbers[0]) is consumer.cursors["e1"]
    consumer.drop_extent("e1")
    assert consumer.in_flight == 0 and not consumer.ready
    assert consumer.flight.cursor_of(numbers[0]) is None
    assert consumer.ack(numbers, OWNER) == numbers


async def test_a_receive_takes_a_ready_run_as_entries() -> None:
    consumer = _consumer()
    await consumer.window.admit(_read_run(consumer.cursors["e1"], range(1, 6)))
    assert isinstance(consumer.ready[0], Run)
    first = consumer.take(2, 30.0)
    assert [e.msg_id for e in first] == ["e1:1", "e1:2"] and all(e.count == 1 for e in first)
    rest, count = consumer.take_runs(10, OWNER, 1 << 20)  # the rest became entries too
    assert count == 3 and all(isinstance(e, Entry) for e in rest)
    assert consumer.ack([e.no for e in first], None) == []
    assert consumer.ack(_numbers(rest), OWNER) == []
    assert consumer.cursors["e1"].ack.acked == 5


async def test_a_run_held_at_the_head_of_a_full_window_is_pinned(monkeypatch: Any) -> None:
    consumer, meta = _consumer(read_ahead=3), _Metadata()
    cursor = consumer.cursors["e1"]
    await consumer.window.admit(_read_run(cursor, range(1, 4)))
    held, *rest = _numbers(consumer.take_runs(3, OWNER, 1 << 20)[0])
    consumer.ack(rest, OWNER)
    assert consumer.oldest_unacked_ms() is not None
    consumer._pin_held(0.0)
    consumer._pin_held(1.0)  # still at the head: a row, and it stays in flight
    assert consumer.flight.entries[held].row is not None
    await write(meta, [consumer.parked], None)  # type: ignore[arg-type]
    assert cursor.ack.window() == 0
    assert consumer.ack([held], OWNER) == []


async def test_messages_not_ready_now_are_admitted_one_by_one() -> None:
    consumer = _consumer()
    consumer.configure(
        group=msgspec.structs.replace(consumer.group, start_ms=int(time.time() * 1000) + 60_000)
    )
    await consumer.window.admit(_read_run(consumer.cursors["e1"], range(1, 4)))  # before the start
    assert not consumer.ready and consumer.cursors["e1"].ack.acked == 3


async def test_run_acks_count_end_to_end_ages_as_entry_acks_do() -> None:
    by_runs, by_entries = _consumer(), _consumer()
    now_ms = int(time.time() * 1000)
    ages = [30_000] * 5 + [2_000, 30_000, 20, 2_000, 20]  # one shared age, then mixed
    keys = [plain_key(s) for s in range(1, 11)]
    records = [Record(now_ms - a, now_ms - 30_000, b"x") for a in ages]
    ids = [f"e1:{s}" for s in range(1, 11)]
    await by_runs.window.admit(_run(by_runs.cursors["e1"], keys, records, ids))
    await by_entries.window.admit(_run(by_entries.cursors["e1"], keys, records, ids))
    runs = _numbers(by_runs.take_runs(100, OWNER, 1 << 20)[0])
    entries = [e.no for e in by_entries.take(100, None, owner=OWNER)]
    for part in (slice(0, 5), slice(5, 10)):
        assert by_runs.ack(runs[part], OWNER) == by_entries.ack(entries[part], OWNER) == []
    one, other = by_runs.end_to_end, by_entries.end_to_end
    assert one.counts == other.counts and one.count == other.count == 10
    assert abs(one.sum - other.sum) < 0.5 and one.counts[-1] == 0
    assert sum(one.counts[: one.bounds.index(60.0) + 1]) == 10


async def test_a_stream_taking_a_few_at_a_time_gets_entries_and_the_run_stays() -> None:
    consumer = _consumer()
    await consumer.window.admit(_read_run(consumer.cursors["e1"], range(1, 101)))
    few, count = consumer.take_runs(gcmod.MIN_RUN - 1, OWNER, 1 << 20)
    assert count == gcmod.MIN_RUN - 1 and all(isinstance(e, Entry) for e in few)
    assert [e.msg_id for e in few] == [f"e1:{s}" for s in range(1, gcmod.MIN_RUN)]
    rest, count = consumer.take_runs(1000, OWNER, 1 << 20)
    (run,) = rest
    assert isinstance(run, Delivered) and count == 101 - gcmod.MIN_RUN
    assert run.ids[0] == f"e1:{gcmod.MIN_RUN}"
    assert consumer.ack(_numbers(few) + _numbers(rest), OWNER) == []
    assert consumer.cursors["e1"].ack.acked == 100 and consumer.in_flight == 0
