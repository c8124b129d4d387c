"""Micro-batch planning over ``{extent: next_seq}`` offsets (pure functions)."""

from __future__ import annotations

import pytest

from cherami.spark import offsets as o
from cherami.spark.listener import parse_offsets

pytestmark = pytest.mark.spark


def test_advance_reads_everything_without_a_limit() -> None:
    assert o.advance({"a": 3}, {"a": 10, "b": 5}, None) == {"a": 10, "b": 5}
    assert list(o.advance({}, {"b": 2, "a": 4}, None)) == ["a", "b"]  # sorted keys


def test_advance_shares_a_limit_fairly() -> None:
    # backlogs: a 2, b 100, c 100; 50 to share: a takes its 2, b and c 24 each
    end = o.advance({"a": 1, "b": 1}, {"a": 3, "b": 101, "c": 101}, 50)
    assert end == {"a": 3, "b": 25, "c": 25}
    assert o.count({"a": 1, "b": 1}, end) == 50


def test_advance_never_moves_back_nor_forgets_an_extent() -> None:
    # "b" is missing from the listing (unreachable, or deleted): its offset stays
    assert o.advance({"a": 8, "b": 4}, {"a": 5}, None) == {"a": 8, "b": 4}
    assert o.advance({"a": 8}, {"a": 8}, 10) == {"a": 8}


def test_cap_bounds_to_the_available_now_target() -> None:
    assert o.cap({"a": 10, "b": 7}, {"a": 6}) == {"a": 6}
    assert o.cap({"a": 10}, None) == {"a": 10}


def test_ranges() -> None:
    assert o.ranges({"a": 3}, {"a": 3, "b": 5}) == [("b", 1, 5)]


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [('{"a1": 5}', {"a1": 5}), ("{}", None), ("", None), ("[1]", None), ('{"a": "x"}', None),
     ('{"offset": 3, "nested": {"x": 1}}', None), ("not json", None)],
)  # fmt: skip
def test_parse_offsets(raw: str, parsed: dict[str, int] | None) -> None:
    assert parse_offsets(raw) == parsed
