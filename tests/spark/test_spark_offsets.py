"""Micro-batch planning over ``{extent: next_seq}`` offsets (pure functions)."""

from __future__ import annotations

import pytest

from cherami.errors import InvalidRequest
from cherami.spark import offsets as o
from cherami.spark.listener import parse_offsets
from cherami.spark.options import Options

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


def test_resolve_kafka_style_offsets() -> None:
    latest = {"a": 10, "b": 4}
    known = {"a", "b", "c"}
    assert o.resolve("earliest", latest, known, "startingOffsets") == {}
    assert o.resolve("latest", latest, known, "startingOffsets") == latest
    assert o.resolve({"a": -1, "b": -2, "c": 7}, latest, known, "startingOffsets") == {
        "a": 10,
        "c": 7,
    }
    with pytest.raises(InvalidRequest, match="'startingOffsets' names extents .*'zz'"):
        o.resolve({"zz": 3}, latest, known, "startingOffsets")


def test_lost_names_deleted_extents_with_unread_messages() -> None:
    start = {"a": 5, "b": 9, "c": 2}
    before = {"a": 8, "b": 9}  # a had 5..7 unread, b was read to its end, c never seen
    assert o.lost(start, before, set()) == {"a": 5}
    assert o.lost(start, before, {"a"}) == {}


def test_the_trigger_gate_waits_for_the_minimum_or_the_delay() -> None:
    now = [100.0]
    gate = o.TriggerGate(50, 2000, lambda: now[0])
    assert gate.admits(0)  # nothing to read: nothing to wait for
    assert not gate.admits(10)
    now[0] += 1.5
    assert not gate.admits(49)
    assert gate.admits(50)  # the minimum
    now[0] += 1.0
    assert not gate.admits(10)
    now[0] += 1.0
    assert gate.admits(10)  # the delay passed since the last micro-batch
    assert o.TriggerGate(None, 0, lambda: 0.0).admits(1)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingOffsets": "first"}, "'startingOffsets' must be 'earliest', 'latest' or a JSON"),
        ({"startingOffsets": '{"e": 0}'}, "'startingOffsets' must be"),
        ({"endingOffsets": "earliest"}, "'endingOffsets' cannot be 'earliest'"),
        ({"startingTimestamp": "yesterday"}, "'startingTimestamp' must be an RFC 3339"),
        ({"maxOffsetsPerTrigger": "0"}, "'maxOffsetsPerTrigger' must be at least 1"),
        ({"maxOffsetsPerTrigger": "5", "maxMessagesPerTrigger": "6"}, "disagree"),
        ({"minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "5"}, "must not exceed"),
        ({"maxTriggerDelay": "soon"}, "'maxTriggerDelay' must be a duration"),
        ({"failOnDataLoss": "maybe"}, "'failOnDataLoss' must be 'true' or 'false'"),
        ({"includeHeaders": "1"}, "'includeHeaders' must be 'true' or 'false'"),
        ({"startingOffsets": "latest", "startingTimestamp": "5"}, "not both"),
    ],
)
def test_bad_option_values_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        Options.parse({"queue": "q", **options})


def test_kafka_option_names_and_aliases() -> None:
    opts = Options.parse({"queue": "q", "MAXOFFSETSPERTRIGGER": "7", "maxTriggerDelay": "30s",
                          "startingTimestamp": "1000", "endTime": "2000"})  # fmt: skip
    assert opts.max_messages_per_trigger == 7 and opts.max_trigger_delay_ms == 30_000
    assert (opts.start_ms, opts.end_ms) == (1000, 2000)
    assert Options.parse({"queue": "q", "maxMessagesPerTrigger": "3"}).max_messages_per_trigger == 3
    assert Options.parse({"queue": "q", "maxTriggerDelay": "15m"}).max_trigger_delay_ms == 900_000
    with pytest.raises(InvalidRequest, match="'endingOffsets' applies to batch reads only"):
        Options.parse({"queue": "q", "endingOffsets": "latest"}).check_stream()


def test_timer_extents_are_read_by_due_time() -> None:
    start = {"a": 3, "t/due": 1000}
    end = {"a": 5, "t/due": 2500, "u/due": 700}  # u: a timer extent that appeared since
    assert o.ranges(start, end) == [("a", 3, 5)]
    assert o.due_ranges(start, end) == [("t", 1000, 2500), ("u", 0, 700)]
    assert o.count(start, end) == 2  # delayed messages are not counted against the limits
    assert o.advance(start, {"a": 9}, 2)["t/due"] == 1000  # plain planning keeps them
    assert parse_offsets('{"a": 3, "t/due": 1000}') == start
