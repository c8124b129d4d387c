"""Which output host serves which extent of which consumer group, in a cluster.

A group is spread over the output hosts per extent: every extent of the group that may
still have something to deliver (open, failing and sealed extents of its queue, and
dead-letter extents merged back into it) is a *unit*, and each unit is a lease in the
metadata store. A CP queue's group (its extents are read in order across seals) and a
stream-mode group (no cursors here) are one unit for the whole group. An output host
renews the leases it holds, takes unheld ones up to its fair share (of the group's
plain extents, of its timer extents, and of all units, counted over the live output
hosts; a host below its floor share of a group's kind takes one whatever its total, and
a unit left unheld for two ticks is taken whatever the shares), and drops a unit
whose lease it lost. A host holding more than its share of a group's extents of a kind
while a live host holds less than its floor share of that kind hands one over per tick
(it drops it; the other takes it once its lease runs out), so a host that comes back
gets its share again, and a host holding every timer extent of a group while another
holds every plain one gets a plain one. When an output host dies its leases expire and
the others take its units over from the persisted ack levels.

The fencing rule, per unit: an extent has one acting output host at any instant. A
holder acts for an extent (delivers, settles, writes its ack level and parked rows) only
while its own clock says the unit's lease cannot have expired yet: from the moment it
*asked* for the lease, ``LEASE_TTL`` minus ``MARGIN``. A unit is held under the host's
one host lease (hostlease.py): it cannot have expired while that has not, so the moment
asked is the host lease's last renewal (or take). The store judges expiry by its own
clock from a later moment (when it served the request), so a holder always stops before
anyone else can take the lease, whatever happens to it meanwhile (a pause, a slow or
lost metadata store). Its writes for the extent carry the unit's epoch as well, and the
store refuses them once the unit has passed to another holder.

One exception, outage.py: while *every* live output host says it cannot reach the
metadata store, nobody can take a lease, so a holder acts on past its window for as
long as its peers keep saying so (and ``timing.recovery_grace`` after: a host whose tick failed
or was slow, or that has just started, renews only its own leases for that long)."""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from collections.abc import Awaitable
from typing import TypeVar

from cherami import timing
from cherami.bounded import each
from cherami.context import DEFAULT, ProcessContext
from cherami.errors import GroupNotFound, QueueNotFound
from cherami.membership import OUTPUTHOST, live_hosts
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import Fence
from cherami.periodic import Periodic
from cherami.roles.outputhost.catalog import READS_AT_ONCE, WHOLE, Unit, UnitCatalog, split_groups
from cherami.roles.outputhost.hostlease import LEASES, HostLease, group_leases, unit_lease
from cherami.roles.outputhost.outage import OutageWatch
from cherami.roles.outputhost.service import DELETED_CLOSE, MOVED_CLOSE, OutputHostService

log = logging.getLogger("cherami.outputhost.ownership")

# the defaults (timing.py); a process uses its context's timing (context.py)
LEASE_TTL = timing.DEFAULT.lease_ttl
MARGIN = timing.DEFAULT.lease_margin  # seconds before the lease's end a holder stops acting
TICK = timing.DEFAULT.ownership_tick
# after this host could not reach the metadata store (or a tick of it was slow, or it has
# just started), it only renews its own leases for timing.recovery_grace: when an outage ends,
# each unit goes back to the holder that has its acks in memory, not to whichever host
# ticks first (that would deliver them all again), and a holder that rode the outage out
# on its peers' word (outage.py) has stopped or renewed before anyone takes its units
# units whose leases one call takes (a call each, a tick after a power loss took 400 units
# in 15-25 s on a loaded machine, and its groups read none of them until its end)
TAKES_AT_ONCE = 200
__all__ = ["LEASES", "WHOLE", "ExtentOwnership", "Unit", "group_leases", "unit_lease"]

T = TypeVar("T")


class ExtentOwnership:
    def __init__(
        self,
        outputs: OutputHostService,
        metadata: MetadataStore,
        host_id: str,
        ctx: ProcessContext = DEFAULT,
    ) -> None:
        """``ctx.clock`` (monotonic seconds) times the acting windows, the outage rule
        and how long units were left unheld; tests advance it instead of sleeping."""
        self.clock = ctx.clock
        self.timing = t = ctx.timing
        # a unit nobody has held for this long is taken by any host, whatever its share
        # (the shares of one group's kinds and of all units together may leave one unit
        # to nobody): two of this process's ownership ticks
        self.orphan_after = 2 * t.ownership_tick
        self.outputs = outputs
        self.metadata = metadata
        self.id = host_id
        self.lease = HostLease(metadata, host_id, t, self.clock, self._ask)
        self.held = self.lease.held
        self._groups = self.lease.groups  # units held per group
        self._periodic = Periodic(
            "extent ownership tick", t.ownership_tick, self._tick_noting_outages
        )
        self._failing = False  # the last tick could not reach the metadata store
        self._taking_after = 0.0  # self.clock(): may take others' units from then (start)
        self._vouched_until = 0.0  # and not before this: a peer acts on this host's word
        self._tick_started: float | None = None  # self.clock() of the running tick
        # the metadata calls under way (when each was asked), and the longest of this tick
        self._asking: dict[object, float] = {}
        self._longest_ask = 0.0  # the tick's longest wait with no answer (_slow)
        self._answered = -math.inf  # self.clock() when the last metadata call answered
        self.peers: dict[str, str] = {}  # the other live output hosts' addresses
        self._riding_until = 0.0  # acting on past the leases' end until (outage.py)
        self.outage = OutageWatch(self, ctx)
        self._unheld_since: dict[Unit, float] = {}  # units no lease holds, since when
        # what the metadata says of each queue's units, kept up by its change log
        self._catalog = UnitCatalog(metadata, self._ask)

    def _unit(self, queue: str, group: str, extent: str) -> Unit:
        """The unit held here that covers the extent (the whole group's, if not its own)."""
        unit = (queue, group, extent)
        return unit if unit in self.held else (queue, group, WHOLE)

    # what OutputHostService asks (service.Holdings)
    def owns(self, queue: str, group: str) -> bool:
        """Whether this host holds a unit of the group (requests for it are served here)."""
        return self._groups[(queue, group)] > 0

    def holds(self, queue: str, group: str, extent: str) -> bool:
        return self._unit(queue, group, extent) in self.held

    def acting(self, queue: str, group: str, extent: str) -> bool:
        held = self.held.get(self._unit(queue, group, extent))
        return held is not None and self.clock() < held.acting_until

    def fenced(self, queue: str, group: str, extent: str) -> None:
        """A write under the extent's fence was refused: another host holds its lease
        now. This host stops acting for it at once (the next tick drops it)."""
        unit = self._unit(queue, group, extent)
        held = self.held.get(unit)
        if held is not None:
            held.acting_until = 0.0
            self.lease.fenced.add(unit)

    def fence(self, queue: str, group: str, extent: str) -> Fence | None:
        """The fence of the unit holding the extent while this host may act for it."""
        unit = self._unit(queue, group, extent)
        held = self.held.get(unit)
        if held is None or self.clock() >= held.acting_until:
            return None
        return Fence(lease=unit_lease(*unit), epoch=held.epoch)

    def start(self) -> None:
        self._taking_after = self.clock() + self.timing.recovery_grace  # see slow_tick
        self._periodic.start(first_now=True)
        self.outage.start()

    async def stop(self) -> None:
        await self.outage.stop()
        await self._periodic.stop()

    # a metadata outage (outage.py)
    def _slow(self) -> bool:
        """Whether the running tick waits, or waited, for over timing.slow_tick with a
        metadata call under way and no call answered. Neither the tick's whole length
        nor one call's says much of the store: after a power loss the change log names
        every queue and a tick reads each one's groups and extents, hundreds of quick
        calls (thousands with 1,000 queues), 8 at a time on a loaded machine; counted
        as an outage, a long tick (or one call among them waiting past slow_tick for a
        connection of the pool) had the host take nothing while the leader reopened
        every queue's extents, tick after tick: at 1,000 queues and load 20 not one
        successor was taken in 4 minutes. A store that answers is not out."""
        if self._tick_started is None:
            return False
        stalled = 0.0
        if self._asking:
            stalled = self.clock() - max(min(self._asking.values()), self._answered)
        return max(stalled, self._longest_ask) > self.timing.slow_tick

    async def _ask(self, call: Awaitable[T]) -> T:
        """A metadata call of the tick, timed (``_slow``)."""
        token = object()
        asked = self._asking[token] = self.clock()
        try:
            result = await call
        finally:
            del self._asking[token]
            now = self.clock()
            # how long it waited with no other call answered meanwhile
            self._longest_ask = max(self._longest_ask, now - max(asked, self._answered))
        self._answered = now  # an answer: a call that failed says nothing of a store up
        return result

    def store_unreachable(self) -> bool:
        """Whether this host cannot reach the metadata store now, by its last tick (it
        failed) or the running one (it has been waiting for over timing.slow_tick)."""
        return self._failing or self._slow()

    def answer_peer(self) -> bool:
        """What this host tells a peer asking whether it reaches the store (outage.py).
        "It cannot" binds it: the asker acts on for timing.recovery_grace on its word, so
        it takes nothing for that long from now, whatever its running tick then finds
        (the stall it saw may end with no call of the tick having waited past slow_tick:
        a call asked after the stall answers first and resets the wait)."""
        unreachable = self.store_unreachable()
        if unreachable:
            now = self.clock()
            if now >= self._vouched_until:
                log.info("told a peer the metadata store is unreachable: taking nothing "
                         "for %.0f s", self.timing.recovery_grace)  # fmt: skip
            self._vouched_until = max(self._vouched_until, now + self.timing.recovery_grace)
        return unreachable

    def riding_out(self) -> bool:
        """Whether this host acts on a metadata outage's terms now: it does not try to
        write ack levels and parked rows (they wait in memory for the store)."""
        return self.store_unreachable() and self.clock() < self._riding_until

    def ride_out(self, until: float) -> int:
        """Every peer said it cannot reach the store: act until ``until`` for each unit
        whose window has not run out (one that has may have been taken meanwhile).
        Returns how many units that is."""
        now = self.clock()
        extended = 0
        for held in self.held.values():
            if held.acting_until > now:
                held.acting_until = max(held.acting_until, until)
                extended += 1
        if extended:
            self._riding_until = max(self._riding_until, until)
        return extended

    async def _tick_noting_outages(self) -> None:
        self._tick_started = self.clock()
        self._longest_ask = 0.0
        keep = asyncio.create_task(self.lease.keep(), name="keep the units held")
        try:
            await self.tick()
        except Exception:
            self._failing = True
            self.lease.unsettle()
            self._taking_after = math.inf  # the first tick that succeeds renews only
            raise
        finally:
            keep.cancel()
            await asyncio.gather(keep, return_exceptions=True)
            slow = self._slow()
            if slow:
                took = self.clock() - (self._tick_started or 0.0)
                log.info("ownership tick took %.1f s (%.1f s of it with no metadata call "
                         "answered): taking nothing for %.0f s", took, self._longest_ask,
                         self.timing.recovery_grace)  # fmt: skip
            self._tick_started = None
        if self._failing or slow:
            self._failing = False
            self._taking_after = self.clock() + self.timing.recovery_grace

    async def _units(self) -> tuple[dict[Unit, str], set[tuple[str, str]]]:
        """Every unit with its extent's kind and every group (catalog.py)."""
        return await self._catalog.units()

    async def tick(self) -> None:
        catalog = await self._units()
        units, groups = catalog
        hosts = await self._ask(
            live_hosts(self.metadata, OUTPUTHOST, self.timing.dead_after, load=False)
        )
        self.peers = {h.id: h.address for h in hosts if h.id != self.id}
        live = {h.id for h in hosts} | {self.id}
        if self.lease.session is None:
            await self._drop_all()
            if not await self.lease.begin():
                return  # this host's last session (before a restart) has not expired
        stamp = await self.lease.stamp()
        if self.lease.settled(catalog, live, stamp):  # nothing moves: renew only (hostlease.py)
            if not await self.lease.renew():
                await self._drop_all()
            return
        fair = math.ceil(len(units) / len(live))
        held_by = await self._ask(self.metadata.lease_holders(LEASES))  # lease -> holder
        live_read = self.clock() < self.lease.until  # read while the store held the lease
        now = self.clock()
        self._unheld_since = {
            u: self._unheld_since.get(u, now) for u in units if unit_lease(*u) not in held_by
        }
        # quiet: every unit held by a live host, the shares even, nothing to do here
        quiet = not self._unheld_since and set(held_by.values()) <= live
        shares: dict[tuple[str, str, str], list[Unit]] = {}  # a group's units of one kind
        for unit, kind in units.items():
            shares.setdefault((unit[0], unit[1], kind), []).append(unit)
        gone = sorted(set(self.held) - set(units))
        # a group left with no unit may have been deleted between the reads of _units
        # (its extents read after the delete, its group before): ask again, so that its
        # streams close with DELETED, not with a reconnect to nothing
        emptied = {u[:2] for u in gone if u[:2] in groups} - {u[:2] for u in units}
        deleted = {key for key in emptied if not await self._group_exists(*key)}
        for unit in gone:
            moved = unit[:2] in groups and unit[:2] not in deleted
            await self._drop(unit, MOVED_CLOSE if moved else DELETED_CLOSE)
        released = list(gone)
        lost = await self._drop_lost(held_by, live_read)
        quiet = quiet and not gone and not lost
        shed = False
        wanted: list[Unit] = []  # units to take, in one call per TAKES_AT_ONCE
        split: set[str] | None = None  # split_groups(held_by), once a WHOLE unit is wanted
        before = list(self.held)  # renewed as the shares are taken, and after
        for members in shares.values():
            fair_here = math.ceil(len(members) / len(live))
            floor = len(members) // len(live)
            mine = sum(unit in self.held for unit in members)
            here = Counter(held_by.get(unit_lease(*u)) for u in members)
            lacking = any(here[h] < floor for h in live - {self.id})
            below = any(here[h] < floor for h in live)
            quiet = quiet and not (below and any(here[h] > fair_here for h in live))
            if not shed and mine > fair_here and now >= self._taking_after and lacking:
                # a live host has less than its share of this group's kind: hand it one
                # unit, whatever its total (a host holding every plain extent of a group
                # and another every timer one have equal totals, and the second would
                # deliver nothing); it takes what it lacks (below)
                unit = [u for u in members if u in self.held][-1]
                await self._drop(unit, MOVED_CLOSE)
                released.append(unit)
                mine -= 1
                shed = True
            for unit in members:
                if unit in self.held:
                    continue  # renewed with the host lease
                holder = held_by.get(unit_lease(*unit))
                if holder is not None and holder != self.id:
                    continue  # another host's
                if self.clock() < max(self._taking_after, self._vouched_until) or self._slow():
                    continue  # after an outage, or in what may be one
                orphaned = now - self._unheld_since.get(unit, now) >= self.orphan_after
                full = mine >= fair_here or (len(self.held) + len(wanted) >= fair and mine >= floor)
                if not orphaned and full:
                    continue
                if unit[2] == WHOLE:
                    split = split_groups(held_by) if split is None else split
                    if group_leases(*unit[:2]) in split:
                        continue  # its extents' leases have not ended yet
                wanted.append(unit)
                mine += 1  # counted as taken: a lease another host took first is not
        await self.lease.release(released)
        # the groups of each call's units load while the tick goes on (READS_AT_ONCE at
        # once): one after another, the 200 groups a restart of this host took loaded in
        # 25 s at load 22; loaded only after the tick, a tick that took 8,000 units after
        # a power loss in calls that waited tens of seconds delivered none meanwhile
        loads: list[asyncio.Task[list[None]]] = []
        limit = asyncio.Semaphore(READS_AT_ONCE)
        try:
            for at in range(0, len(wanted), TAKES_AT_ONCE):
                if not await self.lease.renew_soon(before):
                    break
                got = await self.lease.take(wanted[at : at + TAKES_AT_ONCE])
                taken = sorted({unit[:2] for unit in got or ()})
                loads.append(asyncio.create_task(self._load(taken, limit)))
            if not await self.lease.renew():
                await self._drop_all()
        finally:
            loaded = await asyncio.gather(*loads, return_exceptions=True)
        self.lease.read_all(catalog, live, stamp, quiet and not wanted and not shed)
        for result in loaded:
            if isinstance(result, BaseException):
                raise result

    async def _drop_lost(self, held_by: dict[str, str], live_read: bool) -> bool:
        """Drop the units held here that another host holds now (a write under a unit's
        fence was refused), or that no one holds though the store read them while this
        host's lease could not have expired (``live_read``: the unit went with its queue
        or group, purge.py, or the take was in a tail that a promoted standby lacks);
        whether any. A unit no one holds in a read made after this host's window ended
        is kept: its lease expired and nobody took it (it renews)."""
        lost = False
        for unit in sorted(self.held):
            holder = held_by.get(unit_lease(*unit))
            vanished = holder is None and live_read
            if holder not in (None, self.id) or vanished or unit in self.lease.fenced:
                self.held[unit].acting_until = 0.0
                gone = holder is None and not await self._group_exists(*unit[:2])
                await self._drop(unit, DELETED_CLOSE if gone else MOVED_CLOSE)
                lost = True
        return lost

    async def _load(self, groups: list[tuple[str, str]], limit: asyncio.Semaphore) -> list[None]:
        async def took(key: tuple[str, str]) -> None:
            async with limit:
                await self.outputs.took(*key)

        return await each(groups, took, len(groups) or 1)

    async def _group_exists(self, queue: str, group: str) -> bool:
        try:
            await self._ask(self.metadata.get_group(queue, group))
        except (GroupNotFound, QueueNotFound):
            return False
        return True

    async def _drop_all(self) -> None:
        """The host lease's session ended: no unit held acts now, and all are dropped."""
        for unit in sorted(self.held):
            await self._drop(unit, MOVED_CLOSE)

    async def _drop(self, unit: Unit, close_code: int) -> None:
        if not self.lease.forget(unit):
            return
        key = (unit[0], unit[1])
        log.info("output host %s drops %s/%s extent %s", self.id, *unit)
        if unit[2] == WHOLE or key not in self._groups:
            await self.outputs.unload(*key, close_code=close_code)
        else:
            self.outputs.dropped(*unit)
