"""Which output host serves which consumer group, in a cluster: each group is a lease in
the metadata store. An output host renews the leases it holds, takes unheld ones up to
its fair share of the groups, and drops a group whose lease it lost. When an output
host dies its leases expire and the others take its groups over from the persisted ack
levels."""

from __future__ import annotations

import logging
import math

from cherami.cluster.membership import OUTPUTHOST, live_hosts
from cherami.metadata.base import MetadataStore
from cherami.periodic import Periodic
from cherami.roles.outputhost.service import OutputHostService

log = logging.getLogger("cherami.outputhost.ownership")

LEASE_TTL = 3.0
TICK = 0.5


def group_lease(queue: str, group: str) -> str:
    return f"group:{queue}/{group}"


class GroupOwnership:
    def __init__(self, outputs: OutputHostService, metadata: MetadataStore, host_id: str) -> None:
        self.outputs = outputs
        self.metadata = metadata
        self.id = host_id
        self.owned: set[tuple[str, str]] = set()
        self._periodic = Periodic("group ownership tick", TICK, self.tick)

    def owns(self, queue: str, group: str) -> bool:
        return (queue, group) in self.owned

    def start(self) -> None:
        self._periodic.start(first_now=True)

    async def stop(self) -> None:
        await self._periodic.stop()

    async def tick(self) -> None:
        groups = [
            (g.queue, g.name)
            for q in await self.metadata.list_queues()
            for g in await self.metadata.list_groups(q.name)
        ]
        outputs = max(1, len(await live_hosts(self.metadata, OUTPUTHOST)))
        fair = math.ceil(len(groups) / outputs)
        for key in sorted(self.owned - set(groups)):
            await self._drop(key)
        for key in groups:
            lease = group_lease(*key)
            if key in self.owned:
                if not await self.metadata.try_lease(lease, self.id, LEASE_TTL):
                    await self._drop(key)
            elif len(self.owned) < fair and await self.metadata.try_lease(
                lease, self.id, LEASE_TTL
            ):
                self.owned.add(key)
                log.info("output host %s takes group %s/%s", self.id, *key)
                await self.outputs.group(*key)

    async def _drop(self, key: tuple[str, str]) -> None:
        self.owned.discard(key)
        log.info("output host %s drops group %s/%s", self.id, *key)
        await self.outputs.unload(*key)
