"""Sealing an extent's replicas at one point, and the replicas a seal could not reach:
sealed later, once they answer again (a straggler, or a store host that came back)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from cherami.errors import CheramiError, Unavailable
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import CONSUMED, DELETED, SEALED, Extent, Fence
from cherami.roles.storehost.client import StoreError
from cherami.roles.storehost.directory import StoreDirectory

# the controller's log lines keep the logger they were written under
log = logging.getLogger("cherami.controller.service")

RESEALS_AT_ONCE = 32  # a store host that came back: its replicas sealed at once
SEALED_LATELY = 30.0  # seconds a seal of this controller is remembered (sealing())
STRAGGLERS_IN_BULK = 32  # more extents with straggling replicas: their rows in one read


class Sealer:
    def __init__(
        self,
        metadata: MetadataStore,
        stores: StoreDirectory,
        fence: Callable[[], Fence | None],
    ) -> None:
        """``fence``: the leading controller's lease fence now (None: unfenced)."""
        self.metadata = metadata
        self.stores = stores
        self._fence = fence
        # replicas a seal could not reach; sealed when they answer again
        self.unsealed_replicas: set[tuple[str, str]] = set()
        # extents this controller is sealing or sealed lately -> when the seal began
        self._mine: dict[str, float] = {}

    def sealing(self, extent_id: str) -> bool:
        """Whether this controller is sealing the extent, or sealed it in the last
        SEALED_LATELY seconds. Its input host reports such an extent FAILING when an
        append meets a sealed replica, before the seal's metadata write: that is this
        seal showing, not a store host the input host cannot reach."""
        began = self._mine.get(extent_id)
        return began is not None and time.monotonic() - began < SEALED_LATELY

    async def seal_extent(self, extent: Extent) -> int:
        """Seal every reachable replica at the last sequence number all of them hold.

        First each replica is sealed where it stands, which stops every append: a publish
        is acked only once every replica holds it, so from the first of these seals on no
        further message can be acked. Every acked message is therefore at or below each
        replica's sealed point, and so at or below their minimum. Then every replica is
        cut back to that minimum: all acked messages stay, and every replica holds
        exactly the same records. (Taking the minimum of a first look and sealing there
        would race with appends acked between the look and the seal.)"""
        now = time.monotonic()
        # oldest first: those past SEALED_LATELY leave from the front (a pass over every
        # entry at each seal was 4.5% of the leader's CPU sealing 2,000 extents)
        while self._mine and now - next(iter(self._mine.values())) >= SEALED_LATELY:
            del self._mine[next(iter(self._mine))]
        self._mine.pop(extent.id, None)
        self._mine[extent.id] = now
        try:
            return await self._seal(extent)
        except BaseException:
            self._mine.pop(extent.id, None)  # not sealed: a FAILING report is news again
            raise

    async def _seal(self, extent: Extent) -> int:
        """The replicas are asked at once in each step (one after another, a seal took
        six round trips: at 1,000 queues after a power loss, 2,000 seals 32 at a time)."""
        lasts: dict[str, int] = {}

        async def stop(store_id: str) -> None:
            try:
                lasts[store_id] = await self.stores.get(store_id).seal(extent.id, -1)
            except CheramiError as err:
                if isinstance(err, StoreError) and err.code == "extent_not_found":
                    return  # this store never got a replica of the extent
                log.warning("replica %s of %s unreachable at seal: %s", store_id, extent.id, err)
                self.unsealed_replicas.add((extent.id, store_id))

        await asyncio.gather(*(stop(s) for s in extent.stores))
        if not lasts:
            raise Unavailable(f"no replica of extent {extent.id} is reachable")
        at = min(lasts.values())

        async def cut(store_id: str) -> None:
            try:
                await self.stores.get(store_id).seal(extent.id, at)
            except CheramiError as err:
                log.warning("replica %s of %s not sealed: %s", store_id, extent.id, err)
                self.unsealed_replicas.add((extent.id, store_id))

        await asyncio.gather(*(cut(s) for s in sorted(lasts)))
        await self.metadata.set_extent_status(extent.id, SEALED, sealed_seq=at, fence=self._fence())
        log.info("extent %s of queue %s sealed at %d", extent.id, extent.queue, at)
        return at

    async def seal_stragglers(self) -> None:
        """Seal the replicas that earlier seals could not reach, at the sealed seq,
        RESEALS_AT_ONCE at a time; each extent's row is read once, and every one in one
        statement when there are many (a read per replica one after another before:
        after a power loss at 1,000 queues, 3,500-5,500 reads of the leader's)."""
        pending = sorted(self.unsealed_replicas)
        rows = await self._rows(sorted({extent_id for extent_id, _ in pending}))
        limit = asyncio.Semaphore(RESEALS_AT_ONCE)

        async def seal(extent_id: str, store_id: str) -> None:
            extent = rows.get(extent_id)
            if extent is None or extent.sealed_seq is None:
                self.unsealed_replicas.discard((extent_id, store_id))
                return
            async with limit:
                try:
                    await self.stores.get(store_id).seal(extent_id, extent.sealed_seq)
                except CheramiError:
                    return
            self.unsealed_replicas.discard((extent_id, store_id))
            log.info("replica %s of %s sealed at %d", store_id, extent_id, extent.sealed_seq)

        await asyncio.gather(*(seal(e, s) for e, s in pending))

    async def _rows(self, ids: list[str]) -> dict[str, Extent]:
        """The extents' rows (those that still have one)."""
        if len(ids) > STRAGGLERS_IN_BULK:
            wanted = set(ids)
            every = await self.metadata.list_extents_in((SEALED, CONSUMED, DELETED))
            return {e.id: e for e in every if e.id in wanted}
        return {i: e for i in ids if (e := await self.metadata.get_extent(i)) is not None}

    async def reseal_replicas(self, store_id: str) -> None:
        """A store host came back: seal its replicas of extents sealed while it was away,
        RESEALS_AT_ONCE at a time (one after another, the leader's tick waited on a round
        trip per sealed extent before it opened any successor)."""
        store = self.stores.get(store_id)
        limit = asyncio.Semaphore(RESEALS_AT_ONCE)

        async def reseal(extent: Extent, at: int) -> None:
            async with limit:
                try:
                    await store.seal(extent.id, at)
                except CheramiError as err:
                    log.warning("reseal of %s on %s failed: %s", extent.id, store_id, err)

        await asyncio.gather(*(
            reseal(e, e.sealed_seq) for e in await self.metadata.list_extents_in((SEALED,))
            if store_id in e.stores and e.sealed_seq is not None
        ))  # fmt: skip
