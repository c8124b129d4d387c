"""Retention runs only while its controller leads, and not while the leader replaces the
extents of lost hosts (for up to RETENTION_HOLD): after a power loss at 1,000 queues its
deletes of the consumed extents ran beside the replacement, a quarter of the store
hosts' CPU, and went on in a controller that had lost the lead. No I/O: fakes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from cherami.context import ProcessContext
from cherami.metadata.models import SEALED, Extent, Queue, QueueConfig
from cherami.roles.controller.leader import RETENTION_HOLD, RETENTION_INTERVAL, Leader
from cherami.roles.controller.retention import Retention
from cherami.wire.store import PLAIN, ExtentInfo


class _Metadata:
    def __init__(self) -> None:
        self.deleted: list[str] = []

    async def list_extents_in(self, statuses: tuple[str, ...]) -> list[Extent]:
        return [Extent(id="e1", queue="q", kind=PLAIN, status=SEALED, input_host="i",
                       stores=["s"], created_at=0.0)] if SEALED in statuses else []  # fmt: skip

    async def list_every_group(self) -> list[Any]:
        return []

    async def list_every_ack_level(self) -> list[Any]:
        return []

    async def list_every_parked_extent(self) -> list[Any]:
        return []

    async def set_extent_status(self, extent: str, status: str) -> None:
        self.deleted.append(extent)

    async def list_groups(self, queue: str) -> list[Any]:
        return []


class _Stores:
    async def infos(self, extents: list[Extent]) -> dict[str, ExtentInfo]:
        return {e.id: ExtentInfo(e.id, PLAIN, 0, 0, 0, True) for e in extents}


class _Controller:
    async def drop_replicas(self, extent: Extent) -> None:
        pass


@pytest.mark.parametrize("leads", [True, False])
async def test_retention_deletes_only_while_its_controller_leads(leads: bool) -> None:
    metadata = _Metadata()
    retention = Retention(_Controller(), metadata, _Stores())  # type: ignore[arg-type]
    queues = {"q": Queue(name="q", config=QueueConfig(), created_at=0.0)}
    await retention.tick(queues, [], lambda: leads)
    assert metadata.deleted == (["e1"] if leads else [])


class _Leases:
    async def try_lease(self, name: str, holder: str, ttl: float) -> int | None:
        return 7


async def test_no_retention_while_lost_hosts_extents_are_replaced() -> None:
    now = [100.0]
    leader = Leader(SimpleNamespace(fence=None), _Leases(), "c", SimpleNamespace(stores=None),
                    ctx=ProcessContext(clock=lambda: now[0]))  # type: ignore[arg-type]  # fmt: skip
    passes: list[float] = []

    async def tick() -> None:
        pass

    async def retain(at: float) -> None:
        passes.append(at)

    leader.tick = tick  # type: ignore[method-assign]
    leader._retain = retain  # type: ignore[method-assign]
    leader._replacing = (now[0], 0, 0)  # a power loss's replacement under way
    now[0] += RETENTION_INTERVAL
    await leader._lead()
    for task in list(leader._behind.values()):
        await task
    assert passes == []
    now[0] = 100.0 + RETENTION_HOLD  # still replacing after the hold: retention goes on
    await leader._lead()
    for task in list(leader._behind.values()):
        await task
    assert passes == [now[0]]
    await leader.stop()
