"""Which queues a leading controller's tick looks at (no I/O): an idle, healthy queue
is not looked at; a change, a host coming or going, traffic or a failure is."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from cherami.metadata.models import OPEN, Extent, Queue, QueueConfig
from cherami.metadata.sqlite import SqliteMetadataStore
from cherami.roles.controller.leader import Leader
from cherami.roles.controller.scaling import ScalingPolicy


def _leader(scaling: ScalingPolicy | None = None) -> Leader:
    stores: Any = SimpleNamespace(stores=None)
    return Leader(None, None, "c", stores, scaling=scaling)  # type: ignore[arg-type]


def _queue(name: str) -> Queue:
    return Queue(name=name, config=QueueConfig(replicas=1, min_extents=1), created_at=0.0)


def _extent(id_: str, queue: str) -> Extent:
    return Extent(id=id_, queue=queue, kind="plain", status=OPEN, input_host="in",
                  stores=["s"], created_at=time.time())  # fmt: skip


def _look(leader: Leader, changed: set[str] | None, inputs: set[str] = frozenset({"in"}),
          rates: dict[str, float] | None = None) -> list[str]:  # fmt: skip
    queues = [_queue(n) for n in ("a", "b", "c")]
    leader._queues = {q.name: q for q in queues}
    extents = {q.name: [_extent(f"e-{q.name}", q.name)] for q in queues}
    leader._extents = extents
    for name, now in extents.items():  # as a tick reads the catalog and the reports
        leader._index_plain(name, [], now)
    leader._note_plain(rates or {})
    return leader._look_at(changed, set(inputs), {"s"}, rates or {})


def test_only_what_changed_is_looked_at_once_the_catalog_is_known() -> None:
    leader = _leader()
    assert _look(leader, None) == ["a", "b", "c"]  # the first tick reads everything
    assert _look(leader, set()) == []  # idle and healthy: nothing
    assert _look(leader, {"b"}) == ["b"]
    assert _look(leader, {"gone"}) == []  # deleted since: not in the catalog
    assert _look(leader, set(), inputs={"in", "in2"}) == ["a", "b", "c"]  # a host came
    assert _look(leader, set(), inputs={"in", "in2"}) == []
    leader._again.add("c")  # a queue the last tick could not settle
    assert _look(leader, set(), inputs={"in", "in2"}) == ["c"]
    assert _look(leader, set(), inputs={"in", "in2"}) == []


def test_scaling_looks_at_queues_with_traffic_or_above_their_minimum() -> None:
    leader = _leader(ScalingPolicy())
    _look(leader, None)
    assert _look(leader, set(), rates={"e-a": 0.0}) == []
    assert _look(leader, set(), rates={"e-a": 120.0}) == ["a"]
    leader._wide.add("b")  # more extents than its minimum: may scale down
    assert _look(leader, set()) == ["b"]


async def test_a_retention_pass_looks_at_extents_written_or_young_not_every_one() -> None:
    """A pass between the whole ones (every ROLL_CHECK_ALL) is given only the extents
    the load reports show written and those made lately, not every open extent."""
    leader = _leader()
    looked: list[list[str]] = []

    async def tick(queues: Any, opened: list[Extent], acting: Any) -> None:
        looked.append(sorted(e.id for e in opened))

    leader.retention = SimpleNamespace(tick=tick)  # type: ignore[assignment]
    old = time.time() - 3600
    leader._queues = {f"q{i}": _queue(f"q{i}") for i in range(1000)}
    leader._extents = _Walks({
        f"q{i}": [Extent(id=f"e{i}", queue=f"q{i}", kind="plain", status=OPEN, input_host="in",
                         stores=["s"], created_at=old)]
        for i in range(1000)
    })  # fmt: skip
    for name, now in leader._extents.items():
        leader._index_plain(name, [], now)
    await leader._retain(time.monotonic())  # the first pass is a whole one
    assert len(looked[-1]) == 1000
    leader._extents["q5"].append(_extent("new", "q5"))  # made lately
    leader._young["new"] = "q5"
    leader._busy = {"e7"}
    leader._note_plain({"e7": 50.0})
    walks = leader._extents.walks
    await leader._retain(time.monotonic())
    assert looked[-1] == ["e7", "new"]
    assert leader._extents.walks == walks  # no walk of every queue's extents


class _Walks(dict[str, list[Extent]]):
    """Counts the walks of every value."""

    walks = 0

    def values(self) -> Any:
        self.walks += 1
        return super().values()


async def test_the_changed_queues_are_read_at_once_not_one_by_one(tmp_path: Path) -> None:
    """After a write to each of 40 queues (one deleted), the tick's catalog reads them
    in one statement or two, not a get_queue and a list_extents each; and knows what
    each holds, and that the deleted one is gone."""
    store = SqliteMetadataStore(str(tmp_path / "meta.db"))
    try:
        names = [f"q{i:02d}" for i in range(40)]
        for name in names:
            await store.insert_queue(_queue(name))
            assert await store.insert_extent(_extent(f"e-{name}", name))
        counted = _Counted(store)
        leader = Leader(None, counted, "c", SimpleNamespace(stores=None))  # type: ignore[arg-type]
        extents, changed = await leader._catalog()
        assert changed is None and len(extents) == 40  # the first tick: a whole read
        for name in names[1:]:
            assert await store.insert_extent(_extent(f"e2-{name}", name))
        await store.delete_queue(names[0])
        counted.calls.clear()
        extents, changed = await leader._catalog()
        assert changed == set(names)
        assert sum(counted.calls.values()) <= 3, counted.calls  # 80 one by one
        assert names[0] not in extents and names[0] not in leader._queues
        assert all([e.id for e in extents[n]] == [f"e-{n}", f"e2-{n}"] for n in names[1:])
        assert leader._open_plain[f"e2-{names[1]}"] == names[1]
    finally:
        await store.close()


class _Counted:
    """A metadata store whose calls are counted by name."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._store, name)

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return await call(*args, **kwargs)

        return counted
