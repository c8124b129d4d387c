"""The output host's ack-level committer: persists the groups' moved ack levels and
changed redelivery rows in group commits (one metadata write per flush and fence, not
per ack), and tells a settlement that waits for durability when its write is done."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from cherami.errors import Fenced, Unavailable
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import AckLevel, Fence
from cherami.roles.outputhost.groupconsumer import GroupConsumer
from cherami.roles.outputhost.redelivery import write as write_parked

log = logging.getLogger("cherami.outputhost.committer")


class Holdings(Protocol):
    """Which groups and extents this output host serves, and whether it may act for
    them now (ownership.py). ``holds(queue, group, catalog.WHOLE)``: whether it serves the group
    whole."""

    def owns(self, queue: str, group: str) -> bool: ...

    def holds(self, queue: str, group: str, extent: str) -> bool: ...

    def acting(self, queue: str, group: str, extent: str) -> bool: ...

    def fence(self, queue: str, group: str, extent: str) -> Fence | None: ...

    def fenced(self, queue: str, group: str, extent: str) -> None:
        """A write under the extent's fence was refused: another host holds it now."""

    def riding_out(self) -> bool: ...


Failed = dict[str, dict[str, Exception]]  # group key -> extent -> why its write failed


class AckCommitter:
    """``groups`` are the output host's groups by key; ``holdings`` None means one
    process serves every extent, unfenced."""

    def __init__(
        self,
        metadata: MetadataStore,
        groups: Mapping[str, GroupConsumer],
        holdings: Holdings | None,
        riding_out: Callable[[], bool],
        interval: float,
    ) -> None:
        """``interval``: settlements gather this long into one write (timing.ack_flush_interval)."""
        self.metadata = metadata
        self._interval = interval
        self._groups = groups
        self._holdings = holdings
        self._riding_out = riding_out
        self._flushed: dict[str, asyncio.Future[dict[str, Exception]]] = {}
        self._wake = asyncio.Event()  # a settlement waits for the next flush
        self._unwritten: set[str] = set()  # groups with levels or rows to write
        self._writing: set[str] = set()  # the groups of the flush under way
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._flush_loop())

    async def stop(self) -> None:
        """Stop the loop and write what is left: a write the stop cut short is written
        again (its levels were taken from the groups; they are marked unwritten again),
        and the settlements that waited for it are answered by this last flush."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        waiters, self._flushed = self._flushed, {}
        try:
            failed = await self.flush_once()
        except Exception as err:
            log.error("last ack level flush failed: %s", err)
            for waiter in waiters.values():
                if not waiter.done():
                    waiter.set_exception(Unavailable(f"ack levels not written: {err}"))
            return
        _answer(waiters, failed)

    def mark(self, key: str) -> None:
        """The group has levels or rows to write (the set of the moment: a flush swaps it)."""
        self._unwritten.add(key)

    def busy(self, key: str) -> bool:
        """Whether the group has levels or rows to write, or in a write under way."""
        return key in self._unwritten or key in self._writing

    async def flushed(self, consumer: GroupConsumer, extents: Iterable[str] | None = None) -> None:
        """Wait until every ack of the group made so far is persisted; raises
        Unavailable when the write for one of ``extents`` (None: any) failed, or this
        host may no longer act for it."""
        waiter = self._flushed.get(consumer.key)
        if waiter is None or waiter.done():
            waiter = self._flushed[consumer.key] = asyncio.get_running_loop().create_future()
        self._wake.set()  # a settlement waits: flush now, not at the next interval
        failed = await asyncio.shield(waiter)
        if extents is not None:
            failed = {e: failed[e] for e in extents if e in failed}
        if failed:
            raise next(iter(failed.values()))

    async def _flush_loop(self) -> None:
        """Group commit: a flush starts when a settlement waits for one (at once when
        none is under way; the settlements that arrive during a write share the next
        one) or every ack_flush_interval for the acks nobody waits for (streams)."""
        while True:
            try:
                async with asyncio.timeout(self._interval):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            waiters, self._flushed = self._flushed, {}
            try:
                failed = await self.flush_once()
            except asyncio.CancelledError:  # stopped mid-write: the last flush answers them
                self._flushed = waiters | self._flushed
                raise
            _answer(waiters, failed)

    async def flush_once(self) -> Failed:
        """Persist the changed ack levels and parked rows: unfenced groups (one process
        serves every extent) in one write; in a cluster, one write per fence (an
        extent's, or a whole group's). Returns, per group, the extents whose write
        failed or that this host may no longer act for, with the error."""
        failed: Failed = {}
        if self._riding_out():  # written once the store answers again (outage.py)
            return failed
        # only the groups that were told of a change: an idle group costs the flush nothing
        keys, self._unwritten = self._unwritten, set()
        self._writing = keys
        try:
            return await self._flush(keys)
        except asyncio.CancelledError:  # stopped mid-write: the last flush takes them
            self._unwritten |= keys
            raise
        finally:
            self._writing = set()

    async def _flush(self, keys: set[str]) -> Failed:
        failed: Failed = {}
        touched = [c for k in keys if (c := self._groups.get(k)) is not None]
        holdings = self._holdings
        if holdings is None:
            err = await self._write_levels(touched, None, None)
            if err is not None:
                for consumer in touched:
                    failed[consumer.key] = dict.fromkeys(consumer.cursors, err)
            return failed
        writes: list[tuple[GroupConsumer, Fence, set[str]]] = []
        for consumer in touched:
            by_fence: dict[Fence, set[str]] = {}
            queue, group = consumer.group.queue, consumer.group.name
            for extent in consumer.unwritten():
                fence = holdings.fence(queue, group, extent)
                if fence is None or consumer.stopped:  # may not act: kept for the new holder
                    moving = Unavailable(f"group {consumer.key} is moving; retry")
                    failed.setdefault(consumer.key, {})[extent] = moving
                else:
                    by_fence.setdefault(fence, set()).add(extent)
            writes += [(consumer, fence, extents) for fence, extents in by_fence.items()]
        # units with levels alone to write go together, every fence's in one write (a
        # write per unit, a transaction each, was 4,000 after a power loss at 1,000
        # queues); those with parked rows as before (rows before the levels past them).
        # Both sorts, and the levels, are taken here, before any wait: no row can be
        # parked in between
        together = [w for w in writes if not w[0].parked.pending]
        alone = [w for w in writes if w[0].parked.pending]
        levels = [(fence, c.dirty_levels(extents)) for c, fence, extents in together]
        try:
            together_errors, alone_errors = await asyncio.gather(
                self._write_together(together, levels),
                asyncio.gather(*(self._write_levels([c], f, e) for c, f, e in alone)),
            )
        except asyncio.CancelledError:  # stopped mid-write: the last flush writes them
            for consumer, _, extents in together:
                consumer.unwritten_again(extents)
            raise
        errors = [*together_errors, *alone_errors]
        for (consumer, _, extents), err in zip([*together, *alone], errors, strict=True):
            if err is None:
                continue
            failed.setdefault(consumer.key, {}).update(dict.fromkeys(extents, err))
            if isinstance(err, Fenced):  # another host has them now: stop acting for them
                for extent in extents:
                    holdings.fenced(consumer.group.queue, consumer.group.name, extent)
        for consumer in touched:  # kept for the new holder, or to write again
            if consumer.unwritten():
                self._unwritten.add(consumer.key)
        return failed

    async def _write_together(
        self,
        writes: list[tuple[GroupConsumer, Fence, set[str]]],
        levels: list[tuple[Fence, list[AckLevel]]],
    ) -> list[Exception | None]:
        """Write ``levels`` (each of ``writes``' fence) in one write; per write, None or
        why it failed (Fenced: its lease moved on)."""
        batch = [(fence, rows) for fence, rows in levels if rows]
        if not batch:
            return [None] * len(writes)
        try:
            refused = await self.metadata.put_fenced_ack_levels(batch)
        except Exception as err:
            for consumer, _, extents in writes:  # write them again next time
                consumer.unwritten_again(extents)
            log.error("ack level flush failed: %s", err)
            why = err if isinstance(err, Unavailable) else None
            return [why or Unavailable(f"ack levels could not be written: {err}")] * len(writes)
        if refused:
            log.info("ack levels of %d unit(s) not written: their leases moved on", len(refused))
        outcomes: list[Exception | None] = []
        for consumer, fence, extents in writes:
            if fence in refused:
                consumer.unwritten_again(extents)
                outcomes.append(Fenced(f"lease {fence.lease} moved past epoch {fence.epoch}"))
            else:
                outcomes.append(None)
        return outcomes

    async def _write_levels(
        self, consumers: list[GroupConsumer], fence: Fence | None, extents: set[str] | None
    ) -> Exception | None:
        """Write the changed levels and parked rows of the groups (of ``extents`` only,
        unless None) in one fence."""
        rows = [row for c in consumers for row in c.dirty_levels(extents)]
        parked = [c.parked for c in consumers if c.parked.pending]
        if not rows and not parked:
            return None
        try:
            # rows before the levels past them
            await write_parked(self.metadata, parked, fence, extents)
            if rows:
                await self.metadata.put_ack_levels(rows, fence=fence)
        except BaseException as err:
            for consumer in consumers:  # written again next time (or by a stop's last flush)
                consumer.unwritten_again(extents)
            if not isinstance(err, Exception):
                raise  # cancelled: stopped mid-write
            log.error("ack level flush failed: %s", err)
            if isinstance(err, Unavailable):
                return err
            return Unavailable(f"ack levels could not be written: {err}")
        return None


def _answer(waiters: dict[str, asyncio.Future[dict[str, Exception]]], failed: Failed) -> None:
    """Tell the settlements that waited for a flush how their groups' writes went."""
    for key, waiter in waiters.items():
        if not waiter.done():
            waiter.set_result(failed.get(key, {}))
