"""Host membership: every role process heartbeats into the metadata store; a host that
misses heartbeats for timing.dead_after seconds is dead. Roles import it; it imports no role
(the store hosts' directory keeps itself in step with it: roles/storehost/directory.py)."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections import deque
from collections.abc import Callable

from cherami.loadmeter import LoadMeter
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import Host
from cherami.periodic import Periodic

log = logging.getLogger("cherami.cluster.membership")


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
    def __init__(
        self, metadata: MetadataStore, host: str, role: str, address: str,
        zone: str = "", meter: LoadMeter | None = None, *, interval: float,
    ) -> None:  # fmt: skip
        """A beat every ``interval`` seconds (timing.heartbeat_interval), each with the
        ``meter``'s latest load report (made every 2 s)."""
        self.metadata = metadata
        self.host = Host(id=host, role=role, address=address, heartbeat_at=0.0, zone=zone)
        self.meter = meter
        self._beats = Periodic(f"heartbeat of {host}", interval, self.beat)

    async def start(self) -> None:
        await self.beat()
        self._beats.start()

    async def beat(self) -> None:
        self.host.heartbeat_at = time.time()
        if self.meter is not None:
            self.host.load = self.meter.report()
        await self.metadata.heartbeat(self.host)

    async def stop(self) -> None:
        await self._beats.stop()


class LoopWatch:
    """How long this process's event loop was held up lately. A burst of work on the
    loop (a scrape of 10,000 queues' metrics: 3.4 s of one core) holds back every
    heartbeat the process writes, and a node's leader, looking right after, found its
    own input host silent for over ``dead_after`` and opened a second extent for 4,974
    queues. So a host counts as dead only after ``dead_after`` of silence while this
    process ran: the time its loop was held up in the window is added to it (a cluster's
    observer waits a little longer after its own stalls; nothing is declared dead
    sooner). A timer fires every PERIOD seconds: one per process, not per host."""

    PERIOD = 0.25
    KEPT = 64  # stalls remembered

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._held: deque[tuple[float, float]] = deque(maxlen=self.KEPT)  # (ended, seconds)
        self._due: float | None = None  # when the watch should wake next
        self._loop: asyncio.AbstractEventLoop | None = None

    def note(self, ended: float, late: float) -> None:
        """The loop was held up ``late`` seconds, until ``ended`` (monotonic)."""
        if late > 0:
            self._held.append((ended, late))

    def held_within(self, seconds: float) -> float:
        """Seconds the loop was held up in the last ``seconds``, the stall going on now
        (the watch not woken yet) included."""
        self._ensure()
        now = self._clock()
        held = sum(late for ended, late in self._held if ended >= now - seconds)
        if self._due is not None and now > self._due + self.PERIOD:
            held += now - self._due  # a stall the watch has not seen end yet
        return held

    def _ensure(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._loop is not loop:  # a timer, not a task: a loop closed under it is fine
            self._loop = loop
            self._due = self._clock() + self.PERIOD
            loop.call_later(self.PERIOD, self._wake, loop)

    def _wake(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop is not self._loop:
            return  # a watch of an earlier loop
        now = self._clock()
        if self._due is not None and now - self._due > self.PERIOD:  # a period late: held
            self.note(now, now - self._due)
        self._due = now + self.PERIOD
        loop.call_later(self.PERIOD, self._wake, loop)


LOOP = LoopWatch()  # this process's


async def live_hosts(
    metadata: MetadataStore, role: str, dead_after: float, load: bool = True
) -> list[Host]:
    """The hosts of ``role`` heard from within ``dead_after`` (the process's timing), plus
    the time this process's loop was held up meanwhile (LoopWatch); ``load=False``: without
    their load reports (MetadataStore.list_hosts), for who is alive alone."""
    held = LOOP.held_within(2 * dead_after)
    return await metadata.list_hosts(role, alive_within=dead_after + held, load=load)


class RecentHosts:
    """The live hosts of a role, read from the hosts table at most once per ``fresh``
    seconds (a heartbeat interval: no host's liveness changes faster than its
    heartbeats), callers at once sharing one read. The leader places every extent it
    opens on an input host (after a power loss, 2,000 opens read the table 2,000
    times); a cluster's frontend routes every request it forwards."""

    def __init__(
        self,
        metadata: MetadataStore,
        role: str,
        dead_after: float,
        fresh: float,
        clock: Callable[[], float] = time.monotonic,
        load: bool = True,
    ) -> None:
        """``load=False``: the hosts without their load reports (live_hosts)."""
        self._metadata, self._role, self._dead_after = metadata, role, dead_after
        self._fresh, self._clock, self._load = fresh, clock, load
        self._read: asyncio.Future[list[Host]] | None = None
        self._read_at = 0.0

    async def get(self) -> list[Host]:
        read = self._read
        if read is None or (read.done() and self._clock() - self._read_at >= self._fresh):
            self._read_at = self._clock()
            read = self._read = asyncio.ensure_future(
                live_hosts(self._metadata, self._role, self._dead_after, self._load)
            )
        try:
            return list(await asyncio.shield(read))
        except BaseException:
            if self._read is read and read.done():
                self._read = None  # a failed read is not kept
            raise
