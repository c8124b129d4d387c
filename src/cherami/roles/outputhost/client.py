"""How the frontend reaches an output host: an ``OutputHostClient``, in terms of groups
and receipts (never the output host's consumers or cursors).

``LocalOutputHost`` is the output host of this process (a node serves every group
whole; a cluster's output-host process the extents it holds leases for). Its network
counterpart in a cluster is the frontend's forwarding (frontend/proxy.py Router and
frontend/consumerrouting.py): a request for a group this process does not serve goes
to an output host that does, as HTTP or as the WebSocket itself."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass
from typing import Literal, Protocol

from cherami.bounded import each
from cherami.errors import CheramiError
from cherami.loadmeter import Counts
from cherami.metadata.models import CONSUMED, FAILING, OPEN, SEALED, STREAM, Extent, Group, Queue
from cherami.roles.outputhost.consumestream import ConsumeStream, StreamSocket
from cherami.roles.outputhost.entry import Entry
from cherami.roles.outputhost.extentreader import ExtentCursor
from cherami.roles.outputhost.groupconsumer import GroupConsumer
from cherami.roles.outputhost.idlegroups import NONE_ACKED, Level, Unloaded, level_of
from cherami.roles.outputhost.keygate import TOP_KEYS
from cherami.roles.outputhost.ownership import group_leases
from cherami.roles.outputhost.receipts import host_tag, tag_of
from cherami.roles.outputhost.service import DELETED_CLOSE, MOVED_CLOSE, OutputHostService
from cherami.roles.outputhost.sharedreads import decode_chunk
from cherami.telemetry import END_TO_END_BUCKETS, Histogram

__all__ = ["DELETED_CLOSE", "MOVED_CLOSE", "TOP_KEYS", "Entry", "GroupState", "LocalOutputHost",
           "group_leases", "host_tag", "tag_of",
           "OutputHostClient", "Settlement", "StreamSocket"]  # fmt: skip

Delivery = tuple[Entry, str]  # a message delivered, and its receipt


@dataclass(frozen=True)
class Settlement:
    kind: Literal["ack", "nack", "extend"]
    seconds: float = 0.0  # a nack's delay, an extend's visibility timeout


@dataclass
class GroupState:
    """What the output host knows of a group it serves, for stats and metrics."""

    group: Group  # its current record here
    backlog: int
    in_flight: int
    oldest_unacked_age_seconds: float
    delivered: int
    acked: int
    nacked: int
    redelivered: int
    dead_lettered: int
    end_to_end: Histogram  # publish to ack, seconds
    top_keys: list[tuple[str, int]]  # ordering keys with the most backlog here (keygate.py)
    expired: int = 0  # acked past unseen: their own TTL had passed
    cancelled: int = 0  # delayed messages acked past unseen: cancelled before due


class ConsumeSession(Protocol):
    async def handle(self, data: bytes) -> None: ...

    async def pump(self) -> None: ...

    def end(self) -> None: ...


class OutputHostClient(Protocol):
    def owns(self, queue: str, group: str) -> bool:
        """Whether this output host serves (extents of) the group."""
        ...

    async def load(self, queue: str, group: str) -> Group | None:
        """Serve the group now when it is this host's (it may have just been made):
        its record as served here, or None."""
        ...

    async def served(self, queue: str, group: str) -> Group | None:
        """``load`` for a host that serves groups as they are made; one that loads them
        when they are consumed (a node) answers for a group loaded now and loads none."""
        ...

    async def made(self, group: Group, created: bool) -> None:
        """The group was made (``created``: just now, so it has no ack levels yet)."""
        ...

    async def state(self, group: Group) -> GroupState | None:
        """The group's state here; None when this host serves none of it."""
        ...

    async def states(self, queues: Collection[str]) -> list[GroupState]:
        """The state of every group of the queues loaded here (unreachable extents'
        backlog left out)."""
        ...

    async def receive(
        self, group: Group, max_messages: int, wait: float, visibility: float | None
    ) -> list[Delivery]: ...

    async def settle(
        self, group: Group, receipts: list[str], how: Settlement, durable: bool
    ) -> tuple[int, list[str]]:
        """Settle by receipt: how many were applied, and the stale receipts. With
        ``durable``, answered once what was applied is persisted."""
        ...

    async def open_stream(self, group: Group, ws: StreamSocket) -> ConsumeSession | None: ...

    def delivered_changes(
        self, version: int
    ) -> tuple[int, dict[Hashable, tuple[str, Counts] | None]]:
        """For load reports (loadmeter.Changes): the cursors that delivered since."""
        ...

    def open_extents(self) -> int: ...

    def loaded_groups(self) -> int:
        """The groups loaded here now (a node unloads idle ones: idlegroups.py)."""
        ...

    def update_queue(self, queue: Queue) -> None: ...

    def update_group(self, group: Group) -> None: ...

    async def unload(
        self, queue: str, name: str | None = None, close_code: int = DELETED_CLOSE
    ) -> None: ...


OPEN_COUNT_INTERVAL = 60.0
KEPT_READS = 16  # ack levels of unloaded groups read at once (once each: then kept)
OLDEST_READS = 2000  # store reads a scrape makes at most for unloaded groups' oldest
NONE_OBSERVED = Histogram(END_TO_END_BUCKETS)  # an unloaded group's that counted nothing
STATS_STATUSES = (OPEN, FAILING, SEALED, CONSUMED)  # the extents a group's backlog counts


class LocalOutputHost:
    def __init__(self, service: OutputHostService) -> None:
        self.service = service
        self._counted_at = -OPEN_COUNT_INTERVAL
        self._open_count = 0

    def owns(self, queue: str, group: str) -> bool:
        return self.service.owns(queue, group)

    async def _consumer(self, group: Group) -> GroupConsumer | None:
        if not self.owns(group.queue, group.name):
            return None
        return await self.service.group(group.queue, group.name)

    async def load(self, queue: str, group: str) -> Group | None:
        if not self.owns(queue, group):
            return None
        return (await self.service.group(queue, group)).group

    async def made(self, group: Group, created: bool) -> None:
        service = self.service
        if not service.lazy:
            await self.load(group.queue, group.name)
        elif created and (key := f"{group.queue}/{group.name}") not in service.groups:
            service.unloaded.setdefault(key, Unloaded(group, levels={}))  # none to read
            service.follow(key, group)

    async def served(self, queue: str, group: str) -> Group | None:
        if not self.service.lazy:
            return await self.load(queue, group)
        consumer = self.service.groups.get(f"{queue}/{group}")
        return None if consumer is None else consumer.group

    async def state(self, group: Group) -> GroupState | None:
        if not self.owns(group.queue, group.name):
            return None
        consumer = self.service.groups.get(f"{group.queue}/{group.name}")
        if consumer is None and self.service.lazy:  # not loaded: from the metadata
            return (await self._unloaded_states([group], None))[0]
        consumer = await self._consumer(group)
        return None if consumer is None else await self._state(consumer)

    async def states(self, queues: Collection[str]) -> list[GroupState]:
        service = self.service
        consumers = [
            c for c in list(service.groups.values()) if c.group.queue in queues and not c.stopped
        ]  # fmt: skip
        # every cursor's extent asked at once: one request per store host, not one per
        # extent of every group (a scrape of a node with 10,000 queues made 20,000)
        extents = {c.extent.id: c.extent for g in consumers for c in list(g.cursors.values())}
        infos = await service.stores.infos(list(extents.values()))
        loaded = [
            _state_of(g, {c.id: infos[c.extent.id].count
                          for c in list(g.cursors.values()) if c.extent.id in infos})
            for g in consumers
        ]  # fmt: skip
        if not service.lazy:
            return loaded
        unloaded = [  # the groups not loaded: one read of every group, one of every extent
            g for g in await service.metadata.list_every_group()
            if g.queue in queues and not g.name.startswith("_")
            and f"{g.queue}/{g.name}" not in service.groups
        ]  # fmt: skip
        if not unloaded:
            return loaded
        every = await service.metadata.list_extents_in(STATS_STATUSES)
        return loaded + await self._unloaded_states(unloaded, every)

    async def _unloaded_states(
        self, groups: list[Group], every: list[Extent] | None
    ) -> list[GroupState]:
        """The state of groups not loaded here, by their persisted acked counts and their
        extents' message counts (``every``: every extent; None: their queues' and DLQs'
        read now)."""
        metadata = self.service.metadata
        if every is None:
            names = {n for g in groups for n in (g.queue, g.dlq)}
            every = [e for n in names for e in await metadata.list_extents(n, STATS_STATUSES)]
        by_queue: dict[str, list[Extent]] = {}
        by_id = {e.id: e for e in every}
        for extent in every:
            by_queue.setdefault(extent.queue, []).append(extent)
        kept = [self._kept(group) for group in groups]
        unknown = [k for k in kept if k.levels is None]
        if len(unknown) > KEPT_READS:  # one read of every group's levels, not one a group
            every_level: dict[tuple[str, str], dict[str, Level]] = {}
            for a in await metadata.list_every_ack_level():
                levels = every_level.setdefault((a.queue, a.group), {})
                levels[a.extent] = level_of(a.acked, a.limit, a.level)
            for k in unknown:
                k.levels = every_level.get((k.group.queue, k.group.name), {})
        else:
            await each(unknown, self._read_levels, KEPT_READS)
        theirs = [
            [] if k.group.config.type == STREAM  # read by their clients: no backlog here
            else by_queue.get(k.group.queue, []) + [
                by_id[e] for e, (_, limit, _) in (k.levels or {}).items()
                if limit is not None and e in by_id
            ]
            for k in kept
        ]  # fmt: skip
        wanted = {e.id: e for extents in theirs for e in extents}
        infos = await self.service.stores.infos(list(wanted.values()))
        counts = {i: info.count for i, info in infos.items()}
        await self._oldest(kept, theirs, counts)
        return [_kept_state(k, extents, counts) for k, extents in zip(kept, theirs, strict=True)]

    def _kept(self, group: Group) -> Unloaded:
        """What is kept of a group not loaded here (its acked counts None until read)."""
        key = f"{group.queue}/{group.name}"
        kept = self.service.unloaded.get(key)
        if kept is None or kept.group.created_at != group.created_at:  # new, or made again
            kept = self.service.unloaded[key] = Unloaded(group)
            self.service.follow(key, group)
        return kept

    async def _read_levels(self, kept: Unloaded) -> None:
        group = kept.group
        rows = await self.service.metadata.get_ack_levels(group.queue, group.name)
        kept.levels = {r.extent: level_of(r.acked, r.limit, r.level) for r in rows}

    async def _oldest(
        self, kept: list[Unloaded], theirs: list[list[Extent]], counts: dict[str, int]
    ) -> None:
        """The oldest unacked message of the unloaded groups that have a backlog and do
        not know it: read from the store hosts, one read for the groups at the same
        position, OLDEST_READS at most a scrape (the others are read at the next)."""
        wanted: dict[tuple[str, bytes], tuple[Extent, list[Unloaded]]] = {}
        for k, extents in zip(kept, theirs, strict=True):
            if k.oldest_ms is None and (behind := k.behind(extents, counts)):
                level = (k.levels or {}).get(behind[0].id, NONE_ACKED)[2]
                if (at := (behind[0].id, level)) in wanted or len(wanted) < OLDEST_READS:
                    wanted.setdefault(at, (behind[0], []))[1].append(k)

        async def read(at: tuple[str, bytes]) -> None:
            extent, groups = wanted[at]
            oldest = await self._first_after(extent, at[1])
            for k in groups:
                k.oldest_ms = oldest

        await each(list(wanted), read, KEPT_READS)

    async def _first_after(self, extent: Extent, level: bytes) -> int | None:
        """The enqueue time of the first message of the extent past the group's ack
        level, read from one of its replicas (None: none answered); kept until the
        group is loaded again (nothing is acked meanwhile)."""
        for store_id in extent.stores:
            try:
                batch = await self.service.stores.get(store_id).read(
                    extent.id, level, 1, joined=True
                )
                chunk = decode_chunk(store_id, extent.id, batch, False)
            except CheramiError:
                continue
            return chunk.records[0].enqueued_ms if chunk.records else None
        return None

    async def _state(self, consumer: GroupConsumer) -> GroupState:
        counts = {}
        for cursor in list(consumer.cursors.values()):
            counts[cursor.id] = (await self.service.stores.info(cursor.extent)).count
        return _state_of(consumer, counts)

    async def receive(
        self, group: Group, max_messages: int, wait: float, visibility: float | None
    ) -> list[Delivery]:
        consumer = await self._consumer(group)
        if consumer is None:  # a direct receive to a host that holds none of its extents
            return []
        return await self.service.receive(consumer, max_messages, wait, visibility)

    async def settle(
        self, group: Group, receipts: list[str], how: Settlement, durable: bool
    ) -> tuple[int, list[str]]:
        consumer = await self._consumer(group)
        if consumer is None:
            return 0, receipts
        n, stale, extents = self.service.settle(consumer, receipts, _action(consumer, how))
        if n and durable:
            await self.service.flushed(consumer, extents)
        return n, stale

    async def open_stream(self, group: Group, ws: StreamSocket) -> ConsumeSession | None:
        consumer = await self._consumer(group)
        if consumer is None:
            return None
        stream = ConsumeStream(ws, consumer, self.service)
        await stream.start()
        return stream

    def delivered_changes(
        self, version: int
    ) -> tuple[int, dict[Hashable, tuple[str, Counts] | None]]:
        """Messages and bytes delivered from each extent by each group's cursor that
        delivered since ``version`` of the host's activity (load reports, loadmeter.py;
        O(cursors that delivered): an idle group costs nothing)."""
        activity = self.service.activity
        changed: dict[Hashable, tuple[str, Counts] | None] = {}
        for cursor in activity.since(version):
            assert isinstance(cursor, ExtentCursor)
            changed[cursor] = (
                None if activity.is_gone(cursor)
                else (cursor.id, (0, 0, cursor.delivered, cursor.delivered_bytes))
            )  # fmt: skip
        return activity.version, changed

    def open_extents(self) -> int:
        """The extents the groups served here read (counted once a minute: a walk of
        every group)."""
        now = time.monotonic()
        if now - self._counted_at >= OPEN_COUNT_INTERVAL:
            self._counted_at = now
            self._open_count = sum(len(c.cursors) for c in self.service.groups.values())
        return self._open_count

    def loaded_groups(self) -> int:
        return len(self.service.groups)

    def update_queue(self, queue: Queue) -> None:
        self.service.update_queue(queue)

    def update_group(self, group: Group) -> None:
        self.service.update_group(group)

    async def unload(
        self, queue: str, name: str | None = None, close_code: int = DELETED_CLOSE
    ) -> None:
        await self.service.unload(queue, name, close_code)


def _action(consumer: GroupConsumer, how: Settlement) -> Callable[[list[int]], list[int]]:
    if how.kind == "ack":
        return consumer.ack
    if how.kind == "nack":
        return lambda numbers: consumer.nack(numbers, how.seconds)
    return lambda numbers: consumer.extend(numbers, how.seconds)


def _kept_state(kept: Unloaded, extents: list[Extent], counts: dict[str, int]) -> GroupState:
    oldest = kept.oldest_ms
    return GroupState(
        group=kept.group, backlog=kept.backlog(extents, counts), in_flight=0,
        oldest_unacked_age_seconds=max(0.0, time.time() - oldest / 1000) if oldest else 0.0,
        delivered=kept.counted("delivered"), acked=kept.counted("acked"),
        nacked=kept.counted("nacked"), redelivered=kept.counted("redelivered"),
        dead_lettered=kept.counted("dead_lettered"),
        end_to_end=kept.end_to_end or NONE_OBSERVED, top_keys=[],
        expired=kept.expired, cancelled=kept.cancelled,
    )  # fmt: skip


def _state_of(consumer: GroupConsumer, counts: dict[str, int]) -> GroupState:
    """The group's state, with ``counts``: how many messages each cursor's extent holds
    (a cursor left out: no replica answered)."""
    oldest = consumer.oldest_unacked_ms()
    return GroupState(
        group=consumer.group, backlog=consumer.backlog_above(counts),
        in_flight=consumer.in_flight,
        oldest_unacked_age_seconds=max(0.0, time.time() - oldest / 1000) if oldest else 0.0,
        delivered=consumer.delivered, acked=consumer.acked, nacked=consumer.nacked,
        redelivered=consumer.redelivered, dead_lettered=consumer.dead_lettered,
        end_to_end=consumer.end_to_end, top_keys=consumer.keys.top(),
        expired=consumer.flight.expired, cancelled=consumer.window.cancelled,
    )  # fmt: skip
