"""An extent the leader itself is sealing (rolled over by size, scaled down) is not a
failure (no I/O): its input host marks it FAILING when an append meets a replica the
seal's first round reached, before the seal writes SEALED. Taken for a failure, it was
sealed a second time and its store hosts were counted against (placement suspects), at
every roll-over of a queue at full speed (issue 33, part 1: the saturating run's
controller logged "replaced the extents of lost hosts: 1 sealed" after roll-overs)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from cherami.errors import Unavailable
from cherami.metadata.models import FAILING, OPEN, Extent, Host
from cherami.roles.controller.leader import Leader
from cherami.roles.controller.placement import Placements
from cherami.roles.controller.sealing import Sealer


class _Store:
    """A replica: its first seal (at -1) answers, then waits for ``go``."""

    def __init__(self, go: asyncio.Event, fail: bool = False) -> None:
        self.go = go
        self.fail = fail
        self.first = asyncio.Event()

    async def seal(self, extent_id: str, at: int) -> int:
        if self.fail:
            raise Unavailable("store host does not answer")
        self.first.set()
        await self.go.wait()
        return 100


class _Metadata:
    def __init__(self) -> None:
        self.sealed: list[str] = []

    async def set_extent_status(self, extent_id: str, status: str, **_: Any) -> None:
        self.sealed.append(extent_id)


def _extent(n: int, status: str = FAILING) -> Extent:
    return Extent(id=f"e{n}", queue="hot", kind="plain", status=status, input_host="in",
                  stores=[f"s{n}"], created_at=0.0)  # fmt: skip


def _leader(sealer: Sealer, placed: Placements) -> Leader:
    controller: Any = SimpleNamespace(placed=placed, sealing=lambda e: sealer.sealing(e))
    return Leader(controller, None, "c", SimpleNamespace(stores=None))  # type: ignore[arg-type]


def _suspects(placed: Placements, n: int) -> set[str]:
    hosts = [Host(id=f"s{i}", role="storehost", address="", heartbeat_at=0) for i in range(n)]
    return placed.suspects(hosts)


async def test_an_extent_the_leader_is_sealing_is_not_sealed_again_nor_suspected() -> None:
    go = asyncio.Event()
    stores = {f"s{i}": _Store(go) for i in range(3)}
    sealer = Sealer(_Metadata(), SimpleNamespace(get=stores.get), lambda: None)  # type: ignore[arg-type]
    placed = Placements()
    leader = _leader(sealer, placed)
    # two roll-overs under way: each extent's input host met a sealed replica
    seals = [asyncio.create_task(sealer.seal_extent(_extent(n, OPEN))) for n in (0, 1)]
    await asyncio.gather(stores["s0"].first.wait(), stores["s1"].first.wait())
    live = ({"in"}, {"s0", "s1", "s2"})
    rolling = [_extent(0), _extent(1), _extent(2, OPEN)]
    healthy = leader._healthy("hot", rolling, *live)
    assert leader._to_seal == [], "a roll-over under way was taken for a failure"
    assert _suspects(placed, 3) == set()
    assert [e.id for e in healthy] == ["e2"]
    assert "hot" in leader._again  # looked at again: its successor is opening
    go.set()
    await asyncio.gather(*seals)
    # sealed now, the catalog may still show the FAILING the input host wrote
    assert leader._healthy("hot", rolling[:1], *live) == [] and leader._to_seal == []

    # a failure the leader is not sealing is one: sealed, and its store counted
    failing = [_extent(2), _extent(3)]
    stores["s3"] = _Store(go)
    leader._healthy("hot", failing, {"in"}, {"s0", "s1", "s2", "s3"})
    assert [e.id for e in leader._to_seal] == ["e2", "e3"]
    assert placed._failed.keys() == {"e2", "e3"}


async def test_a_seal_that_failed_leaves_the_failure_to_be_seen() -> None:
    stores = {"s0": _Store(asyncio.Event(), fail=True)}
    sealer = Sealer(_Metadata(), SimpleNamespace(get=stores.get), lambda: None)  # type: ignore[arg-type]
    with pytest.raises(Unavailable):
        await sealer.seal_extent(_extent(0, OPEN))
    assert not sealer.sealing("e0")
    leader = _leader(sealer, Placements())
    leader._healthy("hot", [_extent(0)], {"in"}, {"s0"})
    assert [e.id for e in leader._to_seal] == ["e0"]
