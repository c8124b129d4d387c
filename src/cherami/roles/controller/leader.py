"""The leading controller of a cluster. Controllers race for a lease in the metadata
store; the holder seals the extents that lost their input host or a replica (or that
their input host reported failing), opens extents up to each queue's minimum on live
hosts, opens or seals one more by the queue's rate (scaling.py; not on a single node,
whose one input host gains nothing from more extents), seals the replicas of store hosts
that come back, and runs retention every RETENTION_INTERVAL (held while it replaces the
extents of lost hosts, up to RETENTION_HOLD, and only while it leads). A node runs one too."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial

from cherami import timing
from cherami.context import DEFAULT, ProcessContext
from cherami.errors import CheramiError
from cherami.membership import INPUTHOST, live_hosts
from cherami.metadata.base import ChangeWatch, MetadataStore
from cherami.metadata.models import FAILING, OPEN, Extent, Fence, Queue, min_plain, wants_timers
from cherami.periodic import Periodic
from cherami.roles.controller.retention import Retention
from cherami.roles.controller.scaling import (
    OPEN_ONE,
    SEAL_ONE,
    QueueLoad,
    ScalingPolicy,
    extent_rates,
    extent_to_seal,
    queue_rates,
)
from cherami.roles.controller.service import ControllerService
from cherami.roles.storehost.directory import StoreWatcher
from cherami.wire.store import PLAIN, TIMER

log = logging.getLogger("cherami.controller.leader")

LEASE = "controller-leader"  # the defaults below: timing.py; a process uses its context's
LEASE_TTL = timing.DEFAULT.lease_ttl
MARGIN = timing.DEFAULT.lease_margin  # seconds before the lease's end the leader stops acting
TICK = timing.DEFAULT.leader_tick
RETENTION_INTERVAL = 2.0  # seconds between retention passes (each behind the tick)
RETENTION_HOLD = 60.0  # (its deletes took a quarter of the store hosts' CPU then)
ROLL_CHECK_ALL = 60.0  # every open extent is looked at for rolling over this often
# after a power loss, one at a time, 2,100 extents took 33 s to replace
SEALS_AT_ONCE = 32  # seals under way at once (each asks every replica, then the metadata)
TENDS_AT_ONCE = 8  # queues opening extents at once (each under its lock; 10 connections)
RENEW_WITHIN = 1.5  # a tick still running this near its acting window's end renews


class Leader:
    def __init__(
        self,
        controller: ControllerService,
        metadata: MetadataStore,
        controller_id: str,
        stores: StoreWatcher,
        max_extent_messages: int = 1_000_000,
        scaling: ScalingPolicy | None = None,
        ctx: ProcessContext = DEFAULT,
    ) -> None:
        """``ctx.clock`` (monotonic seconds) times the acting window (the fencing rule of
        ownership.py), retention's and rolling's passes; tests advance it, not sleep."""
        self.clock = ctx.clock
        self.timing = ctx.timing
        self.controller = controller
        self.metadata = metadata
        self.id = controller_id
        self.stores = stores
        self.leading = False
        self._acting_until = 0.0
        self._seen_stores: set[str] = set()
        self.retention = Retention(controller, metadata, stores.stores, max_extent_messages)
        self.scaling = scaling  # None: extents by min_extents only
        self._retained_at = self.clock()  # the first pass RETENTION_INTERVAL in
        self._sealing: dict[str, asyncio.Task[None]] = {}
        # slow chores run behind the tick, one of each at a time: a store host that is cut
        # off makes each of its calls wait out the store deadline (3 s), which inside the
        # tick held the lease renewal back until another controller took over
        self._behind: dict[str, asyncio.Task[None]] = {}
        self._seen = -1  # the metadata change log, as far as _catalog has followed it
        self._queues: dict[str, Queue] = {}
        self._extents: dict[str, list[Extent]] = {}  # queue -> its open and failing ones
        self._hosts_seen: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())
        self._again: set[str] = set()  # queues a tick could not settle: the next looks again
        self._wide: set[str] = set()  # queues above their minimum plain extents (scaling)
        self._to_seal: list[Extent] = []
        self._owed: set[str] = set()  # seals that reached no replica: owed, hosts back or not
        self._busy: set[str] = set()  # extents the input hosts' load reports show written
        self._rolled_all_at = -ROLL_CHECK_ALL  # the first pass looks at every open extent
        # the queue of each plain extent open now or in the latest load reports, and the
        # rate of each queue's plain extents there (scaling.queue_rates)
        self._plain_of: dict[str, str] = {}
        self._queue_rates: dict[str, float] = {}
        self._open_plain: dict[str, str] = {}  # open and failing plain extent -> queue
        self._seals = asyncio.Semaphore(SEALS_AT_ONCE)
        self._renewing = asyncio.Lock()
        self._whole = False  # the tick looks at every queue (_look_at)
        # extents of lost hosts being replaced since (monotonic), sealed, opened since
        self._replacing: tuple[float, int, int] | None = None
        self._young: dict[str, str] = {}  # open extents made in the last ROLL_CHECK_ALL -> queue
        self._periodic = Periodic("controller tick", self.timing.leader_tick, self._lead)
        self._watch: ChangeWatch | None = None

    def start(self) -> None:
        self._periodic.start(first_now=True)
        # a queue made, a host's extent failing: the tick comes at once (postgres_notify.py)
        self._watch = self.metadata.watch_changes(self._woken)

    def _woken(self) -> None:
        if self.leading:  # another controller's tick only asks for the lease
            self._periodic.wake()

    async def stop(self) -> None:
        if self._watch is not None:
            await self._watch.stop()
        await self._periodic.stop()
        tasks = [*self._sealing.values(), *self._behind.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def acting(self) -> bool:
        """Whether this controller may act as the leader now: its lease cannot have
        expired yet by its own clock (the fencing rule of ownership.py)."""
        return self.leading and self.clock() < self._acting_until

    async def _lead(self) -> None:
        asked = self.clock()
        try:
            epoch = await self.metadata.try_lease(LEASE, self.id, self.timing.lease_ttl)
        except Exception:
            self.controller.fence = None
            raise
        leading = epoch is not None
        if leading != self.leading:
            log.info("controller %s %s", self.id, "leads" if leading else "follows")
        self.leading = leading
        if not leading:
            self._replacing = None  # the leader now says what it replaced
        self.controller.fence = Fence(lease=LEASE, epoch=epoch) if epoch is not None else None
        self._acting_until = asked + self.timing.lease_ttl - self.timing.lease_margin
        if leading:
            await self._keeping_lease(self.tick())
            now = self.clock()
            held = self._replacing is not None and now - self._replacing[0] < RETENTION_HOLD
            if now - self._retained_at >= RETENTION_INTERVAL and not held:
                self._retained_at = now
                self._run_behind("retention", partial(self._retain, now))

    async def _retain(self, now: float) -> None:
        """A retention pass: the open extents carrying traffic or opened in the last
        ROLL_CHECK_ALL are looked at for rolling over (size), and every open extent once a
        ROLL_CHECK_ALL (age); an idle one costs a pass nothing. From the catalog the
        ticks keep, not a read of every extent."""
        whole = now - self._rolled_all_at >= ROLL_CHECK_ALL
        if whole:
            self._rolled_all_at = now
        # a young extent too: one that just took over from a rolled one carries its
        # queue's traffic before a load report shows it
        if whole:  # once a ROLL_CHECK_ALL: O(open extents)
            opened = [e for es in self._extents.values() for e in es if e.status == OPEN]
        else:  # O(extents written or young): an idle one costs a pass nothing
            young = time.time() - ROLL_CHECK_ALL
            looked = set(self._young.values()) | {
                q for e in self._busy if (q := self._plain_of.get(e))
            }
            opened = [
                e for q in looked for e in self._extents.get(q, [])
                if e.status == OPEN and (e.id in self._busy or e.created_at > young)
            ]  # fmt: skip
            self._young = {e.id: e.queue for e in opened if e.created_at > young}
        await self.retention.tick(self._queues, opened, self.acting)

    async def tick(self) -> None:
        live_stores = await self.stores.refresh()
        inputs = await live_hosts(self.metadata, INPUTHOST, self.timing.dead_after)
        live_inputs = {h.id for h in inputs}
        rates = extent_rates([
            {e: load.msgs_in for e, load in h.load.extents.items()} for h in inputs if h.load
        ])  # fmt: skip
        self._busy = {e for e, rate in rates.items() if rate > 0}

        back = live_stores - self._seen_stores
        self._seen_stores = live_stores
        for store_id in back:
            await self.controller.reseal_replicas(store_id)
        # whole extents again for those opened degraded (min_replicas) once hosts are back
        await self.controller.restore_replication(rescan=bool(back))
        self._run_behind("sealing straggling replicas", self.controller.seal_stragglers)
        extents, changed = await self._catalog()
        await self._renew()  # a tick that read every queue may be near its window's end
        self._note_plain(rates)
        if self.scaling is not None and (changed is None or changed):
            self.scaling.forget(set(self._queues))  # a deleted queue is a change
        look = self._look_at(changed, live_inputs, live_stores, rates)
        healthy = {name: self._healthy(name, extents.get(name, []), live_inputs, live_stores)
                   for name in look}  # fmt: skip
        # what lost hosts left to replace: extents to seal, or (a tick that looks at every
        # queue: hosts came or went, or a new leader) queues short of extents
        if self._replacing is None and (self._to_seal or (self._whole and any(
            _short_of_extents(self._queues[n], healthy[n]) for n in look
        ))):  # fmt: skip
            self._replacing = (self.clock(), 0, 0)
        await self._renew()  # the tick so far may have taken most of the acting window
        await self._seal_all(self._to_seal)  # before their successors open (CP order)
        self._to_seal = []
        await self._tend_all(look, healthy, bool(live_inputs), rates)
        self._replaced()

    async def _tend_all(
        self,
        look: list[str],
        healthy: dict[str, list[Extent]],
        inputs_alive: bool,
        rates: dict[str, float],
    ) -> None:
        """Tend the queues, TENDS_AT_ONCE at a time, renewing the lease near the end of
        the acting window (long ticks once lost the lead after a power loss); once it may
        have run out, the rest are left to the next tick."""
        names = iter(look)
        stopped = False

        async def tend() -> None:
            nonlocal stopped
            for name in names:  # shared: each queue is taken by one of them
                if self.clock() > self._acting_until - RENEW_WITHIN:
                    await self._renew()
                if not self.acting():
                    if not stopped:
                        log.info("controller %s stops acting: its lease may have expired",
                                 self.id)  # fmt: skip
                    stopped = True
                    self._again.add(name)
                    self._again.update(names)
                    return
                await self._tend(name, healthy[name], inputs_alive, rates)

        async with asyncio.TaskGroup() as group:
            for _ in range(min(TENDS_AT_ONCE, len(look))):
                group.create_task(tend())

    async def _keeping_lease(self, work: Awaitable[None]) -> None:
        """Run ``work`` (a tick) while the lease is renewed every half leader_tick once
        the acting window nears its end. A tick waits on calls (a seal's replicas, the
        catalog's reads, one queue's opens) that on a loaded machine outlasted the
        window: renewed only between queues, the lease ran out and the lead changed
        hands in the middle of replacing a store host's extents (load 17)."""
        keep = asyncio.create_task(self._keep_lease(), name="keep the lead")
        try:
            await work
        finally:
            keep.cancel()
            await asyncio.gather(keep, return_exceptions=True)

    async def _keep_lease(self) -> None:
        while True:
            await asyncio.sleep(self.timing.leader_tick / 2)
            await self._renew()

    async def _renew(self) -> None:
        """Renew the lease within the tick (one task at a time); a lease lost, or a
        metadata store that does not answer, leaves the acting window as it was."""
        async with self._renewing:
            if self.clock() <= self._acting_until - RENEW_WITHIN:
                return  # renewed meanwhile
            asked = self.clock()
            try:
                epoch = await self.metadata.try_lease(LEASE, self.id, self.timing.lease_ttl)
            except CheramiError as err:
                log.info("controller %s could not renew its lease in the tick: %s", self.id, err)
                return
            fence = self.controller.fence
            if epoch is not None and fence is not None and epoch == fence.epoch:
                self._acting_until = asked + self.timing.lease_ttl - self.timing.lease_margin

    def _replaced(self) -> None:
        """Once the extents of lost hosts are replaced (no seal under way, every queue
        settled), one line: how many were sealed and opened, and how long it took."""
        if self._replacing is None or self._sealing or self._again:
            return
        since, sealed, opened = self._replacing
        self._replacing = None
        log.info("controller %s replaced the extents of lost hosts: %d sealed, %d opened "
                 "in %.1f s", self.id, sealed, opened, self.clock() - since)  # fmt: skip

    def _note_plain(self, rates: dict[str, float]) -> None:
        """The queue of each plain extent in the load reports (open, or sealed since: its
        queue is remembered while the reports show it), and each queue's rate from them.
        O(extents reported), not O(extents): an idle extent is in no report."""
        self._plain_of = {
            e: q for e in rates if (q := self._open_plain.get(e) or self._plain_of.get(e))
        }
        self._queue_rates = queue_rates(rates, self._plain_of)

    def _index_plain(self, name: str, before: list[Extent], now: list[Extent]) -> None:
        """Keep the open plain extents' queues (``_open_plain``) as a queue's are read."""
        for extent in before:
            self._open_plain.pop(extent.id, None)
        self._open_plain.update((e.id, name) for e in now if e.kind == PLAIN)

    def _look_at(
        self,
        changed: set[str] | None,
        live_inputs: set[str],
        live_stores: set[str],
        rates: dict[str, float],
    ) -> list[str]:
        """The queues this tick looks at: every queue when the hosts alive changed or the
        catalog was read whole; else those written since the last tick, those it could
        not settle then, and (scaling) those carrying traffic or above their minimum.
        An idle, healthy queue is not looked at."""
        hosts = (frozenset(live_inputs), frozenset(live_stores))
        everything = self._whole = changed is None or hosts != self._hosts_seen
        self._hosts_seen = hosts
        again, self._again = self._again, set()
        if changed is None or everything:
            return sorted(self._queues)
        names = changed | again
        if self.scaling is not None:  # from the load reports, not a walk of every extent
            names |= {q for e, rate in rates.items() if rate > 0 and (q := self._plain_of.get(e))}
            names |= self._wide
        return sorted(n for n in names if n in self._queues)

    def _healthy(
        self, name: str, extents: list[Extent], live_inputs: set[str], live_stores: set[str]
    ) -> list[Extent]:
        """The queue's extents that keep their hosts; the others are to be sealed (and
        the queue is looked at again next tick). One this controller is sealing (rolled
        over, scaled down) is neither: its input host marks it FAILING when an append
        meets a replica the seal reached, and taking that for a failure sealed it twice
        and made its store hosts suspects at every roll-over of a queue at full speed."""
        mine = [e for e in extents if e.status == FAILING and self.controller.sealing(e.id)]
        extents = [e for e in extents if e not in mine]
        broken = [e for e in extents
                  if e.id in self._owed or _needs_seal(e, live_inputs, live_stores)]  # fmt: skip
        if mine:
            self._again.add(name)
        for extent in broken:
            # failing with every host alive: an input host cannot reach one of its stores
            if (
                extent.status == FAILING
                and extent.input_host in live_inputs
                and all(s in live_stores for s in extent.stores)
            ):
                self.controller.placed.failed(extent.id, extent.stores)
        if broken:
            self._to_seal += broken
            self._again.add(name)
        return [e for e in extents if e not in broken]

    async def _tend(
        self, name: str, healthy: list[Extent], inputs_alive: bool, rates: dict[str, float]
    ) -> None:
        """Open what the queue is short of and scale it; a queue left unsettled is
        looked at again next tick."""
        queue = self._queues[name]
        if sum(e.kind == PLAIN for e in healthy) > min_plain(queue):
            self._wide.add(name)
        else:
            self._wide.discard(name)
        if not inputs_alive:
            self._again.add(name)
            return
        try:
            if _short_of_extents(queue, healthy):  # read under the queue's lock
                self._count(opened=await self.controller.ensure_extents(queue.name, patience=0))
            await self._scale(queue, healthy, rates)
        except CheramiError as err:
            log.warning("queue %s: cannot open extents: %s", queue.name, err)
            self._again.add(name)

    async def _catalog(self) -> tuple[dict[str, list[Extent]], set[str] | None]:
        """The queues and their open and failing extents, kept up to date from the
        metadata's change log: a tick reads again only the queues written since the
        last (every queue at the first, or when the log has moved on too far)."""
        latest, changed = await self.metadata.changes_since(self._seen)
        if changed is None:
            queues = {q.name: q for q in await self.metadata.list_queues()}
            extents: dict[str, list[Extent]] = {name: [] for name in queues}
            for extent in await self.metadata.list_extents_in((OPEN, FAILING)):
                if extent.queue in extents:
                    extents[extent.queue].append(extent)
            self._queues, self._extents = queues, extents
            self._open_plain = {}
            for name, now in extents.items():
                self._index_plain(name, [], now)
            young = time.time() - ROLL_CHECK_ALL
            self._young = {e.id: e.queue for es in extents.values() for e in es
                           if e.created_at > young}  # fmt: skip
        else:  # the changed queues in one read, not two reads a queue
            read = {q.name: (q, es) for q, es in
                    await self.metadata.queues_with_extents(changed, (OPEN, FAILING))}  # fmt: skip
            young = time.time() - ROLL_CHECK_ALL
            for name in changed:
                before = self._extents.get(name, [])
                if name not in read:  # deleted
                    self._queues.pop(name, None)
                    self._extents.pop(name, None)
                    self._index_plain(name, before, [])
                    continue
                self._queues[name], self._extents[name] = read[name]
                self._index_plain(name, before, self._extents[name])
                self._young.update(
                    (e.id, name) for e in self._extents[name] if e.created_at > young
                )
        self._seen = latest
        return self._extents, changed

    async def _seal_all(self, extents: list[Extent]) -> None:
        """Seal the extents at once, each in a task of its own (SEALS_AT_ONCE of them
        under way), and wait up to timing.seal_wait for them. A seal waits up to the
        store deadline (3 s) for each replica that does not answer, so with a zone cut
        off, sealing its extents one after another took 3 s each: the tick outlasted
        the lease, leadership changed hands, and the queues had no open extent for most
        of a 15 s cut. Seals still under way go on behind the tick (their metadata
        write is fenced by the lease), and the next tick that finds the extent sealed
        opens its successor."""
        for extent in extents:
            if extent.id not in self._sealing:
                task = asyncio.create_task(self._seal(extent), name=f"seal {extent.id}")
                self._sealing[extent.id] = task
                task.add_done_callback(partial(self._sealed, extent.id))
        waiting = [self._sealing[e.id] for e in extents if e.id in self._sealing]
        if waiting:
            await asyncio.wait(waiting, timeout=self.timing.seal_wait)

    def _run_behind(self, what: str, chore: Callable[[], Awaitable[None]]) -> None:
        """Start ``chore`` behind the tick unless the last one is still running."""
        task = self._behind.get(what)
        if task is None or task.done():
            self._behind[what] = asyncio.create_task(_logged(what, chore), name=what)

    def _sealed(self, extent_id: str, _task: asyncio.Task[None]) -> None:
        self._sealing.pop(extent_id, None)

    def _count(self, sealed: int = 0, opened: int = 0) -> None:
        if (was := self._replacing) is not None:
            self._replacing = (was[0], was[1] + sealed, was[2] + opened)

    async def _seal(self, extent: Extent) -> None:
        try:
            async with self._seals:
                await self.controller.seal_extent(extent)
            self._count(sealed=1)
            self._owed.discard(extent.id)
        except CheramiError as err:
            log.warning("cannot seal extent %s yet: %s", extent.id, err)
            self._owed.add(extent.id)
        except Exception:
            log.exception("sealing extent %s failed", extent.id)

    async def _scale(self, queue: Queue, extents: list[Extent], rates: dict[str, float]) -> None:
        """Open or seal one plain extent when the queue's rate says so (scaling.py)."""
        if self.scaling is None:
            return
        plain = [e for e in extents if e.kind == PLAIN and e.status == OPEN]
        load = QueueLoad(
            extents=len(plain), rate=self._queue_rates.get(queue.name, 0.0),
            target=queue.config.extent_target_rate, min_extents=min_plain(queue),
            max_extents=queue.config.max_extents,
        )  # fmt: skip
        decision = self.scaling.decide(queue.name, load)
        if decision == OPEN_ONE:
            extent = await self.controller.scale_up(queue.name)
            if extent is not None:
                log.info("queue %s carries %.0f msgs/s on %d extents: opened %s on %s", queue.name,
                         load.rate, load.extents, extent.id, extent.input_host)  # fmt: skip
        elif decision == SEAL_ONE and plain:
            extent = extent_to_seal(plain, rates)
            log.info("queue %s carries %.0f msgs/s on %d extents: sealing %s", queue.name,
                     load.rate, load.extents, extent.id)  # fmt: skip
            await self.controller.scale_down(extent)


async def _logged(what: str, chore: Callable[[], Awaitable[None]]) -> None:
    try:
        await chore()
    except Exception as err:
        log.warning("%s failed: %s", what, err, exc_info=not isinstance(err, CheramiError))


def _short_of_extents(queue: Queue, healthy: list[Extent]) -> bool:
    """Whether the queue's healthy open extents are fewer than its minimum, or an input
    host holds a plain one without a timer extent beside it (what ensure_extents opens;
    a dead-letter queue has none): a steady queue costs the tick no more reads."""
    plain = [e for e in healthy if e.kind == PLAIN]
    with_timer = {e.input_host for e in healthy if e.kind == TIMER}
    short = len(plain) < min_plain(queue)
    return short or (wants_timers(queue) and any(e.input_host not in with_timer for e in plain))


def _needs_seal(extent: Extent, live_inputs: set[str], live_stores: set[str]) -> bool:
    return (
        extent.status == FAILING
        or extent.input_host not in live_inputs
        or any(s not in live_stores for s in extent.stores)
    )
