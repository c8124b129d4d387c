"""How the controller seals an extent's replicas (sealing.py, no I/O): each step asks
every replica at once. One after another, a seal of 3 replicas was six round trips, and
after a power loss at 1,000 queues the leader sealed 2,000 extents 32 at a time."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import msgspec
import pytest

from cherami.errors import Unavailable
from cherami.metadata.models import OPEN, SEALED, Extent, Fence
from cherami.roles.controller import sealing
from cherami.roles.controller.sealing import Sealer


class _Replica:
    """A store host's replica: its last sequence number; a seal at -1 stops it there, a
    seal at ``at`` cuts it back. Each step's answer waits until every replica of the
    extent has been asked for that step (a deadline: asked one after another, the
    first never answers)."""

    def __init__(self, stores: _Stores, last: int | None) -> None:
        self.stores, self.last = stores, last

    async def seal(self, extent: str, at: int) -> int:
        step = "stop" if at < 0 else "cut"
        self.stores.asked.append((step, self))
        async with asyncio.timeout(2):
            while sum(s == step for s, _ in self.stores.asked) < self.stores.waiting[step]:
                await asyncio.sleep(0)
        if self.last is None:
            raise Unavailable("store host down")
        if at >= 0:
            self.last = at
        return self.last


class _Stores:
    def __init__(self, lasts: dict[str, int | None]) -> None:
        self.asked: list[tuple[str, _Replica]] = []
        self.replicas = {s: _Replica(self, last) for s, last in lasts.items()}
        self.waiting = {"stop": len(lasts), "cut": sum(v is not None for v in lasts.values())}

    def get(self, store_id: str) -> _Replica:
        return self.replicas[store_id]


class _Metadata:
    def __init__(self) -> None:
        self.sealed: list[tuple[str, str, int | None]] = []

    async def set_extent_status(
        self, extent_id: str, status: str, sealed_seq: int | None = None, fence: Fence | None = None
    ) -> None:
        self.sealed.append((extent_id, status, sealed_seq))


def _extent(stores: list[str]) -> Extent:
    return Extent(id="e", queue="q", kind="plain", status=OPEN, input_host="in", stores=stores,
                  created_at=0.0)  # fmt: skip


async def test_a_seal_asks_every_replica_at_once_and_cuts_back_to_the_least() -> None:
    stores = _Stores({"s0": 7, "s1": 5, "s2": None})  # s2 is down
    metadata = _Metadata()
    sealer = Sealer(metadata, stores, lambda: None)  # type: ignore[arg-type]
    assert await sealer.seal_extent(_extent(["s0", "s1", "s2"])) == 5
    assert [r.last for r in stores.replicas.values()] == [5, 5, None]
    assert metadata.sealed == [("e", SEALED, 5)]
    assert sealer.unsealed_replicas == {("e", "s2")}  # sealed when it answers again
    # every replica stopped before any was cut back
    assert [step for step, _ in stores.asked] == ["stop"] * 3 + ["cut"] * 2


async def test_a_seal_that_reaches_no_replica_writes_nothing() -> None:
    stores = _Stores({"s0": None, "s1": None})
    metadata = _Metadata()
    sealer = Sealer(metadata, stores, lambda: None)  # type: ignore[arg-type]
    with pytest.raises(Unavailable):
        await sealer.seal_extent(_extent(["s0", "s1"]))
    assert metadata.sealed == [] and not sealer.sealing("e")


async def test_a_seal_is_remembered_for_sealed_lately_from_its_latest_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The seals of the last SEALED_LATELY seconds are remembered (sealing()), those
    before forgotten as later seals begin; sealed again, an extent counts from then."""
    now = [1000.0]
    monkeypatch.setattr(sealing, "time", SimpleNamespace(monotonic=lambda: now[0]))
    sealer = Sealer(_Metadata(), _Stores({"s0": 3}), lambda: None)  # type: ignore[arg-type]

    async def seal(extent_id: str, at: float) -> None:
        now[0] = 1000.0 + at
        sealer.stores.asked.clear()  # type: ignore[attr-defined]
        await sealer.seal_extent(msgspec.structs.replace(_extent(["s0"]), id=extent_id))

    await seal("e1", 0)
    await seal("e2", 20)
    await seal("e1", 25)  # again: remembered from 25 on
    await seal("e3", 40)
    assert [sealer.sealing(e) for e in ("e1", "e2", "e3")] == [True, True, True]
    await seal("e4", 52)
    assert [sealer.sealing(e) for e in ("e1", "e2", "e3", "e4")] == [True, False, True, True]
    assert set(sealer._mine) == {"e1", "e3", "e4"}
    await seal("e5", 56)
    assert set(sealer._mine) == {"e3", "e4", "e5"} and not sealer.sealing("e1")


class _Rows:
    """The extents' rows, and how they were read."""

    def __init__(self, extents: list[Extent]) -> None:
        self.extents = {e.id: e for e in extents}
        self.reads: list[str] = []

    async def get_extent(self, extent_id: str) -> Extent | None:
        self.reads.append("get_extent")
        return self.extents.get(extent_id)

    async def list_extents_in(self, statuses: tuple[str, ...]) -> list[Extent]:
        self.reads.append("list_extents_in")
        return [e for e in self.extents.values() if e.status in statuses]


class _Resealed:
    def __init__(self) -> None:
        self.sealed: list[tuple[str, str, int]] = []

    def get(self, store_id: str) -> SimpleNamespace:
        async def seal(extent: str, at: int) -> int:
            if store_id == "down":
                raise Unavailable("store host down")
            self.sealed.append((extent, store_id, at))
            return at

        return SimpleNamespace(seal=seal)


@pytest.mark.parametrize("count", [3, sealing.STRAGGLERS_IN_BULK + 1])
async def test_straggling_replicas_read_each_extent_once_and_many_in_one_read(count: int) -> None:
    """After a power loss every replica of every extent sealed meanwhile straggles:
    each extent's row was read once per replica, one after another (3,500-5,500 reads
    of the leader's at 1,000 queues). Now once per extent, or in one statement."""
    sealed = [msgspec.structs.replace(_extent(["s0", "s1", "down"]), id=f"e{i}", status=SEALED,
                                      sealed_seq=i) for i in range(count)]  # fmt: skip
    rows = _Rows(sealed)
    stores = _Resealed()
    sealer = Sealer(rows, stores, lambda: None)  # type: ignore[arg-type]
    sealer.unsealed_replicas = {(e.id, s) for e in sealed for s in e.stores}
    sealer.unsealed_replicas.add(("gone", "s0"))  # purged since: forgotten
    await sealer.seal_stragglers()
    assert sorted(stores.sealed) == sorted((e.id, s, e.sealed_seq or 0) for e in sealed
                                           for s in ("s0", "s1"))  # fmt: skip
    assert sealer.unsealed_replicas == {(e.id, "down") for e in sealed}  # sealed when back
    if count > sealing.STRAGGLERS_IN_BULK:
        assert rows.reads == ["list_extents_in"]
    else:
        assert rows.reads == ["get_extent"] * (count + 1)
