"""Which store hosts exist and how to reach them: one StoreClient per store host."""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

from cherami.errors import CheramiError, Unavailable
from cherami.membership import STOREHOST, live_hosts
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import Extent
from cherami.periodic import Periodic
from cherami.roles.storehost.client import StoreClient
from cherami.wire import handshake
from cherami.wire.store import ExtentInfo, ReadResult

if TYPE_CHECKING:
    from cherami.roles.storehost.inprocess import InProcessStoreHost

T = TypeVar("T")

INFO_CHUNK = 1000  # extents asked about in one info request
REFRESH_INTERVAL = 0.5  # how often a StoreWatcher reads the live store hosts


class StoreDirectory:
    def __init__(
        self,
        key: bytes | None = None,
        hosts: Iterable[InProcessStoreHost] = (),
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """``key``: the cluster key its clients prove (default: the environment's,
        wire/handshake.py); ``hosts``: in-process store hosts (inprocess.py, the test
        double): a store host at one of their addresses is reached through its pipe, any
        other over TCP (with TLS, verifying with ``tls``, when given)."""
        self._key = key
        self._tls = tls
        self._in_process = {host.address: host for host in hosts}
        self._clients: dict[str, StoreClient] = {}

    @property
    def key(self) -> bytes:
        """The cluster key the store hosts check (what read grants are signed with)."""
        return self._key if self._key is not None else handshake.cluster_key()

    async def set_address(self, store_id: str, address: str) -> None:
        current = self._clients.get(store_id)
        if current is not None and current.address == address:
            return
        host = self._in_process.get(address)
        opener = host.open if host is not None else None
        self._clients[store_id] = StoreClient(
            store_id, address, key=self._key, opener=opener, tls=self._tls
        )
        if current is not None:
            await current.close()

    def ids(self) -> list[str]:
        return sorted(self._clients)

    def get(self, store_id: str) -> StoreClient:
        client = self._clients.get(store_id)
        if client is None:
            raise Unavailable(f"store host {store_id} is unknown")
        return client

    async def info(self, extent: Extent) -> ExtentInfo:
        """The extent's info from the first of its replicas that answers."""
        (info,) = await self._any(extent, lambda c: c.info([extent.id]))
        return info

    async def infos(self, extents: list[Extent]) -> dict[str, ExtentInfo]:
        """Each extent's info from one of its replicas: one request per store host for
        all the extents it is asked about (each from its first replica; an extent whose
        store host does not answer is asked of its other replicas one by one). An
        extent no replica answers for is left out."""
        by_store: dict[str, list[Extent]] = {}
        for extent in extents:
            if extent.stores:
                by_store.setdefault(extent.stores[0], []).append(extent)
        found: dict[str, ExtentInfo] = {}
        for store_id, asked in by_store.items():
            try:
                for i in range(0, len(asked), INFO_CHUNK):
                    chunk = [e.id for e in asked[i : i + INFO_CHUNK]]
                    for info in await self.get(store_id).info(chunk):
                        if info.exists:
                            found[info.extent] = info
            except CheramiError:
                pass
            for extent in asked:
                if extent.id not in found:
                    try:
                        found[extent.id] = await self.info(extent)
                    except CheramiError:
                        continue
        return found

    async def read(self, extent: Extent, after: bytes, max_count: int) -> ReadResult:
        """Read from the first of the extent's replicas that answers."""
        return await self._any(extent, lambda c: c.read(extent.id, after, max_count))

    async def _any(self, extent: Extent, call: Callable[[StoreClient], Awaitable[T]]) -> T:
        error: CheramiError = Unavailable(f"extent {extent.id} has no replicas")
        for store_id in extent.stores:
            try:
                return await call(self.get(store_id))
            except CheramiError as err:
                error = err
        raise error

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()


class StoreWatcher:
    """Keeps a StoreDirectory in step with the live store hosts in the metadata."""

    def __init__(self, metadata: MetadataStore, stores: StoreDirectory, dead_after: float) -> None:
        """``dead_after``: a store host silent this long is not live (timing.dead_after)."""
        self.metadata = metadata
        self.dead_after = dead_after
        self.stores = stores
        self.live: set[str] = set()
        self._refresher = Periodic("store host refresh", REFRESH_INTERVAL, self.refresh)

    async def refresh(self) -> set[str]:
        hosts = await live_hosts(self.metadata, STOREHOST, self.dead_after, load=False)
        for h in hosts:
            await self.stores.set_address(h.id, h.address)
        self.live = {h.id for h in hosts}
        return self.live

    async def start(self) -> None:
        await self.refresh()
        self._refresher.start()

    async def stop(self) -> None:
        await self._refresher.stop()
