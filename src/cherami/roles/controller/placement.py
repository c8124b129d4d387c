"""Placement by load: which input host opens a new extent and which store hosts hold
its replicas, decided from the hosts' latest load reports (one read of the hosts table)
and the queue's own open extents, never by scanning every queue."""

from __future__ import annotations

import bisect
import random
import time
from collections.abc import Callable, Iterable

from cherami.loadmeter import has_room
from cherami.metadata.models import Extent, Host, LoadReport

SUSPECT_WINDOW = 120.0  # seconds a failed extent counts against its store hosts
SUSPECT_AFTER = 2  # failed extents a store host must be in before it is suspected


class Placements:
    """Placements this controller made that the hosts' reports cannot show yet (those
    made after a host's latest report), so several extents opened within one report
    interval still spread out."""

    def __init__(self, clock: Callable[[], float] = time.time, keep: int = 1000) -> None:
        self._clock = clock
        self._keep = keep
        self._made: dict[str, list[float]] = {}  # host -> when, oldest first
        self._failed: dict[str, tuple[float, tuple[str, ...]]] = {}  # extent -> when, stores
        # each host's latest report and its messages/s in, summed once a report (a store
        # host's names every extent written since its last: hundreds while queues are made)
        self._rates: dict[str, tuple[LoadReport, float]] = {}

    def add(self, hosts: Iterable[str]) -> None:
        now = self._clock()
        for host in hosts:
            made = self._made.setdefault(host, [])
            made.append(max(now, made[-1]) if made else now)  # kept sorted if the clock steps back
            if len(made) > 2 * self._keep:
                del made[: -self._keep]

    def pending(self, host: Host) -> int:
        """Placements on ``host`` since its latest report (a search, not a walk of every
        placement made: it is asked for every host at every extent opened)."""
        since = host.load.at if host.load is not None else 0.0
        made = self._made.get(host.id, [])
        return len(made) - bisect.bisect_left(made, since)

    def msgs_in(self, host: Host, report: LoadReport) -> float:
        kept = self._rates.get(host.id)
        if kept is None or kept[0] is not report:
            kept = self._rates[host.id] = (report, report.msgs_in())
        return kept[1]

    def failed(self, extent_id: str, stores: Iterable[str]) -> None:
        """An extent failed under a live input host while all its store hosts were live:
        one of them (which, the controller cannot tell: it may still reach them all) did
        not take the input host's appends."""
        self._failed[extent_id] = (self._clock(), tuple(stores))
        if len(self._failed) > self._keep:
            del self._failed[next(iter(self._failed))]

    def suspects(self, hosts: list[Host]) -> set[str]:
        """The store hosts among ``hosts`` in the most recently failed extents, when that
        is at least SUSPECT_AFTER and more than some other host: a host that input hosts
        cannot reach is in every extent that fails, the others only in some of them."""
        since = self._clock() - SUSPECT_WINDOW
        counts = dict.fromkeys((h.id for h in hosts), 0)
        for at, stores in self._failed.values():
            if at >= since:
                for store in stores:
                    if store in counts:
                        counts[store] += 1
        top = max(counts.values(), default=0)
        if top < SUSPECT_AFTER or min(counts.values()) == top:
            return set()
        return {h for h, n in counts.items() if n == top}


def _load(host: Host, placed: Placements) -> tuple[int, float]:
    """(open extents, messages/s in): the load a placement balances."""
    report = host.load
    if report is None:
        return placed.pending(host), 0.0
    return report.open_extents + placed.pending(host), placed.msgs_in(host, report)


def pick_input_host(hosts: list[Host], queue_extents: list[Extent], placed: Placements) -> str:
    """The live input host for a queue's new extent: one holding the fewest of the
    queue's open extents (so a queue's extents spread over input hosts, two sharing one
    only when every input host has one), the least loaded of those."""
    if not hosts:
        raise ValueError("no input host")
    mine: dict[str, int] = {}
    for extent in queue_extents:
        mine[extent.input_host] = mine.get(extent.input_host, 0) + 1
    return min(hosts, key=lambda h: (mine.get(h.id, 0), *_load(h, placed), h.id)).id


def pick_stores(
    hosts: list[Host],
    replicas: int,
    placed: Placements,
    rng: Callable[[], float] = random.random,
) -> list[str]:
    """Up to ``replicas`` store hosts for a new extent's replicas: those with free disk
    above the floor first, the least loaded first (ties broken at random), each in a
    zone none of the others is in while there are such zones. Suspected store hosts
    (``Placements.suspects``: input hosts seem unable to reach them) come last, without
    regard to zones, which would otherwise pick the one host of a zone cut off from the
    input hosts for every extent (the controller itself still reaches it, and it still
    heartbeats), so that every extent failed in turn and publishing stalled."""
    suspects = placed.suspects(hosts)
    ranked = sorted(
        hosts,
        key=lambda h: (not has_room(h), *_load(h, placed), rng()),
    )
    chosen: list[str] = []
    zones: set[str] = set()
    # hosts with room before those without; in each, one per zone, then zones again;
    # suspects after all of them
    for suspect, roomy, distinct in (
        (False, True, True), (False, True, False), (False, False, True),
        (False, False, False), (True, True, False), (True, False, False),
    ):  # fmt: skip
        for host in ranked:
            if len(chosen) == replicas:
                return chosen
            if (host.id in suspects) != suspect or has_room(host) != roomy:
                continue
            if host.id in chosen or (distinct and host.zone and host.zone in zones):
                continue
            chosen.append(host.id)
            zones.add(host.zone)
    return chosen
