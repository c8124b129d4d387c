from __future__ import annotations

import random

from cherami.roles.outputhost.ackmanager import AckManager
from cherami.wire.keys import plain_key


def _tracked(n: int) -> tuple[AckManager[str], list[int]]:
    mgr: AckManager[str] = AckManager()
    return mgr, [mgr.track(plain_key(i), f"m{i}") for i in range(1, n + 1)]


def test_level_advances_only_over_an_acked_prefix() -> None:
    mgr, ords = _tracked(5)
    assert mgr.ack(ords[1]) and mgr.ack(ords[2])
    assert (mgr.level, mgr.acked, mgr.window()) == (b"", 0, 5)
    assert mgr.acked_above_level() == 2
    assert mgr.ack(ords[0])
    assert (mgr.level, mgr.acked, mgr.window()) == (plain_key(3), 3, 2)
    assert mgr.dirty
    assert mgr.oldest() == (3, "m4")


def test_double_and_unknown_acks_are_refused() -> None:
    mgr, ords = _tracked(3)
    assert mgr.ack(ords[0])
    assert not mgr.ack(ords[0])
    assert not mgr.ack(99)
    assert not mgr.ack(-1)
    assert mgr.acked == 1


def test_resumes_from_a_persisted_level() -> None:
    mgr: AckManager[str] = AckManager(level=plain_key(10), acked=10)
    ordinal = mgr.track(plain_key(11), "m11")
    mgr.ack(ordinal)
    assert (mgr.level, mgr.acked) == (plain_key(11), 11)


def test_random_order_over_compaction() -> None:
    mgr, ords = _tracked(5000)
    rng = random.Random(7)
    shuffled = ords[:]
    rng.shuffle(shuffled)
    for i, ordinal in enumerate(shuffled):
        assert mgr.ack(ordinal)
        if i == 2500:
            assert mgr.acked + mgr.acked_above_level() == 2501
    assert (mgr.level, mgr.acked, mgr.window()) == (plain_key(5000), 5000, 0)
    assert mgr.oldest() is None
    later = mgr.track(plain_key(5001), "m5001")
    assert mgr.ack(later) and mgr.acked == 5001


def test_tracking_many_at_once_matches_one_by_one() -> None:
    one: AckManager[str] = AckManager()
    many: AckManager[str] = AckManager()
    rng = random.Random(7)
    n = 0
    while n < 5000:  # reads of varying size, acks in random order, compaction on the way
        size = rng.randint(1, 300)
        keys = [plain_key(i) for i in range(n + 1, n + size + 1)]
        names = [f"m{i}" for i in range(n + 1, n + size + 1)]
        ords = [one.track(k, e) for k, e in zip(keys, names, strict=True)]
        first = many.track_many(keys, names)
        assert ords == list(range(first, first + size))
        rng.shuffle(ords)
        for o in ords[: size // 2]:
            assert one.ack(o) == many.ack(o)
        n += size
    assert (one.level, one.acked, one.window()) == (many.level, many.acked, many.window())
    assert one.oldest() == many.oldest()


def test_ack_many_matches_acks_one_by_one() -> None:
    rng = random.Random(7)
    for _ in range(50):
        one, ords = _tracked(3000)
        many, _ = _tracked(3000)
        picked = rng.sample(ords, rng.randrange(1, 3000))
        picked += [picked[0], 5000, -1]  # a repeat, an unknown, an untracked ordinal
        for chunk in range(0, len(picked), 97):
            part = picked[chunk : chunk + 97]
            assert many.ack_many(part) == sum(one.ack(o) for o in part)
            assert (many.level, many.acked, many.window()) == (one.level, one.acked, one.window())
            assert many.acked_above_level() == one.acked_above_level()
            assert many.oldest() == one.oldest()


def test_runs_of_acks_match_acks_one_by_one() -> None:
    """Runs of ordinals (the common case: a range, marked at once) in and out of order,
    overlapping earlier acks, past the end, below the level, with repeats, and with an
    untracked ordinal: the same counts, level and window as acking one by one."""
    rng = random.Random(11)
    for _ in range(200):
        one, ords = _tracked(3000)
        many, _ = _tracked(3000)
        for _ in range(40):
            start = rng.randrange(-5, 3005)
            run = list(range(start, start + rng.randrange(2, 200)))
            kind = rng.randrange(5)
            if kind == 1:
                rng.shuffle(run)
            elif kind == 2:
                run.append(run[0])  # a repeat
            elif kind == 3:
                run[rng.randrange(len(run))] = -1  # an untracked (parked) ordinal
            expected = sum(one.ack(o) for o in run)
            assert many.ack_many(run) == expected, run[:5]
            assert (many.level, many.acked, many.window()) == (one.level, one.acked, one.window())
            assert many.acked_above_level() == one.acked_above_level()
            assert many.oldest() == one.oldest()
    mgr, ords = _tracked(10)
    assert mgr.ack_many(ords[2:6]) == 4 and mgr.acked == 0  # a range above the level
    assert mgr.ack_many(ords[0:2]) == 2 and mgr.acked == 6 and mgr.level == plain_key(6)
    assert mgr.ack_many(ords[4:8]) == 2 and mgr.acked == 8  # half acked before


def test_ack_range_matches_acks_one_by_one() -> None:
    """Ranges (a stream acking a run it was delivered) inside the window, overlapping
    earlier acks, past the end and below the level: as acking each ordinal."""
    rng = random.Random(13)
    for _ in range(200):
        one, _ = _tracked(3000)
        ranged, _ = _tracked(3000)
        for _ in range(40):
            start, n = rng.randrange(-5, 3005), rng.randrange(1, 200)
            expected = sum(one.ack(o) for o in range(start, start + n))
            assert ranged.ack_range(start, n) == expected, (start, n)
            assert (ranged.level, ranged.acked, ranged.window()) == (
                one.level, one.acked, one.window(),
            )  # fmt: skip
            assert ranged.acked_above_level() == one.acked_above_level()
            assert ranged.oldest() == one.oldest()


def test_hold_replaces_holders_but_not_acked_ones() -> None:
    mgr: AckManager[str] = AckManager()
    first = mgr.track_many([plain_key(i) for i in range(1, 7)], ["run"] * 6)
    assert mgr.ack(first + 1)
    mgr.hold(first, ["a", "b", "c"])  # b was acked meanwhile: stays released
    assert mgr.oldest() == (first, "a")
    assert mgr.ack(first)
    assert mgr.oldest() == (first + 2, "c")
    mgr.hold(first + 2, ["x", "y", "z", "w"])
    assert mgr.oldest() == (first + 2, "x")
