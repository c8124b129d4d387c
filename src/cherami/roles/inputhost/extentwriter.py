"""One open extent as its input host writes it: sequence numbers are assigned here and
every append goes to every replica at once, pipelined (no waiting for the previous
append's acks). An append is durable when every replica has acked it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from cherami.errors import ExtentSealed, StorageFull, Unavailable
from cherami.loadmeter import Activity
from cherami.metadata.models import Extent
from cherami.roles.storehost.client import StoreClient, check_appended
from cherami.telemetry import PROCESS
from cherami.wire.store import pack_records

log = logging.getLogger("cherami.inputhost.extentwriter")

APPEND_TIMEOUT = 5.0  # a replica that does not ack by then is treated as failed


class ExtentWriter:
    def __init__(self, extent: Extent, replicas: list[StoreClient]) -> None:
        self.extent = extent
        self.replicas = replicas
        self.next_seq = 1
        self.failed = False
        self.appended = self.appended_bytes = 0  # acked by every replica (load reports)
        self.activity: Activity | None = None  # told of each append (load reports)

    @property
    def id(self) -> str:
        return self.extent.id

    async def open(self) -> None:
        infos = []
        for replica in self.replicas:
            await replica.connect()
            infos.extend(await replica.info([self.extent.id]))
        if any(not i.exists or i.sealed for i in infos):
            self.failed = True
            raise ExtentSealed(f"extent {self.extent.id} is not open on every replica")
        self.next_seq = max(i.last_seq for i in infos) + 1

    async def append(self, records: list[bytes], delivery_ms: list[int] | None) -> int:
        """Append and wait until every replica has it on disk; returns the first seq."""
        if self.failed or not all(r.connected for r in self.replicas):
            self.failed = True  # never write a batch to only some of the replicas
            raise ExtentSealed(f"extent {self.extent.id} failed")
        first = self.next_seq
        self.next_seq += len(records)
        try:
            # no await between the sends: every replica sees appends in seq order
            packed = pack_records(records)  # encoded once for every replica
            # a plain extent's store keeps the array as it is, given its size
            size = -1 if delivery_ms is not None else sum(map(len, records))
            started = time.perf_counter()
            futures = [
                r.append_nowait(self.id, first, packed, delivery_ms, size) for r in self.replicas
            ]
            for replica, future in zip(self.replicas, futures, strict=True):
                future.add_done_callback(_timer(replica.store_id, started, len(records)))
            for replica in self.replicas:
                await replica.drain()
            try:
                async with asyncio.timeout(APPEND_TIMEOUT):
                    replies = await asyncio.gather(*futures, return_exceptions=True)
            except TimeoutError:
                for replica, future in zip(self.replicas, futures, strict=True):
                    if not future.done():
                        replica.reset(f"no append ack in {APPEND_TIMEOUT}s")
                raise Unavailable(f"a replica did not ack within {APPEND_TIMEOUT}s") from None
            for reply in replies:
                if isinstance(reply, BaseException):
                    raise reply
                check_appended(reply)
            for replica in self.replicas:  # now readers of any replica may see it
                replica.commit_nowait(self.id, first + len(records) - 1)
            self.appended += len(records)
            self.appended_bytes += len(packed)
            if self.activity is not None:
                self.activity.touch(self.extent.id)
        except StorageFull:
            self.failed = True  # some replicas may hold the append: seal, never extend
            raise
        except Exception as err:
            self.failed = True
            log.warning("append to extent %s failed: %s", self.id, err)
            raise ExtentSealed(f"extent {self.id}: {err}") from err
        return first


def _timer(store: str, started: float, messages: int) -> Callable[[Any], None]:
    """A callback that times one replica's synced append when its ack arrives."""

    def done(future: Any) -> None:
        if not future.cancelled() and future.exception() is None:
            PROCESS.store_append(store, time.perf_counter() - started, messages)

    return done
