"""Which output host serves which consumer group, in a cluster: each group is a lease in
the metadata store. An output host renews the leases it holds, takes unheld ones up to
its fair share of the groups, and drops a group whose lease it lost. When an output
host dies its leases expire and the others take its groups over from the persisted ack
levels.

The fencing rule: a group has one acting output host at any instant. A holder acts for a
group (delivers, settles, writes ack levels) only while its own clock says the lease
cannot have expired yet: from the moment it *asked* for the lease, ``LEASE_TTL`` minus
``MARGIN``. The store judges expiry by its own clock from a later moment (when it
served the request), so a holder always stops before anyone else can take the lease,
whatever happens to it meanwhile (a pause, a slow or lost metadata store). Its ack-level
writes carry the lease's epoch as well, and the store refuses them once the lease has
passed to another holder."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from cherami.cluster.membership import OUTPUTHOST, live_hosts
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import Fence
from cherami.periodic import Periodic
from cherami.roles.outputhost.service import DELETED_CLOSE, MOVED_CLOSE, OutputHostService

log = logging.getLogger("cherami.outputhost.ownership")

LEASE_TTL = 3.0
MARGIN = 0.5  # seconds before the lease's end at which a holder stops acting
TICK = 0.5
# after this host could not reach the metadata store, it only renews its own leases for
# this long: when an outage ends, each group goes back to the holder that has its acks
# in memory, not to whichever host ticks first (that would deliver them all again)
RECOVERY_GRACE = 2.0


def group_lease(queue: str, group: str) -> str:
    return f"group:{queue}/{group}"


@dataclass
class _Held:
    epoch: int
    acting_until: float  # time.monotonic()


class GroupOwnership:
    def __init__(self, outputs: OutputHostService, metadata: MetadataStore, host_id: str) -> None:
        self.outputs = outputs
        self.metadata = metadata
        self.id = host_id
        self.held: dict[tuple[str, str], _Held] = {}
        self._periodic = Periodic("group ownership tick", TICK, self._tick_noting_outages)
        self._failing = False  # the last tick could not reach the metadata store
        self._taking_after = 0.0  # time.monotonic(): may take others' groups from then

    @property
    def owned(self) -> set[tuple[str, str]]:
        return set(self.held)

    def owns(self, queue: str, group: str) -> bool:
        """Whether this host holds the group (requests for it are served here)."""
        return (queue, group) in self.held

    def fence(self, queue: str, group: str) -> Fence | None:
        """The group's fence while this host may act for it, else None."""
        held = self.held.get((queue, group))
        if held is None or time.monotonic() >= held.acting_until:
            return None
        return Fence(lease=group_lease(queue, group), epoch=held.epoch)

    def start(self) -> None:
        self._periodic.start(first_now=True)

    async def stop(self) -> None:
        await self._periodic.stop()

    async def _tick_noting_outages(self) -> None:
        try:
            await self.tick()
        except Exception:
            self._failing = True
            self._taking_after = math.inf  # the first tick that succeeds renews only
            raise
        if self._failing:
            self._failing = False
            self._taking_after = time.monotonic() + RECOVERY_GRACE

    async def tick(self) -> None:
        groups = [
            (g.queue, g.name)
            for q in await self.metadata.list_queues()
            for g in await self.metadata.list_groups(q.name)
        ]
        outputs = max(1, len(await live_hosts(self.metadata, OUTPUTHOST)))
        fair = math.ceil(len(groups) / outputs)
        for key in sorted(set(self.held) - set(groups)):
            await self._drop(key, DELETED_CLOSE)
        for key in groups:
            held = self.held.get(key)
            if held is None and (len(self.held) >= fair or time.monotonic() < self._taking_after):
                continue
            asked = time.monotonic()
            epoch = await self.metadata.try_lease(group_lease(*key), self.id, LEASE_TTL)
            if held is not None and epoch != held.epoch:  # lost, or lost and taken back
                await self._drop(key, MOVED_CLOSE)
                held = None
            if epoch is None:
                continue
            if held is None:
                self.held[key] = _Held(epoch, asked + LEASE_TTL - MARGIN)
                log.info("output host %s takes group %s/%s (epoch %d)", self.id, *key, epoch)
                await self.outputs.group(*key)
            else:
                held.acting_until = asked + LEASE_TTL - MARGIN

    async def _drop(self, key: tuple[str, str], close_code: int) -> None:
        self.held.pop(key, None)
        log.info("output host %s drops group %s/%s", self.id, *key)
        await self.outputs.unload(*key, close_code=close_code)
