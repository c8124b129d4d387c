"""An in-process store host: a test double for the roles that talk to store hosts (input
host, output host, controller, frontend), as dramatiq's StubBroker or httpx's
MockTransport are for their users.

It is the store host's own service (server.py: group commit, commit points, waiting
reads, seals, the free-disk floor, the cluster hello) over a ``MemoryExtentStore``,
reached by the store host's own client (client.py) through an in-memory pipe
(wire/pipe.py) instead of a socket. Only the bytes' way differs, so it answers as a store
host process does (tests/contract/test_store_host_contract.py runs the same cases on
both); nothing is written to disk, no process is started, and it is as fast as the
event loop.

The roles never choose it: a ``StoreDirectory`` made with the in-process store hosts
(``StoreDirectory(hosts=...)``) hands out clients of the one whose address a store host
was registered with (``InProcessStoreHost.address``, ``inprocess:<id>``), as it hands
out TCP clients for the rest. What it cannot stand in for: durability (everything is
lost with the process) and a store host's process faults (a SIGKILL, a restart on its
data). ``cut`` drops its connections and ``fill_disk`` its free disk, for the failure
paths a role must take."""

from __future__ import annotations

import asyncio
import os

from cherami.roles.storehost.server import DiskUsage, StoreHostService
from cherami.storage.memory import MemoryExtentStore
from cherami.wire import grants
from cherami.wire import handshake as h
from cherami.wire.framing import FrameReader, FrameWriter
from cherami.wire.pipe import framed_pipe

SCHEME = "inprocess:"
DISK_TOTAL = 1 << 40  # the double's disk: 1 TiB, all of it free unless filled


class InProcessStoreHost:
    """One store host in this process (``start`` it on the running event loop)."""

    def __init__(self, store_id: str, key: bytes | None = None) -> None:
        """``key``: the cluster key its clients must prove (default: this process's)."""
        self.store_id = store_id
        self.address = SCHEME + store_id
        self.pid = os.getpid()  # what a node's load meter asks of a store host process
        self.data_dir: str | None = None  # none: nothing is written
        self.store = MemoryExtentStore()
        self.free_bytes = DISK_TOTAL
        self.service = StoreHostService(self.store, key=key, disk_usage=self.disk_usage)
        self._tasks: set[asyncio.Task[None]] = set()
        self._ends: set[FrameWriter] = set()
        self.running = False

    def disk_usage(self) -> DiskUsage:
        """Its disk's free and total bytes (what it reports as its load)."""
        return self.free_bytes, DISK_TOTAL

    async def start(self) -> None:
        await self.service.start(listen=False)
        self.running = True

    async def stop(self) -> None:
        """Stop it and drop what it holds (a store host's memory goes with its process)."""
        self.running = False
        self.cut()
        await self.service.stop()

    async def open(self, address: str) -> tuple[FrameReader, FrameWriter]:
        """A new connection to it (a StoreClient's opener): the client's end."""
        if not self.running:
            raise ConnectionRefusedError(f"in-process store host {self.store_id} is stopped")
        (reader, writer), (s_reader, s_writer) = framed_pipe(
            h.WELCOME_SIZE, h.HELLO_SIZE, grants.MAX_TOKEN, self.store_id
        )
        self._ends.add(s_writer)
        task = asyncio.create_task(self.service.serve_connection(s_reader, s_writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: self._ends.discard(s_writer))
        return reader, writer

    def cut(self) -> None:
        """Drop every connection to it: what waits on one fails with Unavailable, as
        when a store host is cut off; the clients connect again on their next request."""
        for writer in list(self._ends):
            writer.transport.abort()
        self._ends.clear()

    def fill_disk(self, full: bool = True) -> None:
        """Its disk below the free-disk floor (appends and new replicas are refused with
        storage_full), or (``full=False``) all free again."""
        self.free_bytes = 0 if full else DISK_TOTAL
