"""The leader's input-host placement reads the hosts table at most once per heartbeat
interval (roleprocess.RecentHosts): after a power loss it opened 2,000 extents and read
the table for each. A fake store counts the reads; the clock is advanced by hand."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cherami.membership import INPUTHOST, RecentHosts
from cherami.metadata.models import Host


class Hosts:
    """list_hosts only: counts the reads; ``gate`` holds them until set."""

    def __init__(self) -> None:
        self.reads = 0
        self.fail = False
        self.gate = asyncio.Event()
        self.gate.set()
        self.hosts = [Host(id="in-1", role=INPUTHOST, address="a:1", heartbeat_at=0.0)]

    async def list_hosts(
        self, role: str | None, alive_within: float | None, load: bool = True
    ) -> list[Host]:
        assert role == INPUTHOST and alive_within == 3.0 and load
        self.reads += 1
        await self.gate.wait()
        if self.fail:
            raise ConnectionError("down")
        return list(self.hosts)


def _recent(store: Hosts, now: list[float]) -> RecentHosts:
    metadata: Any = store
    return RecentHosts(metadata, INPUTHOST, 3.0, 0.5, clock=lambda: now[0])


async def test_one_read_per_interval() -> None:
    store, now = Hosts(), [100.0]
    recent = _recent(store, now)
    for _ in range(50):  # 50 extents placed within the interval
        assert [h.id for h in await recent.get()] == ["in-1"]
    assert store.reads == 1
    now[0] += 0.49
    await recent.get()
    assert store.reads == 1
    store.hosts.append(Host(id="in-2", role=INPUTHOST, address="a:2", heartbeat_at=0.0))
    now[0] += 0.01  # a heartbeat interval after the read: read again
    assert [h.id for h in await recent.get()] == ["in-1", "in-2"]
    assert store.reads == 2


async def test_callers_at_once_share_one_read() -> None:
    store, now = Hosts(), [0.0]
    store.gate.clear()
    recent = _recent(store, now)
    waiting = [asyncio.create_task(recent.get()) for _ in range(8)]
    await asyncio.sleep(0)
    store.gate.set()
    assert all(len(hosts) == 1 for hosts in await asyncio.gather(*waiting))
    assert store.reads == 1


async def test_a_failed_read_is_not_kept() -> None:
    store, now = Hosts(), [0.0]
    store.fail = True
    recent = _recent(store, now)
    with pytest.raises(ConnectionError):
        await recent.get()
    store.fail = False
    assert len(await recent.get()) == 1  # at once, not an interval later
    assert store.reads == 2
