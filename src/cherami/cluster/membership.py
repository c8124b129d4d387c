"""Host membership: every role process heartbeats into the metadata store; a host that
misses heartbeats for DEAD_AFTER seconds is dead. Also keeps a StoreDirectory in step
with the live store hosts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time

from cherami.metadata.base import MetadataStore
from cherami.metadata.models import Host
from cherami.roles.storehost.directory import StoreDirectory

log = logging.getLogger("cherami.cluster.membership")

HEARTBEAT_INTERVAL = 0.5
DEAD_AFTER = 3.0

STOREHOST, INPUTHOST, OUTPUTHOST, CONTROLLER, FRONTEND = (
    "storehost", "inputhost", "outputhost", "controller", "frontend",
)  # fmt: skip


def host_id(data_dir: str, role: str) -> str:
    """A host's id, kept in its data dir so that it survives restarts."""
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, f"{role}.id")
    try:
        with open(path) as f:
            return f.read().strip()
    except FileNotFoundError:
        new = f"{role}-{secrets.token_hex(4)}"
        with open(path, "w") as f:
            f.write(new)
        return new


class Membership:
    def __init__(self, metadata: MetadataStore, host: str, role: str, address: str) -> None:
        self.metadata = metadata
        self.host = Host(id=host, role=role, address=address, heartbeat_at=0.0)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.beat()
        self._task = asyncio.create_task(self._loop())

    async def beat(self) -> None:
        self.host.heartbeat_at = time.time()
        await self.metadata.heartbeat(self.host)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_INTERVAL)
            try:
                await self.beat()
            except Exception as err:
                log.warning("heartbeat of %s failed: %s", self.host.id, err)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def live_hosts(metadata: MetadataStore, role: str) -> list[Host]:
    return await metadata.list_hosts(role, alive_within=DEAD_AFTER)


async def address_of(metadata: MetadataStore, role: str, host: str) -> str | None:
    for h in await live_hosts(metadata, role):
        if h.id == host:
            return h.address
    return None


class StoreWatcher:
    """Keeps a StoreDirectory in step with the live store hosts in the metadata."""

    def __init__(self, metadata: MetadataStore, stores: StoreDirectory) -> None:
        self.metadata = metadata
        self.stores = stores
        self.live: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> set[str]:
        hosts = await live_hosts(self.metadata, STOREHOST)
        for h in hosts:
            await self.stores.set_address(h.id, h.address)
        self.live = {h.id for h in hosts}
        return self.live

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_INTERVAL)
            try:
                await self.refresh()
            except Exception as err:
                log.warning("store host refresh failed: %s", err)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
