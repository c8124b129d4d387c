"""What an output host knows of a queue's cancelled delayed messages (docs/api.md
"Scheduled messages"): every group's reader of a timer extent asks ``of`` when a run of
it comes due, and the cancelled ones are acked past (readwindow.py).

A queue's tombstones are read from the metadata store the first time a run of it comes
due, then kept: a cancel writes to the change log, and the host's refresh, which reads
the log every tick, reads the tombstones of the queues it names again (``follow``), so
what is kept is known complete as of the start of the last refresh. A run whose due time
is within CANCEL_MARGIN_MS of that is answered from memory (a cancel is written at least
that long before its message is due); an older view asks the store, which waits out a
metadata outage rather than deliver a message that may be cancelled."""

from __future__ import annotations

import time
from collections.abc import Callable

from cherami.errors import CheramiError, QueueNotFound
from cherami.metadata.base import MetadataStore
from cherami.metadata.cancelled import CANCEL_MARGIN_MS

# more kept queues named than this: their tombstones read in two statements, not two each
FOLLOW_IN_BULK = 32


class CancelCache:
    def __init__(self, metadata: MetadataStore, clock: Callable[[], float] = time.time) -> None:
        self.metadata = metadata
        self.clock = clock
        self._known: dict[str, dict[str, set[int]]] = {}  # queue -> extent -> seqs
        self._loaded: dict[str, float] = {}  # queue -> ms its tombstones were read from
        self._frozen: dict[str, float] = {}  # queue -> ms: a read again failed, known as of
        self._followed = 0.0  # ms the last read of the change log began

    def as_of(self, queue: str) -> float | None:
        """Every cancel of the queue written before this time (ms) is known (None: none)."""
        if queue not in self._known:
            return None
        return self._frozen.get(queue, max(self._loaded[queue], self._followed))

    async def of(self, queue: str, extent: str, lo: int, hi: int, due_ms: int) -> set[int]:
        """The cancelled sequence numbers from ``lo`` to ``hi`` of a timer extent whose
        messages are due by ``due_ms``; raises CheramiError when the store must be asked
        and does not answer."""
        as_of = self.as_of(queue)
        if as_of is None or as_of < due_ms - CANCEL_MARGIN_MS:
            await self._load(queue)
        return {n for n in self._known[queue].get(extent, ()) if lo <= n <= hi}

    async def known(self, queue: str) -> None:
        """Read the queue's tombstones unless kept already (when the host sees its first
        timer extent: a run that comes due in a metadata outage finds them here)."""
        if queue not in self._known:
            await self._load(queue)

    async def _load(self, queue: str) -> None:
        started = self.clock() * 1000
        self._known[queue] = await self.metadata.cancelled_in(queue)
        self._loaded[queue] = started
        self._frozen.pop(queue, None)

    async def follow(self, changed: set[str] | None, started_ms: float) -> None:
        """A read of the change log that began at ``started_ms`` named ``changed`` (None:
        an unknown point, every queue): the kept queues it names are read again (a
        deleted one is forgotten), the others are known as of then; nothing is done per
        queue it does not name. Many are read in two statements, not two reads each: a
        power loss names every queue at every refresh while the leader replaces their
        extents (1,000 queues: 2,000 reads one after another, refresh after refresh)."""
        named = list(self._known) if changed is None else sorted(changed & self._known.keys())
        if len(named) > FOLLOW_IN_BULK:
            await self._follow_all(named)
        for queue in named if len(named) <= FOLLOW_IN_BULK else ():
            before = self.as_of(queue)
            try:
                await self.metadata.get_queue(queue)
                await self._load(queue)
            except QueueNotFound:
                self._forget(queue)
            except CheramiError:
                self._frozen.setdefault(queue, before or 0.0)  # a run due later asks the store
        self._followed = started_ms

    async def _follow_all(self, named: list[str]) -> None:
        started = self.clock() * 1000
        try:
            queues = {q.name for q in await self.metadata.list_queues()}
            everywhere = await self.metadata.cancelled_everywhere()
        except CheramiError:
            for queue in named:  # a run due later asks the store
                self._frozen.setdefault(queue, self.as_of(queue) or 0.0)
            return
        for queue in named:
            if queue not in queues:
                self._forget(queue)
                continue
            self._known[queue] = everywhere.get(queue, {})
            self._loaded[queue] = started
            self._frozen.pop(queue, None)

    def _forget(self, queue: str) -> None:  # deleted
        del self._known[queue], self._loaded[queue]
        self._frozen.pop(queue, None)
