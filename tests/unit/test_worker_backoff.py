from __future__ import annotations

import pytest

from cherami.client.worker import Backoff, backoff


def test_delay_doubles_by_delivery_count_from_the_base() -> None:
    b = Backoff()
    assert [b.delay(n) for n in range(1, 8)] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0]


def test_delay_is_capped_even_for_huge_counts() -> None:
    assert Backoff(0.5, 3.0, 10.0).delay(3) == 4.5
    assert Backoff(0.5, 3.0, 10.0).delay(4) == 10.0
    assert Backoff().delay(1_000_000) == 60.0  # float overflow is capped, not raised
    assert Backoff(1, 2, 60).delay(100_000) == 60.0  # ints too


def test_first_delivery_and_nonsense_counts_get_the_base() -> None:
    assert Backoff(0.25).delay(1) == 0.25
    assert Backoff(0.25).delay(0) == 0.25
    assert Backoff(0.25).delay(-3) == 0.25


def test_constant_and_zero_backoffs() -> None:
    assert [Backoff(2.0, 1.0, 60.0).delay(n) for n in (1, 5, 50)] == [2.0, 2.0, 2.0]
    assert Backoff(0.0).delay(9) == 0.0


def test_tuples_convert_and_bad_values_are_refused() -> None:
    assert backoff((0.1, 2, 1)) == Backoff(0.1, 2, 1)
    same = Backoff(3.0)
    assert backoff(same) is same
    with pytest.raises(ValueError):
        Backoff(factor=0.5)
    with pytest.raises(ValueError):
        Backoff(base=-1)
