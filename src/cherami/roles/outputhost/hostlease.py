"""The units an output host holds, under its one host lease (metadata/hostleases.py).

An idle host writes one row a tick, its host lease, whatever the number of units it
holds (it renewed every unit's lease in one statement before: thousands of row writes a
second at 1,000 queues on 3 hosts). A unit's acting window (ownership.py's fencing
rule) runs from the moment this host last *asked* for its host lease (a renewal, or a
take, which renews it too), ``lease_ttl`` minus ``lease_margin``. When a renewal or a
take finds the session ended (the lease expired and another host took one of its units,
which ends it), every unit stops acting at once and the tick drops them all; the next
tick begins a new session and takes units again. A unit this host drops while its
session goes on is released: another host takes it once this host's lease, as it
stood then, would have run out (as a unit's own lease ran out before).

Settled ticks: reading every unit's lease (``lease_holders``, a row a unit) is what a
tick costs at breadth, and when nothing moves it tells nothing new. So a tick skips
it, and only renews, while the catalog has not changed (the change log), the live
output hosts are the same, the last full read found every unit held by a live host
with the shares even (nothing to take, shed or drop), no write was refused under a
fence since, and the lease stamp (``MetadataStore.lease_stamp``, a row per host lease:
its session, a count of its takes and releases, whether it is live) is the one read
just before that full read. The stamp changes with everything who holds a unit
depends on but one: a released unit's own expiry, so while a released unit may still
be held it reads every lease all the same every ``FULL_EVERY`` seconds. It reads them
after a tick that failed too (the store may be a promoted standby that lacks the last
takes: ownership.py drops a unit no one holds in a read made while the host lease was
live). An idle host's tick thus reads a row per host whatever the number of units (it
read every unit's lease every ``FULL_EVERY`` before: 1,212 rows/s at 1,000 queues on
3 hosts). A dead host's units are still taken within ``dead_after`` and a tick: its
death changes the live hosts, and its host lease's expiry the stamp."""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from cherami.metadata.hostleases import lease_stamp_pending
from cherami.roles.outputhost.catalog import Unit
from cherami.timing import Timing

log = logging.getLogger("cherami.outputhost.ownership")

FULL_EVERY = 10.0  # seconds: while a released unit may be held, a full read this often
RENEW_WITHIN = 1.0  # a tick still taking units renews those it held this near their end
LEASES = "group:"  # the prefix of every unit's lease

Ask = Callable[[Awaitable[Any]], Awaitable[Any]]


def unit_lease(queue: str, group: str, extent: str) -> str:
    return f"{group_leases(queue, group)}{extent}"


def group_leases(queue: str, group: str) -> str:
    """The prefix of the lease names of a group's units."""
    return f"{LEASES}{queue}/{group}/"


class Held:
    """A unit held: its lease's epoch, and when this host stops acting for it (the
    host's clock). The window is the host lease's (``HostLease.until``), shared: a
    renewal moves every unit's in one assignment (it wrote each unit's before, about
    2,700 at 2,000 queues: a cost per unit per tick, the one found growing with N in an
    idle output host). A unit given a window of its own (fenced or dropped: 0; ridden
    out through a metadata outage: later) keeps it until the next renewal, as before."""

    __slots__ = ("_lease", "_own", "epoch", "unit")

    def __init__(self, lease: HostLease, unit: Unit, epoch: int) -> None:
        self._lease, self.unit, self.epoch = lease, unit, epoch
        self._own: float | None = None

    @property
    def acting_until(self) -> float:
        return self._lease.until if self._own is None else self._own

    @acting_until.setter
    def acting_until(self, until: float) -> None:
        self._own = until
        self._lease.apart.add(self)

    def share(self) -> None:
        """The host lease's window again."""
        self._own = None


class HostLease:
    def __init__(
        self, metadata: Any, host_id: str, timing: Timing, clock: Callable[[], float], ask: Ask
    ) -> None:
        """``ask``: how the tick makes a metadata call (timed, ownership._ask)."""
        self.metadata, self.id, self.timing, self.clock, self._ask = (
            metadata, host_id, timing, clock, ask,
        )  # fmt: skip
        self.session: int | None = None
        self.until = -math.inf  # the host clock's end of the window of the last renewal
        self.held: dict[Unit, Held] = {}
        self.apart: set[Held] = set()  # units with a window of their own (Held)
        self.groups: Counter[tuple[str, str]] = Counter()  # units held per group
        self.fenced: set[Unit] = set()  # units a refused write says another holds
        # the last full read: when, of which catalog and live hosts, and whether settled
        self._read_at = -math.inf
        self._read_of: tuple[object, frozenset[str]] | None = None
        self._stamp: object = None  # the lease stamp read just before the last full read

    def _window(self, asked: float) -> float:
        return asked + self.timing.lease_ttl - self.timing.lease_margin

    def _acting(self, asked: float) -> None:
        """A renewal (or a take) asked at ``asked`` succeeded: every unit but a fenced
        one acts until its window's end."""
        self.until = max(self.until, self._window(asked))
        kept = set()
        for held in self.apart:
            if held.unit in self.fenced:
                kept.add(held)
            else:
                held.share()
        self.apart = kept

    def _ended(self) -> None:
        log.warning("output host %s: its host lease (session %s) has ended: it acts for "
                    "none of its %d units now", self.id, self.session, len(self.held))  # fmt: skip
        self.session = None
        self._read_of = None
        for held in self.held.values():
            held.acting_until = 0.0

    async def begin(self) -> bool:
        """Begin a session unless one goes on; False while the host's last session (of
        a process before this one) has not expired."""
        if self.session is None:
            ttl = self.timing.lease_ttl
            self.session = await self._ask(self.metadata.begin_host_lease(self.id, ttl))
            if self.session is not None:
                log.info("output host %s begins host lease session %d", self.id, self.session)
        return self.session is not None

    async def renew(self) -> bool:
        """Renew the host lease; False when its session has ended (every unit lost)."""
        if self.session is None:
            return False
        asked = self.clock()
        ttl = self.timing.lease_ttl
        if await self._ask(self.metadata.renew_host_lease(self.id, self.session, ttl)):
            self._acting(asked)
            return True
        self._ended()
        return False

    async def renew_soon(self, before: list[Unit]) -> bool:
        """Renew while a tick is still taking others once an acting window of the units
        held before it is within RENEW_WITHIN of its end. After a power loss a tick
        takes hundreds of units: renewed only at the tick's end, every unit held stopped
        acting meanwhile, its acks refused ("moving to another output host") and its
        messages not delivered. False when the session has ended."""
        ends = min((self.held[u].acting_until for u in before if u in self.held), default=math.inf)
        if self.clock() > ends - RENEW_WITHIN:
            return await self.renew()
        return self.session is not None

    async def keep(self) -> None:
        """While a tick runs, renew as the windows near their end: a tick waits on reads
        of every queue the change log names and on loading the groups it took (after a
        store host's restart at load 22, 25 s), and the units renewed only at its end
        stopped acting meanwhile (acks refused as "moving to another output host",
        nothing delivered)."""
        while True:
            await asyncio.sleep(self.timing.ownership_tick / 2)
            try:
                await self.renew_soon(list(self.held))
            except Exception as err:  # the tick meets it too, and says so
                log.debug("renewal within a tick failed: %s", err)

    async def take(self, units: list[Unit]) -> list[Unit] | None:
        """Take the units in one call (it renews the host lease too); those taken, or
        None when the session has ended."""
        if self.session is None:
            return None
        asked = self.clock()
        names = {unit_lease(*unit): unit for unit in units}
        epochs = await self._ask(
            self.metadata.take_units(list(names), self.id, self.session, self.timing.lease_ttl)
        )
        if epochs is None:
            self._ended()
            return None
        self._acting(asked)
        for name, epoch in epochs.items():
            unit = names[name]
            self.held[unit] = Held(self, unit, epoch)
            self.groups[unit[:2]] += 1
            log.info("output host %s takes %s/%s extent %s (epoch %d)",
                     self.id, *unit, epoch)  # fmt: skip
        return [names[name] for name in epochs]

    async def release(self, units: list[Unit]) -> None:
        """Let another host take these units (dropped here) once the host lease, as it
        stands now, would have run out."""
        if units and self.session is not None:
            names = [unit_lease(*u) for u in units]
            await self._ask(self.metadata.release_units(names, self.id, self.session))

    def forget(self, unit: Unit) -> bool:
        """No longer held here; whether it was."""
        self.fenced.discard(unit)
        held = self.held.pop(unit, None)
        if held is None:
            return False
        self.apart.discard(held)
        key = unit[:2]
        self.groups[key] -= 1
        if self.groups[key] <= 0:
            del self.groups[key]
        return True

    # settled ticks
    async def stamp(self) -> Any:
        """The store's lease stamp now (read before the full read it vouches for)."""
        return await self._ask(self.metadata.lease_stamp())

    def settled(self, catalog: object, live: set[str], stamp: Any) -> bool:
        """Whether this tick may skip reading every lease (see the module)."""
        return (
            self._read_of is not None
            and self._read_of[0] is catalog
            and self._read_of[1] == live
            and not self.fenced
            and stamp == self._stamp
            and (not lease_stamp_pending(stamp) or self.clock() < self._read_at + FULL_EVERY)
        )

    def unsettle(self) -> None:
        """The next tick reads every lease (after a tick that failed: the store may be
        another now, a promoted standby that lacks the last takes)."""
        self._read_of = None

    def read_all(self, catalog: object, live: set[str], stamp: Any, quiet: bool) -> None:
        """A full read of every lease, made when the catalog was ``catalog`` and after
        the lease stamp ``stamp`` was read; ``quiet``: it found nothing to take, shed or
        drop."""
        self._read_at = self.clock()
        self._stamp = stamp
        self._read_of = (catalog, frozenset(live)) if quiet else None
