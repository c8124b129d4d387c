"""Reads that outlive a metadata outage, for the request paths of a cluster process.

Publishing to a queue's open extents needs the metadata store only to read what it
already read a moment ago: the queue's record, its open extents, which input hosts are
alive (and an SQS queue's properties, for the SQS endpoint); and so does routing a
receive or a consume stream to the output hosts that hold a group's extents (who
holds which lease, which hosts are alive). ``RememberingReads`` wraps a store: each
such read is answered by the store, and when the store fails (``Unavailable``: it is
down or unreachable, which a call finds out within 0.5 s once the pool has failed to
connect, postgres_failover.py) from the last answer it gave for the same arguments.
From then on every remembered read is answered from memory at once, so the rest of an
outage costs no request a wait, while one read at a time (every ``DOWN_FOR`` seconds)
asks the store in the background;
the first that it answers ends the outage. A read that never succeeded before still
asks, and fails. A slow answer is waited for, never replaced by memory: routing must
follow a group that moves (a paused output host's lease passing to another) as soon as
the store says so.

Writes, leases and everything else go straight to the store: nothing is created, sealed
or renewed from memory. A "not found" answer forgets what was remembered, so a deleted
queue is not served from memory."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from cherami.errors import GroupNotFound, QueueNotFound, Unavailable
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import Extent, Group, Host, Queue

log = logging.getLogger("cherami.metadata.remembered")

T = TypeVar("T")

DOWN_FOR = 1.0  # while the store is out, one read in the background looks again this often


class RememberingReads:
    """A MetadataStore whose request-path reads survive an outage (see the module)."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self._memory: dict[tuple[Any, ...], Any] = {}
        self._down = False  # the store failed: answer from memory
        self._probe_at = 0.0  # time.monotonic() of the last read that looked again
        self._pending: set[asyncio.Future[Any]] = set()
        self.answered_from_memory = 0

    def __getattr__(self, name: str) -> Any:  # writes, leases, the rest: the store's own
        return getattr(self.store, name)

    async def get_queue(self, name: str) -> Queue:
        return await self._read(("queue", name), lambda: self.store.get_queue(name))

    async def get_group(self, queue: str, name: str) -> Group:
        return await self._read(("group", queue, name), lambda: self.store.get_group(queue, name))

    async def list_extents(self, queue: str, statuses: tuple[str, ...] = ()) -> list[Extent]:
        return await self._read(
            ("extents", queue, statuses), lambda: self.store.list_extents(queue, statuses)
        )

    async def list_hosts(
        self, role: str | None, alive_within: float | None, load: bool = True
    ) -> list[Host]:
        """Remembered by role, whatever ``alive_within`` (the last answer stands in for
        any window in an outage): callers add their loop's stalls to it (LoopWatch), so
        keyed by it every call made a new entry, kept for ever and never found again."""
        return await self._read(
            ("hosts", role, load), lambda: self.store.list_hosts(role, alive_within, load)
        )

    async def lease_holder(self, name: str) -> str | None:
        return await self._read(("lease", name), lambda: self.store.lease_holder(name))

    async def lease_holders(self, prefix: str) -> dict[str, str]:
        """Which output hosts hold a group's extents: nobody can take a lease while the
        store is out, and the holders act on through it (outage.py)."""
        return await self._read(("leases", prefix), lambda: self.store.lease_holders(prefix))

    async def get_queue_properties(self, queue: str, prefix: str = "") -> dict[str, str]:
        """An SQS queue's settings: a receive without its own wait reads the default."""
        return await self._read(
            ("properties", queue, prefix), lambda: self.store.get_queue_properties(queue, prefix)
        )

    async def delete_queue(self, name: str) -> None:
        await self.store.delete_queue(name)
        self._forget(lambda key: len(key) > 1 and key[1] == name)

    async def delete_group(self, queue: str, name: str) -> None:
        await self.store.delete_group(queue, name)
        self._memory.pop(("group", queue, name), None)

    async def _read(self, key: tuple[Any, ...], call: Callable[[], Awaitable[T]]) -> T:
        if key not in self._memory:
            return self._remember(key, await call())
        if self._down:  # answer at once; one read at a time finds out when it is back
            self._probe(key, call)
            remembered: T = self._from_memory(key)
            return remembered
        try:
            return self._remember(key, await call())
        except (QueueNotFound, GroupNotFound):
            self._memory.pop(key, None)
            raise
        except Unavailable as err:
            log.warning("metadata store unavailable; answering from memory: %s", err)
        self._down = True
        fallback: T = self._from_memory(key)
        return fallback

    def _from_memory(self, key: tuple[Any, ...]) -> Any:
        self.answered_from_memory += 1
        return self._memory[key]

    def _probe(self, key: tuple[Any, ...], call: Callable[[], Awaitable[Any]]) -> None:
        now = time.monotonic()
        if self._pending or now < self._probe_at + DOWN_FOR:
            return
        self._probe_at = now
        self._watch(key, asyncio.ensure_future(call()))

    def _watch(self, key: tuple[Any, ...], asked: asyncio.Future[Any]) -> None:
        self._pending.add(asked)
        asked.add_done_callback(lambda done: self._late(key, done))

    def _remember(self, key: tuple[Any, ...], value: T) -> T:
        self._memory[key] = value
        return value

    def _late(self, key: tuple[Any, ...], done: asyncio.Future[Any]) -> None:
        """A read that was not waited for has ended: the store is back when it answered."""
        self._pending.discard(done)
        if done.cancelled():
            return
        err = done.exception()
        if err is None:
            self._memory[key] = done.result()
        elif isinstance(err, QueueNotFound | GroupNotFound):
            self._memory.pop(key, None)
        else:
            return  # still out
        if self._down:
            log.info("metadata store answers again")
        self._down = False

    def _forget(self, match: Callable[[tuple[Any, ...]], bool]) -> None:
        for key in [k for k in self._memory if match(k)]:
            del self._memory[key]
