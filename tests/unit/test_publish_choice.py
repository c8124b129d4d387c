"""The stream Publisher's choice of stream for the next frame: the one with the fewest
unacked messages, ties in turn (cherami.client.stream.least_outstanding)."""

from __future__ import annotations

from collections import Counter

from cherami.client.stream import least_outstanding


def test_the_stream_with_the_fewest_unacked_messages_takes_the_frame() -> None:
    assert least_outstanding([400, 0], 0) == 1
    assert least_outstanding([5, 3, 9], 7) == 1
    assert least_outstanding([7], 3) == 0


def test_ties_go_in_turn() -> None:
    assert [least_outstanding([2, 2, 2], turn) for turn in range(6)] == [0, 1, 2, 0, 1, 2]
    assert {least_outstanding([0, 9, 0], turn) for turn in range(4)} == {0, 2}


def test_equal_frames_spread_evenly_while_none_is_answered() -> None:
    loads = [0, 0, 0]
    for turn in range(300):
        loads[least_outstanding(loads, turn)] += 100
    assert loads == [10_000, 10_000, 10_000]


def test_a_slow_stream_gets_less() -> None:
    """Stream 0 answers nothing; stream 1 answers each frame at once: 1 takes the rest."""
    loads = [0, 0]
    taken: Counter[int] = Counter()
    for turn in range(100):
        i = least_outstanding(loads, turn)
        taken[i] += 1
        if i == 0:
            loads[0] += 100
    assert taken[0] == 1 and taken[1] == 99
