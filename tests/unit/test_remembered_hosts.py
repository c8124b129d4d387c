"""RememberingReads remembers who is alive by role, not by the window asked about: every
caller adds its loop's stalls to the window (membership.LoopWatch), so keyed by it each
read made a new entry, kept for ever, that an outage never found again."""

from __future__ import annotations

from typing import Any

from cherami.errors import Unavailable
from cherami.metadata.models import Host
from cherami.metadata.remembered import RememberingReads


class _Store:
    def __init__(self) -> None:
        self.down = False

    async def list_hosts(
        self, role: str | None, alive_within: float | None, load: bool = True
    ) -> list[Host]:
        if self.down:
            raise Unavailable("metadata store unavailable")
        return [Host(id="out-1", role="outputhost", address="a:1", heartbeat_at=0.0)]


async def test_hosts_are_remembered_once_per_role_whatever_the_window() -> None:
    store: Any = _Store()
    reads = RememberingReads(store)
    for i in range(1000):  # windows of 3 s plus each call's own stall
        await reads.list_hosts("outputhost", 3.0 + i / 1000, load=False)
    assert len(reads._memory) == 1
    store.down = True  # an outage: the last answer stands in for any window
    hosts = await reads.list_hosts("outputhost", 3.2345, load=False)
    assert [h.id for h in hosts] == ["out-1"] and reads.answered_from_memory == 1
