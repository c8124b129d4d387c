"""Which store hosts exist and how to reach them: one StoreClient per store host."""

from __future__ import annotations

from cherami.errors import Unavailable
from cherami.roles.storehost.client import StoreClient


class StoreDirectory:
    def __init__(self) -> None:
        self._clients: dict[str, StoreClient] = {}

    async def set_address(self, store_id: str, address: str) -> None:
        current = self._clients.get(store_id)
        if current is not None and current.address == address:
            return
        self._clients[store_id] = StoreClient(store_id, address)
        if current is not None:
            await current.close()

    def ids(self) -> list[str]:
        return sorted(self._clients)

    def get(self, store_id: str) -> StoreClient:
        client = self._clients.get(store_id)
        if client is None:
            raise Unavailable(f"store host {store_id} is unknown")
        return client

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
