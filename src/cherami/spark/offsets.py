"""Stream offsets: ``{extent_id: next_seq}`` with sorted keys, over a queue's plain extents.

``next_seq`` is the first sequence number not yet read; an extent missing from an
offset has not been read at all (next_seq 1). These are pure functions, so the planning
of micro-batches can be tested without Spark."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from cherami.spark.control import ExtentView

Offsets = dict[str, int]


def normalize(offsets: Mapping[str, int]) -> Offsets:
    return {extent: int(offsets[extent]) for extent in sorted(offsets)}


def available(extents: Iterable[ExtentView]) -> Offsets:
    """Where each plain extent with messages ends now (one past its last sequence number)."""
    return normalize({e.id: e.last_seq + 1 for e in extents if e.plain and e.last_seq > 0})


def cap(latest: Offsets, target: Offsets | None) -> Offsets:
    """``latest`` bounded by ``target`` (the end fixed for Trigger.AvailableNow)."""
    if target is None:
        return latest
    return normalize({e: min(n, target[e]) for e, n in latest.items() if e in target})


def advance(
    start: Mapping[str, int], latest: Mapping[str, int], max_messages: int | None
) -> Offsets:
    """The end of the next micro-batch: from ``start`` toward ``latest``, at most
    ``max_messages`` in all, shared fairly between extents (the smallest backlogs are
    served in full first, the rest split evenly). Never behind ``start``, and every
    extent of ``start`` stays (one missing from ``latest`` may be unreachable for now;
    dropping it would read it again from the start when it comes back)."""
    backlog = {e: n - start.get(e, 1) for e, n in latest.items() if n > start.get(e, 1)}
    end = dict(start)
    budget = max_messages
    ordered = sorted(backlog, key=lambda e: (backlog[e], e))
    for i, extent in enumerate(ordered):
        take = backlog[extent]
        if budget is not None:
            remaining = len(ordered) - i
            take = min(take, -(-budget // remaining))
            budget -= take
        if take > 0:
            end[extent] = start.get(extent, 1) + take
    return normalize(end)


def ranges(start: Mapping[str, int], end: Mapping[str, int]) -> list[tuple[str, int, int]]:
    """The ``(extent, first_seq, end_seq)`` ranges a micro-batch reads, end exclusive."""
    return [(e, start.get(e, 1), n) for e, n in normalize(end).items() if n > start.get(e, 1)]


def count(start: Mapping[str, int], end: Mapping[str, int]) -> int:
    return sum(last - first for _, first, last in ranges(start, end))
