"""An output host's knowledge of cancelled delayed messages (outputhost/cancels.py), with
an injected clock and a metadata store that can fail: read at the first run due, kept
while the change log says nothing of the queue, read again when it does; answered from
memory in an outage for runs due within the cancel margin of the last refresh, asked of
the store (and failing) for runs due later."""

from __future__ import annotations

import pytest

from cherami.errors import QueueNotFound, Unavailable
from cherami.metadata.cancelled import CANCEL_MARGIN_MS
from cherami.metadata.models import Queue, QueueConfig
from cherami.roles.outputhost.cancels import FOLLOW_IN_BULK, CancelCache

T0 = 1_800_000_000_000


class _Metadata:
    def __init__(self) -> None:
        self.rows: dict[str, dict[str, set[int]]] = {"q": {"t1": {2, 9}}}
        self.reads = 0
        self.down = False

    async def cancelled_in(self, queue: str) -> dict[str, set[int]]:
        if self.down:
            raise Unavailable("metadata is down")
        self.reads += 1
        if queue not in self.rows:
            return {}
        return {e: set(s) for e, s in self.rows[queue].items()}

    async def cancelled_everywhere(self) -> dict[str, dict[str, set[int]]]:
        if self.down:
            raise Unavailable("metadata is down")
        self.reads += 1
        return {q: {e: set(s) for e, s in r.items()} for q, r in self.rows.items()}

    async def list_queues(self) -> list[Queue]:
        if self.down:
            raise Unavailable("metadata is down")
        return [Queue(name=q, config=QueueConfig(), created_at=0.0) for q in self.rows]

    async def get_queue(self, queue: str) -> object:
        if self.down:
            raise Unavailable("metadata is down")
        if queue not in self.rows:
            raise QueueNotFound(queue)
        return object()


class _Clock:
    ms = T0

    def __call__(self) -> float:
        return self.ms / 1000


async def test_read_once_then_kept_while_the_change_log_names_nothing() -> None:
    meta, clock = _Metadata(), _Clock()
    cache = CancelCache(meta, clock)  # type: ignore[arg-type]
    assert await cache.of("q", "t1", 1, 5, T0) == {2}
    assert meta.reads == 1
    for tick in range(1, 6):  # a refresh a second, nothing written to q
        clock.ms = T0 + tick * 1000
        await cache.follow(set(), clock.ms)
        assert await cache.of("q", "t1", 1, 100, clock.ms + CANCEL_MARGIN_MS) == {2, 9}
    assert meta.reads == 1
    meta.rows["q"]["t1"].add(50)  # a cancel: its queue is in the change log
    await cache.follow({"q", "other"}, clock.ms + 1000)
    assert await cache.of("q", "t1", 1, 100, clock.ms) == {2, 9, 50}
    assert meta.reads == 2


async def test_an_outage_answers_runs_due_within_the_margin_and_refuses_later_ones() -> None:
    meta, clock = _Metadata(), _Clock()
    cache = CancelCache(meta, clock)  # type: ignore[arg-type]
    await cache.of("q", "t1", 1, 5, T0)
    await cache.follow(set(), T0 + 1000)  # the last refresh before the store stops
    meta.down = True
    assert await cache.of("q", "t1", 1, 100, T0 + 1000 + CANCEL_MARGIN_MS) == {2, 9}
    with pytest.raises(Unavailable):
        await cache.of("q", "t1", 1, 100, T0 + 1001 + CANCEL_MARGIN_MS)
    await cache.follow({"q"}, T0 + 5000)  # a changed queue that cannot be read again
    with pytest.raises(Unavailable):  # stays known only as of before
        await cache.of("q", "t1", 1, 100, T0 + 1001 + CANCEL_MARGIN_MS)
    meta.down = False
    assert await cache.of("q", "t1", 1, 100, T0 + 9000) == {2, 9}


async def test_a_deleted_queue_is_forgotten() -> None:
    meta, clock = _Metadata(), _Clock()
    cache = CancelCache(meta, clock)  # type: ignore[arg-type]
    await cache.of("q", "t1", 1, 5, T0)
    del meta.rows["q"]
    await cache.follow({"q"}, T0 + 1000)
    assert cache.as_of("q") is None


async def test_many_queues_named_are_read_again_in_two_statements() -> None:
    """A power loss names every queue at every refresh: their tombstones are read again
    all at once (two reads each before: get_queue and cancelled_in)."""
    meta, clock = _Metadata(), _Clock()
    names = [f"q{i}" for i in range(FOLLOW_IN_BULK + 1)]
    meta.rows = {q: {"t": {i}} for i, q in enumerate(names)}
    cache = CancelCache(meta, clock)  # type: ignore[arg-type]
    for queue in names:
        await cache.known(queue)
    assert meta.reads == len(names)
    meta.rows["q1"]["t"].add(50)  # a cancel
    del meta.rows["q2"]  # a deletion
    clock.ms = T0 + 1000
    await cache.follow(set(names), T0 + 1000)
    assert meta.reads == len(names) + 1
    assert await cache.of("q1", "t", 0, 100, T0 + 1000) == {1, 50}
    assert cache.as_of("q2") is None
    assert meta.reads == len(names) + 1  # answered from what the follow read
    meta.down = True  # an outage: known only as of before, a run due later asks the store
    await cache.follow(set(names), T0 + 9000)
    with pytest.raises(Unavailable):
        await cache.of("q1", "t", 0, 100, T0 + 9000 + CANCEL_MARGIN_MS)
