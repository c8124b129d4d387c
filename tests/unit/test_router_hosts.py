"""A cluster's frontend routes each request it forwards by the live input or output
hosts: it read the hosts table for every one; now at most once a heartbeat interval,
for every request under way (membership.RecentHosts). A fake store counts the reads."""

from __future__ import annotations

from typing import Any

from cherami.membership import INPUTHOST, OUTPUTHOST
from cherami.metadata.models import OPEN, Extent, Host
from cherami.roles.frontend.proxy import Router


class _Metadata:
    def __init__(self) -> None:
        self.reads: dict[str, int] = {}

    async def list_hosts(self, role: str, alive_within: float | None, load: bool) -> list[Host]:
        assert not load, "routing needs no load report (each names every extent served)"
        self.reads[role] = self.reads.get(role, 0) + 1
        return [Host(id=f"{role}-1", role=role, address=f"{role}:1", heartbeat_at=0.0)]

    async def list_extents(self, queue: str, statuses: tuple[str, ...] = ()) -> list[Extent]:
        return [Extent(id="e", queue=queue, kind="plain", status=OPEN,
                       input_host=f"{INPUTHOST}-1", stores=[], created_at=0.0)]  # fmt: skip


async def test_routes_share_one_read_of_the_hosts_table() -> None:
    metadata: Any = _Metadata()
    router = Router(metadata)
    for _ in range(100):  # 100 publishes forwarded at once (within the interval)
        assert await router.input_host("q") == f"{INPUTHOST}:1"
    assert metadata.reads[INPUTHOST] == 1
    assert OUTPUTHOST not in metadata.reads


async def test_settlements_share_the_routes_read() -> None:
    """A settlement finds each receipt's output host among the live ones: it read the
    hosts table (with every host's load report) for every ack (after a power loss at
    1,000 queues, 16% of the frontend's samples in a round)."""
    metadata: Any = _Metadata()
    router = Router(metadata)
    for _ in range(100):  # 100 acks at once, and a receive's route
        assert [h.address for h in await router.live(OUTPUTHOST)] == [f"{OUTPUTHOST}:1"]
    assert metadata.reads[OUTPUTHOST] == 1
