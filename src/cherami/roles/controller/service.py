"""The controller: creates queues, groups and extents, places extents on store hosts,
seals extents (at recovery and when a replica fails) and opens their successors.

Its parts: sealing.py seals an extent and later the replicas a seal missed; recovery.py
keeps or seals at a node's start what its input host left open; dlqmerge.py moves a
dead-letter queue's cursor (merge, purge)."""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable

from cherami.errors import (
    AlreadyExists,
    CheramiError,
    GroupNotFound,
    InvalidRequest,
    QueueNotFound,
    Unavailable,
)
from cherami.loadmeter import has_room
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import (
    DELETED,
    FAILING,
    OPEN,
    SEALED,
    AckLevel,
    Extent,
    Fence,
    Group,
    GroupConfig,
    Queue,
    QueueConfig,
    min_plain,
    wants_timers,
)
from cherami.roles.controller.checks import (
    check_extent_bounds,
    check_min_replicas,
    dlq_name,
    new_extent_id,
    parse_start,
)
from cherami.roles.controller.dlqmerge import DlqCursor
from cherami.roles.controller.placement import Placements, pick_stores
from cherami.roles.controller.recovery import Recovery
from cherami.roles.controller.sealing import Sealer
from cherami.roles.controller.storeview import StoreView
from cherami.roles.storehost.directory import StoreDirectory
from cherami.wire.store import PLAIN, TIMER

log = logging.getLogger("cherami.controller.service")

STOREHOST = "storehost"


class ControllerService:
    def __init__(
        self,
        metadata: MetadataStore,
        stores: StoreDirectory,
        pick_input_host: Callable[[list[Extent]], Awaitable[str]],
        manage_extents: bool = True,
        live_stores: Callable[[], set[str]] | None = None,
        default_min_extents: int = 1,
        restarts_stores: bool = False,
    ) -> None:
        """``pick_input_host`` is given the queue's open extents. ``manage_extents``
        false: only the leading controller opens extents (a frontend in a cluster writes
        queues and groups and leaves extents to it). ``default_min_extents``: a queue's
        ``min_extents`` when its creator gave none (2 in a cluster)."""
        self.metadata = metadata
        self.stores = stores
        self._pick_input_host = pick_input_host
        self.manage_extents = manage_extents
        self.store_view = StoreView(metadata, stores, live_stores)
        self.default_min_extents = default_min_extents
        self._restarts_stores = restarts_stores  # a node: a store host that dies comes back
        self._warned_no_spare: set[int] = set()  # store counts warned of (no spare store)
        self.placed = Placements()  # placements the hosts' load reports do not show yet
        # open extents with fewer replicas than their queue's (extent id -> queue)
        self.degraded: dict[str, str] = {}
        # a queue's lock while anything holds or awaits it (none kept for a queue at rest)
        self._queue_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self.deleted: list[Callable[[str], None]] = []  # ControllerClient.deleted
        # the leading controller's lease fence: extent changes it makes are refused by
        # the metadata store once another controller leads (None: unfenced, one node)
        self.fence: Fence | None = None
        self.sealer = Sealer(metadata, stores, fence=lambda: self.fence)
        self.recovery = Recovery(
            metadata, stores, self.seal_extent, self._lock, self.ensure_extents
        )
        self.dlq_cursors = DlqCursor(metadata, stores)

    def _lock(self, queue: str) -> asyncio.Lock:
        lock = self._queue_locks.get(queue)
        if lock is None:
            lock = self._queue_locks[queue] = asyncio.Lock()
        return lock

    def default_replicas(self) -> int:
        return min(3, len(self.stores.ids())) or 1

    # queues
    async def create_queue(
        self, name: str, config: QueueConfig, dlq_of: str | None = None
    ) -> tuple[Queue, bool]:
        if config.replicas is None:
            config.replicas = self.default_replicas()
        if config.replicas > len(self.stores.ids()):
            raise InvalidRequest(
                f"replicas {config.replicas} exceeds the {len(self.stores.ids())} store hosts"
            )
        check_min_replicas(config)
        check_extent_bounds(config, self.default_min_extents, dlq_of)
        self._warn_without_spare_store(name, config)
        async with self._lock(name):
            # timer extents only once it takes a delayed message (an input host asks for
            # them then), unless every message of it is delayed
            queue = Queue(
                name=name, config=config, created_at=time.time(), dlq_of=dlq_of,
                timers=dlq_of is None and config.delay_seconds > 0,
            )  # fmt: skip
            try:
                await self.metadata.insert_queue(queue)
            except AlreadyExists:
                existing = await self.metadata.get_queue(name)
                if existing.config.min_replicas is None:  # made before min_replicas
                    check_min_replicas(existing.config)
                if existing.config != config:
                    raise AlreadyExists(f"queue {name} exists with a different config") from None
                return existing, False
            await self._ensure_extents(queue, made=True)
        return queue, True

    async def update_queue(self, queue: Queue) -> None:
        """Store a changed config and open extents up to its min_extents."""
        check_min_replicas(queue.config)
        check_extent_bounds(queue.config, self.default_min_extents, queue.dlq_of)
        queue.timers = queue.timers or (queue.dlq_of is None and queue.config.delay_seconds > 0)
        async with self._lock(queue.name):
            await self.metadata.update_queue(queue)
            await self._ensure_extents(queue)

    async def delete_queue(self, name: str, contents_only: bool = False) -> None:
        queue = await self.metadata.get_queue(name)
        groups = await self.metadata.list_groups(name)
        async with self._lock(name):
            extents = await self.metadata.list_extents(name)
            if contents_only:
                for extent in extents:
                    if extent.status == OPEN:
                        await self.seal_extent(extent)
                for group in groups:
                    await self.metadata.delete_ack_levels(name, group.name, [e.id for e in extents])
            else:
                await self.metadata.delete_queue(name)
            for extent in extents:
                await self.metadata.set_extent_status(extent.id, DELETED)
                await self.drop_replicas(extent)
            if contents_only:
                await self._ensure_extents(queue)
        if not contents_only:
            for group in groups:
                await self._delete_dlq(group)
            for forget in self.deleted:
                forget(name)

    async def drop_replicas(self, extent: Extent) -> None:
        """Drop the extent's replicas, on every store host at once; once every one is
        dropped, its row goes from the metadata (purge_extent). One a store host did not
        drop stays marked deleted, and retention drops it again later
        (``drop_deleted``)."""
        dropped = await asyncio.gather(*(self._drop(extent.id, s) for s in extent.stores))
        if all(dropped):
            await self.metadata.purge_extent(extent.id, extent.queue)

    async def _drop(self, extent_id: str, store_id: str) -> bool:
        try:
            await self.stores.get(store_id).drop(extent_id)
        except CheramiError as err:
            log.warning("could not drop extent %s on %s: %s", extent_id, store_id, err)
            return False
        return True

    # groups
    async def create_group(
        self, queue: Queue, name: str, config: GroupConfig
    ) -> tuple[Group, bool]:
        """``queue``: its record as the caller has just read it (the frontend has, to
        check the request against it)."""
        queue_name = queue.name
        start_ms = parse_start(config.start_from)
        try:
            existing: Group | None = await self.metadata.get_group(queue_name, name)
        except GroupNotFound:  # (a metadata store that cannot answer raises: nothing is made)
            existing = None
        if existing is not None:
            if existing.config != config:
                raise AlreadyExists(f"group {name} exists with a different config")
            return existing, False
        dlq = dlq_name(queue_name, name)
        # no extent until the first dead letter (wake_dead_letter_queue, client.py): an
        # idle group costs its store hosts, the leader and the output host nothing
        dlq_config = QueueConfig(
            replicas=queue.config.replicas, min_replicas=queue.config.min_replicas,
            retention_seconds=queue.config.retention_seconds, min_extents=0,
        )  # fmt: skip
        group = Group(
            queue=queue_name, name=name, config=config, created_at=time.time(),
            start_ms=start_ms, dlq=dlq,
        )  # fmt: skip
        await self.create_queue(dlq, dlq_config, dlq_of=f"{queue_name}/{name}")
        try:
            await self.metadata.insert_group(group)
        except AlreadyExists:
            await self._delete_dlq(group)
            return await self.create_group(queue, name, config)
        return group, True

    async def delete_group(self, queue: str, name: str) -> None:
        group = await self.metadata.get_group(queue, name)
        await self.metadata.delete_group(queue, name)
        await self._delete_dlq(group)

    async def _delete_dlq(self, group: Group) -> None:
        try:
            await self.delete_queue(group.dlq)
        except QueueNotFound:
            pass

    # extents
    async def _ensure_extents(
        self, queue: Queue, at_least: int = 0, made: bool = False
    ) -> list[Extent]:
        """Open plain extents up to the queue's minimum, and a timer extent beside them on
        every input host that has a plain one, so one input host takes a whole batch.
        ``made``: the queue was made just now (it has no extent: none is read)."""
        if not self.manage_extents:
            return []
        open_extents = [] if made else await self.metadata.list_extents(queue.name, (OPEN,))
        plain = [e for e in open_extents if e.kind == PLAIN]
        created: list[Extent] = []
        heads = await self._unsucceeded(queue) if queue.config.type == "cp" else []
        for i in range(max(min_plain(queue), at_least) - len(plain)):
            predecessor = heads[i].id if i < len(heads) else None
            created.append(
                await self._create_extent(
                    queue,
                    PLAIN,
                    predecessor=predecessor,
                    beside=open_extents + created,
                    made=made,
                )
            )
        created += await self._timers_beside(queue, open_extents, created)
        return created

    async def _timers_beside(
        self, queue: Queue, open_extents: list[Extent], created: list[Extent]
    ) -> list[Extent]:
        """A timer extent on every input host that has a plain extent of the queue and
        no timer extent yet (none for a dead-letter queue)."""
        if not wants_timers(queue):
            return []
        plain = [e for e in open_extents if e.kind == PLAIN]
        timers = []
        with_timer = {e.input_host for e in open_extents if e.kind == TIMER}
        for host in sorted({e.input_host for e in plain + created} - with_timer):
            timers.append(await self._create_extent(queue, TIMER, input_host=host))
        return timers

    async def scale_up(self, queue_name: str) -> Extent | None:
        """Open one more plain extent for the queue (throughput), up to max_extents, on
        the input host that holds the fewest of its extents."""
        if not self.manage_extents:
            return None
        async with self._lock(queue_name):
            queue = await self.metadata.get_queue(queue_name)
            open_extents = await self.metadata.list_extents(queue_name, (OPEN,))
            if sum(e.kind == PLAIN for e in open_extents) >= queue.config.max_extents:
                return None
            heads = await self._unsucceeded(queue) if queue.config.type == "cp" else []
            extent = await self._create_extent(
                queue, PLAIN, predecessor=heads[0].id if heads else None, beside=open_extents
            )
            await self._timers_beside(queue, open_extents, [extent])
        return extent

    async def scale_down(self, extent: Extent) -> None:
        """Seal an open plain extent without a successor (the queue carries less than
        its extents need). Its input host moves publishes to the queue's other extents;
        when it holds no other plain extent of the queue, its timer extent is sealed
        too, so producers are sent to the input hosts that do."""
        async with self._lock(extent.queue):
            current = await self.metadata.get_extent(extent.id)
            if current is None or current.status != OPEN:
                return
            await self.seal_extent(current)
            rest = await self.metadata.list_extents(extent.queue, (OPEN,))
            if not any(e.kind == PLAIN and e.input_host == extent.input_host for e in rest):
                for timer in rest:
                    if timer.kind == TIMER and timer.input_host == extent.input_host:
                        await self.seal_extent(timer)

    async def _unsucceeded(self, queue: Queue) -> list[Extent]:
        """CP queues: sealed plain extents that have no successor yet, oldest first. A
        new extent names one as its predecessor, so readers keep the order across seals."""
        extents = await self.metadata.list_extents(queue.name)
        succeeded = {e.predecessor for e in extents if e.predecessor}
        return [
            e for e in extents
            if e.kind == PLAIN and e.status == SEALED and e.id not in succeeded
        ]  # fmt: skip

    async def _create_extent(
        self,
        queue: Queue,
        kind: str,
        predecessor: str | None = None,
        input_host: str | None = None,
        beside: list[Extent] | None = None,
        made: bool = False,
    ) -> Extent:
        """``beside``: the queue's open extents (the input host is picked to spread them).
        ``made``: the queue's first, at its creation, logged at debug only (a line each
        was 2.9% of a node's CPU making 10,000 queues; the leader's opens stay info)."""
        replicas = queue.config.replicas or self.default_replicas()
        stores = await self._place(replicas, queue.config.min_replicas or replicas)
        if input_host is None:
            input_host = await self._pick_input_host(
                [e for e in beside or [] if e.kind == PLAIN and e.status == OPEN]
            )
        self.placed.add([input_host, *stores])
        extent = Extent(
            id=new_extent_id(), queue=queue.name, kind=kind, status=OPEN,
            input_host=input_host, stores=stores,
            created_at=time.time(),
            predecessor=predecessor if queue.config.type == "cp" else None,
        )  # fmt: skip
        try:
            await asyncio.gather(*(self.stores.get(s).create_extent(extent.id, kind)
                                   for s in stores))  # fmt: skip
        except CheramiError:
            self.store_view.invalidate()  # the next placement asks the store hosts again
            raise
        if not await self.metadata.insert_extent(extent, fence=self.fence):
            raise Unavailable(f"extent {predecessor} already has a successor")
        log.log(logging.DEBUG if made else logging.INFO, "extent %s opened for queue %s on %s",
                extent.id, queue.name, stores)  # fmt: skip
        if len(stores) < replicas:
            self.degraded[extent.id] = queue.name
            log.warning(
                "extent %s of queue %s is degraded: %d of %d replicas (store hosts down)",
                extent.id, queue.name, len(stores), replicas,
            )  # fmt: skip
        return extent

    async def _place(self, replicas: int, least: int) -> list[str]:
        """The ``replicas`` least loaded live store hosts with disk to spare, in
        distinct zones while there are such (placement.py); as few as ``least`` when
        fewer are up (a degraded extent). From the store view (storeview.py): a ping
        to each store host and a read of the hosts table per second at most."""
        hosts = await self.store_view.hosts()
        if len(hosts) < min(least, replicas):
            raise Unavailable(f"{replicas} replicas wanted, {len(hosts)} store hosts up")
        chosen = pick_stores(hosts, replicas, self.placed)
        for host in hosts:
            if host.id in chosen and not has_room(host):
                log.warning("store host %s is short of disk and takes a replica", host.id)
        return chosen

    async def seal_extent(self, extent: Extent) -> int:
        """Seal every reachable replica at the last sequence number all of them hold
        (sealing.py)."""
        return await self.sealer.seal_extent(extent)

    def sealing(self, extent_id: str) -> bool:
        """Whether this controller is sealing the extent or sealed it lately (sealing.py)."""
        return self.sealer.sealing(extent_id)

    async def replace_extent(self, extent_id: str) -> None:
        """Seal an extent that rolls over (by size or age) and open its successor, so
        the queue keeps as many open plain extents as before: one scaled beyond the
        queue's minimum is replaced too (it was not, and a queue at full speed, rolling
        over every few seconds, lost the extents it had scaled to as fast as it gained
        them)."""
        extent = await self.metadata.get_extent(extent_id)
        if extent is None:
            return
        keep = 0
        async with self._lock(extent.queue):
            current = await self.metadata.get_extent(extent_id)
            if current is not None and current.status in (OPEN, FAILING):
                if current.kind == PLAIN:
                    opened = await self.metadata.list_extents(extent.queue, (OPEN, FAILING))
                    keep = sum(e.kind == PLAIN for e in opened)
                await self.seal_extent(current)
        await self.ensure_extents(extent.queue, at_least=keep)

    async def ensure_extents(
        self, queue_name: str, patience: float = 10.0, at_least: int = 0
    ) -> int:
        """Open plain extents up to the queue's minimum (or ``at_least``, up to its
        maximum), waiting for store hosts to come back (a restarted store host is back
        within a second) for up to ``patience`` seconds; how many extents it opened."""
        deadline = asyncio.get_running_loop().time() + patience
        while True:
            try:
                async with self._lock(queue_name):
                    queue = await self.metadata.get_queue(queue_name)
                    opened = await self._ensure_extents(
                        queue, min(at_least, queue.config.max_extents)
                    )
                return len(opened)
            except Unavailable as err:
                if asyncio.get_running_loop().time() >= deadline:
                    raise
                log.warning("queue %s: cannot open extents yet: %s", queue_name, err)
                await asyncio.sleep(0.2)

    async def restore_replication(self, rescan: bool = False) -> None:
        """Seal the open extents opened with fewer replicas than their queue wants (store
        hosts were down) once enough store hosts answer for a whole one, so that their
        successors (opened at the next ensure_extents) are fully replicated. ``rescan``:
        look for them in the metadata too (a new leader does not know them). Sealed
        degraded extents keep the replicas they have until retention drops them."""
        if rescan:
            wanted = {q.name: q.config.replicas or 1 for q in await self.metadata.list_queues()}
            for extent in await self.metadata.list_extents_in((OPEN,)):
                if len(extent.stores) < wanted.get(extent.queue, 1):
                    self.degraded[extent.id] = extent.queue
        if not self.degraded:
            return
        up = await self.store_view.up_stores()
        for extent_id, queue_name in sorted(self.degraded.items()):
            current = await self.metadata.get_extent(extent_id)
            if current is None or current.status != OPEN:
                self.degraded.pop(extent_id, None)
                continue
            queue = await self.metadata.get_queue(queue_name)
            if len(up) >= (queue.config.replicas or 1):
                log.info("extent %s of queue %s: sealed for full replication", extent_id,
                         queue_name)  # fmt: skip
                async with self._lock(queue_name):
                    await self.seal_extent(current)
                self.degraded.pop(extent_id, None)

    def _warn_without_spare_store(self, name: str, config: QueueConfig) -> None:
        """In a cluster nothing restarts a store host that went down (a node does). Said
        once a process (at every queue made, it was 30,000 lines at 10,000 queues)."""
        stores = len(self.stores.ids())
        if self._restarts_stores or not config.min_replicas == config.replicas == stores:
            return
        if stores not in self._warned_no_spare:
            self._warned_no_spare.add(stores)
            log.warning(
                "queue %s has %d replicas on %d store hosts: publishing to it stops while any "
                "store host is down; run %d store hosts or set min_replicas below %d (said once)",
                name, stores, stores, stores + 1, stores,
            )  # fmt: skip

    @property
    def unsealed_replicas(self) -> set[tuple[str, str]]:
        """Replicas a seal could not reach; sealed when they answer again."""
        return self.sealer.unsealed_replicas

    async def seal_stragglers(self) -> None:
        """Seal the replicas that earlier seals could not reach, at the sealed seq."""
        await self.sealer.seal_stragglers()

    async def reseal_replicas(self, store_id: str) -> None:
        """A store host came back: seal its replicas of extents sealed while it was away."""
        await self.sealer.reseal_replicas(store_id)

    async def recover(self) -> None:
        """At a node's start: keep open the extents its input host left open where that
        is safe and seal them where it is not (recovery.py)."""
        await self.recovery.recover()

    # dead-letter queues (dlqmerge.py)
    async def dlq_cursor(self, dlq: str) -> dict[str, AckLevel]:
        return await self.dlq_cursors.dlq_cursor(dlq)

    async def dlq_ranges(self, dlq: str) -> list[tuple[Extent, AckLevel, int]]:
        """Each DLQ extent with its cursor and last sequence number."""
        return await self.dlq_cursors.dlq_ranges(dlq)

    async def move_dlq_cursor(
        self, dlq: str, merge_into: Group | None, most: int | None = None
    ) -> int:
        """Advance the DLQ cursor to the end (or by ``most`` messages): purge, or merge
        the range into one group."""
        return await self.dlq_cursors.move_dlq_cursor(dlq, merge_into, most)
