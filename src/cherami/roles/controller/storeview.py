"""The store hosts a new extent may be placed on, as one short-lived view: which live
store hosts answer a ping, and their hosts-table rows (load reports, zones, disk).

Opening an extent asked every store host for a ping and read the whole hosts table,
each time: creating N queues cost 2x the store requests it needs (a ping to each
replica besides its create) and N reads of the table. The view is kept for
``KEEP_FOR`` seconds and shared by the extents opened meanwhile; a create that fails
on a store host drops it, so the next placement asks again. Placements made within
the view's life still spread out: Placements counts those the reports do not show."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from cherami.errors import CheramiError
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import Host
from cherami.roles.controller.recovery import PING
from cherami.roles.storehost.directory import StoreDirectory

STOREHOST = "storehost"
KEEP_FOR = 1.0  # seconds a view of the store hosts serves placements


class StoreView:
    def __init__(
        self,
        metadata: MetadataStore,
        stores: StoreDirectory,
        live_stores: Callable[[], set[str]] | None,
        clock: Callable[[], float] = time.monotonic,
        keep_for: float = KEEP_FOR,
    ) -> None:
        self.metadata = metadata
        self.stores = stores
        self._live_stores = live_stores
        self._clock = clock
        self._keep_for = keep_for
        self._view: tuple[float, list[Host]] | None = None  # (taken at, up hosts' rows)
        self._taking = asyncio.Lock()  # extents opened together share one look

    def invalidate(self) -> None:
        """A store host failed a request: the next placement looks again."""
        self._view = None

    async def up_stores(self) -> list[str]:
        """The store hosts that are live (heartbeating) and answer now: a ping each."""
        live = self._live_stores() if self._live_stores else None
        ids = [s for s in self.stores.ids() if live is None or s in live]
        answers = await asyncio.gather(*(self._reachable(s) for s in ids))
        return [s for s, reachable in zip(ids, answers, strict=True) if reachable]

    async def _reachable(self, store_id: str) -> bool:
        try:
            await self.stores.get(store_id).info([PING])
        except CheramiError:
            return False
        return True

    async def hosts(self) -> list[Host]:
        """The rows of the store hosts that answered, as of at most ``keep_for`` ago
        (less one the watcher no longer sees live)."""
        async with self._taking:
            view = self._view
            if view is None or self._clock() - view[0] >= self._keep_for:
                taken = self._clock()
                ids = await self.up_stores()
                rows = await self.metadata.list_hosts(STOREHOST, alive_within=None)
                known = {h.id: h for h in rows}
                hosts = [known.get(s) or Host(id=s, role=STOREHOST, address="", heartbeat_at=0.0)
                         for s in ids]  # fmt: skip
                view = self._view = (taken, hosts)
        live = self._live_stores() if self._live_stores else None
        return [h for h in view[1] if live is None or h.id in live]
