"""Stream offsets: ``{extent_id: next_seq}`` with sorted keys, over a queue's plain extents,
and ``{extent_id + "/due": due_ms}`` over its timer extents (delayed messages).

``next_seq`` is the first sequence number not yet read; an extent missing from an
offset has not been read at all (next_seq 1). ``due_ms`` is where the reading of a timer
extent stands in due time: every record due before it has been read. These are pure
functions, so the planning of micro-batches can be tested without Spark."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from cherami.errors import InvalidRequest
from cherami.spark.control import ExtentView
from cherami.spark.options import EARLIEST, LATEST

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
    """The ``(extent, first_seq, end_seq)`` ranges of plain extents a micro-batch reads,
    end exclusive."""
    return [
        (e, start.get(e, 1), n)
        for e, n in normalize(end).items()
        if n > start.get(e, 1) and not e.endswith(DUE)
    ]


DUE = "/due"


def due_key(extent: str) -> str:
    return extent + DUE


def due_ranges(start: Mapping[str, int], end: Mapping[str, int]) -> list[tuple[str, int, int]]:
    """The ``(timer extent, from_ms, to_ms)`` due-time ranges a micro-batch reads."""
    return [
        (e.removesuffix(DUE), start.get(e, 0), n)
        for e, n in normalize(end).items()
        if e.endswith(DUE) and n > start.get(e, 0)
    ]


def count(start: Mapping[str, int], end: Mapping[str, int]) -> int:
    return sum(last - first for _, first, last in ranges(start, end))


def resolve(spec: str | Mapping[str, int], latest: Offsets, known: set[str], name: str) -> Offsets:
    """Offsets from a ``startingOffsets`` / ``endingOffsets`` value: ``earliest`` (every
    extent from seq 1), ``latest`` (where each extent ends now) or ``{extent: next_seq}``
    with -2 for earliest and -1 for latest, as in Kafka's JSON. Extents the JSON leaves
    out are at earliest; naming an extent the queue does not have is an error."""
    if spec == "earliest":
        return {}
    if spec == "latest":
        return normalize(latest)
    assert isinstance(spec, Mapping)
    unknown = sorted(set(spec) - known)
    if unknown:
        raise InvalidRequest(f"option {name!r} names extents the queue does not have: {unknown}")
    out = {}
    for extent, seq in spec.items():
        if seq == LATEST:
            out[extent] = latest.get(extent, 1)
        elif seq != EARLIEST:
            out[extent] = seq
    return normalize(out)


def lost(start: Mapping[str, int], before: Mapping[str, int], now: set[str]) -> Offsets:
    """The extents of ``start`` that are gone (deleted by retention) while messages were
    still to be read in them: ``{extent: first unread seq}``. ``before`` is where each
    extent ended when it was last seen; an extent never seen cannot be judged."""
    return normalize({
        e: n for e, n in start.items() if e not in now and e in before and before[e] > n
    })  # fmt: skip


class TriggerGate:
    """``minOffsetsPerTrigger`` with ``maxTriggerDelay``, as in Kafka's source: a
    micro-batch with fewer messages than the minimum waits, until the delay since the
    last micro-batch (or the query's start) has passed."""

    def __init__(self, minimum: int | None, delay_ms: int, clock: Callable[[], float]) -> None:
        self.minimum = minimum
        self.delay_s = delay_ms / 1000
        self._clock = clock
        self._last = clock()

    def admits(self, messages: int) -> bool:
        if self.minimum is None or messages == 0:
            return True
        now = self._clock()
        if messages >= self.minimum or now - self._last >= self.delay_s:
            self._last = now
            return True
        return False
