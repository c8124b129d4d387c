"""Which queues a leading controller's tick looks at (no I/O): an idle, healthy queue
is not looked at; a change, a host coming or going, traffic or a failure is."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from cherami.metadata.models import OPEN, Extent, Queue, QueueConfig
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
    return leader._look_at(queues, extents, changed, set(inputs), {"s"}, rates or {})


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
