"""What the metadata says of every group's units, for the ownership tick (ownership.py):
each unit with its extent's kind, and every group, kept up by the metadata's change log.

A tick reads again only the queues the log names since the last (a queue's record,
groups, extents or merged dead-letter ranges): an idle catalog costs one query, the
queues changed four statements together (``queues_with_extents`` and ``groups_of``,
per 500 names; three to five calls a queue before). When many queues changed (a power
loss names every queue, as the input hosts report every extent failing and the leader
seals and reopens them), or the log cannot say what changed, it reads the whole
catalog in four statements instead (queues, groups, readable extents, merged ranges): read queue by
queue, 8 at a time, 1,000 queues took thousands of calls and a tick of 92 s at load 28,
and the groups' successors were taken only after it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

from cherami.metadata.base import MetadataStore
from cherami.metadata.models import FAILING, OPEN, SEALED, STREAM, Extent, Group, Queue

# the groups a tick took loaded at once (ownership.py); queues read one by one, 8 at a
# time, once took a tick 5-8 s with 100 changed on a loaded machine
READS_AT_ONCE = 8
# more queues than this changed since the last tick, and more than one in BULK_SHARE of
# those known: read the whole catalog (four statements, but every queue's rows decoded);
# fewer are read by name (four statements per 500, only their rows decoded). With one in
# 40, the whole catalog was still 31% of an output host's CPU while 600 queues were made
# (ticks name dozens of queues then); with BULK_AFTER alone, a cluster of 10,000 queues
# being made read all 30,000 queue rows at every tick of every output host
BULK_AFTER = 32
BULK_SHARE = 2
READABLE = (OPEN, FAILING, SEALED)  # the statuses of the extents a group may still read
WHOLE = "*"  # the extent of a unit that is the whole group

Unit = tuple[str, str, str]  # queue, group, extent id (or WHOLE)
# a queue's units with their extents' kinds, its groups, and its groups' dead-letter queues
QueueUnits = tuple[dict[Unit, str], set[tuple[str, str]], set[str]]
T = TypeVar("T")


class Ask(Protocol):
    def __call__(self, call: Awaitable[T], /) -> Awaitable[T]: ...


def whole(queue: Queue, group: Group) -> bool:
    """Whether the group is one unit: a CP queue's group (its extents are read in order
    across seals), a stream-mode group (no cursors here), and a group of a queue that
    took keyed messages (``Queue.keyed``: a key may be in an extent on each input host,
    and only one output host seeing them all keeps its order)."""
    return queue.config.type == "cp" or queue.keyed or group.config.type == STREAM


def group_units(queue: Queue, group: Group, extents: list[str]) -> list[Unit]:
    """A group's units, given the extents it may still read."""
    if whole(queue, group):
        return [(group.queue, group.name, WHOLE)]
    return [(group.queue, group.name, e) for e in extents]


def split_groups(held_by: dict[str, str]) -> set[str]:
    """The groups (by their lease prefix) with an extent's lease held: their WHOLE unit
    is not taken until those leases end, so that no two hosts act for an extent when a
    queue becomes keyed (its groups' units go from extents to WHOLE)."""
    return {n[: n.rindex("/") + 1] for n in held_by if not n.endswith("/" + WHOLE)}


def queue_units(
    queue: Queue,
    groups: list[Group],
    readable: list[Extent],
    merged: Callable[[Group], list[str]],
) -> QueueUnits:
    """A queue's units (with their kinds), groups and groups' dead-letter queues, given
    its groups, its readable extents and each group's merged dead-letter extents."""
    if not groups:
        return {}, set(), set()
    extents = [e.id for e in readable]
    kinds = {e.id: e.kind for e in readable}
    units: dict[Unit, str] = {}
    for group in groups:
        more = [] if whole(queue, group) else merged(group)
        for unit in group_units(queue, group, extents + more):
            units[unit] = kinds.get(unit[2], "dlq")
    return units, {(g.queue, g.name) for g in groups}, {g.dlq for g in groups}


def _by_queue(items: Iterable[Any], key: Callable[[Any], str]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for item in items:
        out.setdefault(key(item), []).append(item)
    return out


class UnitCatalog:
    def __init__(self, metadata: MetadataStore, ask: Ask) -> None:
        """``ask`` runs each metadata call (the tick times them: ownership's slow rule)."""
        self.metadata = metadata
        self._ask = ask
        self._seen = -1
        self._queues: dict[str, QueueUnits] = {}
        self._dlq_of: dict[str, str] = {}  # a group's dead-letter queue -> its queue
        # every queue's units and groups together, as units() last merged them
        self._last: tuple[dict[Unit, str], set[tuple[str, str]]] | None = None

    async def units(self) -> tuple[dict[Unit, str], set[tuple[str, str]]]:
        """Every unit with its extent's kind (plain or timer: a group's share of each is
        counted apart), and every group (those without units too)."""
        latest, changed = await self._ask(self.metadata.changes_since(self._seen))
        if changed is not None and not changed and self._last is not None:
            return self._last  # nothing changed: the catalog as last merged
        if changed is None or len(changed) > max(BULK_AFTER, len(self._queues) // BULK_SHARE):
            self._queues = await self._read_all()
        else:  # a dead-letter queue's extents are those of its group's merged ranges
            names = changed | {self._dlq_of[n] for n in changed if n in self._dlq_of}
            for name in names:
                self._queues.pop(name, None)
            self._queues.update(await self._read_named(names))
        self._seen = latest
        self._dlq_of = {dlq: name for name, (_, _, dlqs) in self._queues.items() for dlq in dlqs}
        units: dict[Unit, str] = {}
        groups: set[tuple[str, str]] = set()
        for queue_units_, queue_groups, _ in self._queues.values():
            units.update(queue_units_)
            groups |= queue_groups
        self._last = units, groups
        return units, groups

    async def _read_all(self) -> dict[str, QueueUnits]:
        """Every queue's units, in four reads (one statement each)."""
        queues = await self._ask(self.metadata.list_queues())
        groups = await self._ask(self.metadata.list_every_group())
        extents = _by_queue(
            await self._ask(self.metadata.list_extents_in(READABLE)), lambda e: e.queue
        )
        merged: dict[tuple[str, str], list[str]] = {}
        for queue, group, extent in await self._ask(self.metadata.list_merged_extents()):
            merged.setdefault((queue, group), []).append(extent)
        return _assemble(((q, extents.get(q.name, [])) for q in queues), groups, merged)

    async def _read_named(self, names: set[str]) -> dict[str, QueueUnits]:
        """The named queues' units (those that exist), in four statements per 500 names
        (three to five calls a queue before: at every tick of every output host, 9 to 15
        a queue made in a cluster, with its groups' dead-letter queues)."""
        found = await self._ask(self.metadata.queues_with_extents(names, READABLE))
        read = await self._ask(self.metadata.groups_of(names))
        merged = {(g.queue, g.name): extents for g, extents in read}
        return _assemble(found, [g for g, _ in read], merged)


def _assemble(
    found: Iterable[tuple[Queue, list[Extent]]],
    groups: Iterable[Group],
    merged: dict[tuple[str, str], list[str]],
) -> dict[str, QueueUnits]:
    """Each queue's units, from its readable extents, the groups (of any queue) and
    each group's merged dead-letter extents."""
    by_queue = _by_queue(groups, lambda g: g.queue)
    return {
        q.name: queue_units(
            q, by_queue.get(q.name, []), readable, lambda g: merged.get((g.queue, g.name), [])
        )
        for q, readable in found
    }
