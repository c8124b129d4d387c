"""Recovery at a node's start: the extents its input host left open are kept open where
every replica agrees on where they end, and sealed where not."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from cherami.errors import Unavailable
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import FAILING, OPEN, Extent
from cherami.roles.storehost.directory import INFO_CHUNK, StoreDirectory

# the controller's log lines keep the logger they were written under (tests and operators
# read the "recovered ..." line)
log = logging.getLogger("cherami.controller.service")

PING = "_ping"  # an extent name no extent has: asking for it tests that a store answers
RECOVERY_CONCURRENCY = 16  # seals under way at once when a node recovers
# a store host still starting (replaying its journal, its RocksDB opening) may answer
# slowly: it is asked this long for each chunk of replica ends, this many times, before
# its replicas count as unknown (and every extent with one is sealed: with thousands of
# queues, a minute of seals and opens)
ASK_TIMEOUT = 15.0
ASK_TRIES = 3


def _agreed(lasts: dict[tuple[str, str], int], extent: Extent) -> int | None:
    """The last sequence number every replica of the extent holds, when all of them
    answered open and end at the same one; None otherwise."""
    ends = {lasts.get((extent.id, s)) for s in extent.stores}
    if None in ends or len(ends) != 1:
        return None
    return ends.pop()


class Recovery:
    def __init__(
        self,
        metadata: MetadataStore,
        stores: StoreDirectory,
        seal_extent: Callable[[Extent], Awaitable[int]],
        lock: Callable[[str], asyncio.Lock],
        ensure_extents: Callable[[str], Awaitable[object]],
    ) -> None:
        """``seal_extent`` seals a broken extent, under ``lock`` (its queue's);
        ``ensure_extents`` then opens what the queue needs."""
        self.metadata = metadata
        self.stores = stores
        self._seal_extent = seal_extent
        self._lock = lock
        self._ensure_extents = ensure_extents

    async def recover(self) -> None:
        """At a node's start: the extents its input host left open (it died with the
        last run) are kept open where that is safe and sealed where it is not.

        An open extent whose every replica exists, is unsealed and ends at the same
        sequence number holds the same records on each (appends reach a replica in
        order and whole): its input host goes on from there, as after any reconnect, and
        the replicas are told that all of it is on every replica (readable). One where
        they differ (a publish was under way), a replica is missing or sealed, or that
        was FAILING is sealed as the leader seals any failed extent, and its queue gets
        what it needs. The replicas are asked in one request per store host, so an idle
        node with any number of queues comes back in a few round trips, not a seal and
        an open per queue."""
        extents = await self.metadata.list_extents_in((OPEN, FAILING))
        lasts = await self._replica_ends([e for e in extents if e.status == OPEN])
        keep = [e for e in extents if e.status == OPEN and _agreed(lasts, e) is not None]
        kept = {e.id for e in keep}
        broken = [e for e in extents if e.id not in kept]
        await self._commit_kept(keep, lasts)
        limit = asyncio.Semaphore(RECOVERY_CONCURRENCY)

        async def seal(extent: Extent) -> None:
            async with limit, self._lock(extent.queue):
                await self._seal_extent(extent)

        await asyncio.gather(*(seal(e) for e in broken))
        for name in sorted({e.queue for e in broken}):
            await self._ensure_extents(name)
        log.info("recovered %d open extents: %d kept open, %d sealed", len(extents),
                 len(keep), len(broken))  # fmt: skip

    async def _replica_ends(self, extents: list[Extent]) -> dict[tuple[str, str], int]:
        """(extent, store) -> the replica's last sequence number, for each replica that
        exists and is open; one info request per store host (in chunks)."""
        by_store: dict[str, list[str]] = {}
        for extent in extents:
            for store_id in extent.stores:
                by_store.setdefault(store_id, []).append(extent.id)

        async def ask(store_id: str, ids: list[str]) -> list[tuple[str, str, int]]:
            client = self.stores.get(store_id)
            ends = []
            for i in range(0, len(ids), INFO_CHUNK):
                for attempt in range(1, ASK_TRIES + 1):
                    try:
                        infos = await client.info(ids[i : i + INFO_CHUNK], timeout=ASK_TIMEOUT)
                        break
                    except Unavailable as err:
                        if attempt == ASK_TRIES:
                            raise
                        log.info("store host %s at recovery: %s; asking again", store_id, err)
                        await asyncio.sleep(0.5)
                for info in infos:
                    if info.exists and not info.sealed:
                        ends.append((info.extent, store_id, info.last_seq))
            return ends

        answers = await asyncio.gather(
            *(ask(s, ids) for s, ids in by_store.items()), return_exceptions=True
        )
        lasts: dict[tuple[str, str], int] = {}
        for store_id, answer in zip(by_store, answers, strict=True):
            if isinstance(answer, BaseException):
                log.warning("store host %s did not answer at recovery: %s", store_id, answer)
                continue
            for extent_id, store, last in answer:
                lasts[(extent_id, store)] = last
        return lasts

    async def _commit_kept(self, keep: list[Extent], lasts: dict[tuple[str, str], int]) -> None:
        """Tell each replica of the extents kept open that what it holds is on every
        replica (a store host makes an open extent readable only up to that point),
        then wait for one answer per store host: the commits before it are applied."""
        stores = sorted({s for e in keep for s in e.stores})
        for extent in keep:
            last = _agreed(lasts, extent)
            if last:
                for store_id in extent.stores:
                    self.stores.get(store_id).commit_nowait(extent.id, last)
        await asyncio.gather(*(self.stores.get(s).info([PING]) for s in stores))
