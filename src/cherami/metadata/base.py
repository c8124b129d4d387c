"""The metadata contract shared by the SQLite (one machine) and PostgreSQL (cluster) stores."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

from cherami.metadata.models import (
    AckLevel,
    Extent,
    Fence,
    Group,
    Host,
    Queue,
    QueueFlag,
    Redelivery,
)

_MAX_CHAR = 0x10FFFF
_SURROGATES = range(0xD800, 0xE000)


def prefix_end(prefix: str) -> str | None:
    """The least string above every string that starts with ``prefix``, in code-point
    order (None: there is none, or no prefix): the strings that start with it are those
    ``>= prefix`` and ``< prefix_end(prefix)``, a range an index answers, with no LIKE
    and so no wildcard to escape. Both stores order names by code point (SQLite's
    BINARY collation, PostgreSQL's "C")."""
    kept = prefix.rstrip(chr(_MAX_CHAR))
    if not kept:
        return None
    last = ord(kept[-1]) + 1
    if last in _SURROGATES:  # not a character a stored string can hold: skip them
        last = _SURROGATES.stop
    return kept[:-1] + chr(last)


def page_clause(
    prefix: str, after: str | None, limit: int | None, mark: str
) -> tuple[str, list[Any]]:
    """The ``AND ...`` conditions and ``ORDER BY ... LIMIT`` of a listing by name (see
    ``MetadataStore.list_queues``), with ``mark`` the store's parameter marker."""
    sql = ""
    args: list[Any] = []
    if prefix:
        sql += f" AND name >= {mark}"
        args.append(prefix)
        end = prefix_end(prefix)
        if end is not None:
            sql += f" AND name < {mark}"
            args.append(end)
    if after is not None:
        sql += f" AND name > {mark}"
        args.append(after)
    sql += " ORDER BY name"
    if limit is not None:
        sql += f" LIMIT {mark}"
        args.append(max(0, limit))
    return sql, args


class ChangeWatch(Protocol):
    async def stop(self) -> None: ...


class MetadataStore(Protocol):
    async def close(self) -> None: ...

    def watch_changes(self, wake: Callable[[], None]) -> ChangeWatch | None:
        """Call ``wake`` soon after each write the change log records (``changes_since``),
        from a listener started now and ended by its ``stop``; None where the store
        does not notify (SQLite: one node process writes and reads)."""

    # queues
    async def insert_queue(self, queue: Queue) -> None:
        """Raises AlreadyExists when a queue of that name exists."""

    async def get_queue(self, name: str) -> Queue:
        """Raises QueueNotFound."""

    async def list_queues(
        self,
        prefix: str = "",
        after: str | None = None,
        limit: int | None = None,
        *,
        dlqs: bool = True,
    ) -> list[Queue]:
        """The queues by name (in code-point order): those whose names start with
        ``prefix`` (every one for ""), above ``after`` (a name, from the start for None),
        the first ``limit`` of them (None: all). ``dlqs=False`` leaves the groups' DLQs
        out. A page is one index range read, whatever the number of queues."""

    async def update_queue(self, queue: Queue) -> None:
        """Stores the queue's config (and its ``timers`` and ``keyed`` flags, which only
        ever go from false to true)."""
        ...

    async def mark_queue(self, name: str, flag: QueueFlag) -> None:
        """Sets the queue's ``flag`` for good: "timers" (it keeps timer extents from now
        on, ``Queue.timers``) or "keyed" (it took a keyed message, ``Queue.keyed``); a
        change in the change log when it was not set already. Raises QueueNotFound."""
        ...

    async def delete_queue(self, name: str) -> None:
        """Deletes the queue, its groups, their ack levels and redeliveries; marks its
        extents deleted."""

    # consumer groups
    async def insert_group(self, group: Group) -> None: ...

    async def get_group(self, queue: str, name: str) -> Group:
        """Raises GroupNotFound."""

    async def list_groups(
        self, queue: str, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> list[Group]:
        """The queue's groups by name, paged as ``list_queues`` pages queues."""

    async def list_every_group(self) -> list[Group]:
        """Every group of every queue (DLQ cursors too) in one read, by queue and name:
        what looks at all groups (a scrape, a start) reads once, not once per queue."""

    async def update_group(self, group: Group) -> None: ...

    async def delete_group(self, queue: str, name: str) -> None:
        """Deletes the group, its ack levels and its redeliveries."""

    # extents
    async def insert_extent(self, extent: Extent, fence: Fence | None = None) -> bool:
        """Insert; when ``extent.predecessor`` is set, only if no other extent already
        succeeds it (the conditional write of CP queues). Returns whether it was inserted.
        With a ``fence``, raises Fenced (and writes nothing) when its epoch is stale."""

    async def get_extent(self, extent_id: str) -> Extent | None: ...

    async def purge_extent(self, extent_id: str, queue: str) -> bool:
        """Delete the row of an extent marked deleted whose replicas are all dropped, and
        the ack levels, parked rows and unit leases of ``queue``'s groups that still name
        it (purge.py); True when the row went. A row not marked deleted stays, and so
        does a successor's while its predecessor's row is there."""

    async def list_extents(self, queue: str, statuses: tuple[str, ...] = ()) -> list[Extent]: ...

    async def queues_with_extents(
        self, names: Collection[str], statuses: tuple[str, ...]
    ) -> list[tuple[Queue, list[Extent]]]:
        """Each of the named queues that exists (by name), with its extents in
        ``statuses`` (as ``list_extents`` orders them), in a statement or two per 500
        names: what follows many changed queues reads them at once, not one by one."""
        ...

    async def groups_of(self, names: Collection[str]) -> list[tuple[Group, list[str]]]:
        """The groups of the named queues (by queue and name), each with its merged
        dead-letter extents (as ``list_merged_extents`` has them), in two statements
        per 500 names: an output host's catalog reads the queues changed since its last
        tick so, not three to five calls a queue."""
        ...

    async def changes_since(self, after: int) -> tuple[int, set[str] | None]:
        """The change log: the newest change's number, and the queues written since
        change ``after`` (a queue's record, its groups, its extents, a merged DLQ range
        of one of its groups); None for the queues when ``after`` is unknown (-1) or
        older than the log keeps (the newest 10,000 changes): then anything may have
        changed. What polls the catalog asks this and reads only what changed."""

    async def list_extents_in(self, statuses: tuple[str, ...]) -> list[Extent]:
        """Every extent of every queue in one of ``statuses``, in one read (a node's
        recovery looks at all its open extents at once, not queue by queue)."""

    async def list_merged_extents(self) -> list[tuple[str, str, str]]:
        """(queue, group, extent) of every dead-letter extent with a range merged back
        into a group (an ack level with a limit) while the extent's row is in the
        group's DLQ, in one read: the extents a group reads besides its queue's."""

    async def set_extent_status(
        self,
        extent_id: str,
        status: str,
        sealed_seq: int | None = None,
        fence: Fence | None = None,
    ) -> None:
        """A deleted extent stays deleted, and only an open one becomes FAILING (the
        change is ignored: an input host's report that reads OPEN and lands after the
        seal must not turn a sealed extent back). With a ``fence``, raises Fenced (and
        writes nothing) when its epoch is stale."""

    # ack levels
    async def get_ack_levels(self, queue: str, group: str) -> list[AckLevel]: ...

    async def put_ack_levels(self, levels: list[AckLevel], fence: Fence | None = None) -> None:
        """Upsert all of them in one transaction. A level never moves backward: an
        update with a smaller ``acked`` than the stored one changes nothing. With a
        ``fence``, raises Fenced (and writes nothing) when its epoch is stale."""

    async def put_fenced_ack_levels(
        self, writes: Sequence[tuple[Fence, list[AckLevel]]]
    ) -> set[Fence]:
        """Each fence's levels upserted as ``put_ack_levels`` would, all of them in one
        transaction: an output host's flush of many groups' acks is one write, not one
        per unit. Returns the fences whose epoch is stale; their levels are not written
        (the others' are)."""
        ...

    async def delete_ack_levels(self, queue: str, group: str, extents: list[str]) -> None: ...

    async def list_every_parked_extent(self) -> list[tuple[str, str]]:
        """(queue, extent) of every extent that holds a parked message of some group, in
        one read: retention keeps them, and looks at every queue once a pass."""

    async def list_every_ack_level(self) -> list[AckLevel]:
        """Every ack level of every group (DLQ cursors too) in one read, by queue, group
        and extent: a scrape of many groups not loaded reads them once, not group by group."""

    # redeliveries (parked messages: delivered, not acked)
    async def get_redeliveries(self, queue: str, group: str) -> list[Redelivery]:
        """The group's redelivery rows, in (extent, key) order."""

    async def put_redeliveries(
        self,
        upserts: list[Redelivery],
        deletes: list[Redelivery],
        fence: Fence | None = None,
    ) -> None:
        """Upsert and delete rows (by queue, group, extent, key) in one transaction.
        With a ``fence``, raises Fenced (and writes nothing) when its epoch is stale."""

    # queue properties (properties.py)
    async def get_queue_properties(self, queue: str, prefix: str = "") -> dict[str, str]:
        """The queue's properties whose names start with ``prefix`` (all for ""); none
        for a queue that does not exist."""

    async def put_queue_properties(
        self, queue: str, values: dict[str, str], delete: list[str] | None = None
    ) -> None:
        """Set ``values`` and delete the properties named in ``delete``, in one
        transaction. Raises QueueNotFound (and writes nothing) when the queue does not
        exist; ``delete_queue`` deletes its properties."""

    async def find_queue_properties(self, name: str, value: str | None = None) -> dict[str, str]:
        """Queue -> value, for every queue that has the property ``name`` (with that
        ``value``, when given): one index read."""

    # cancelled delayed messages (tombstones every group honours when they come due)
    async def cancel_scheduled(self, queue: str, extent: str, seqs: list[int]) -> None:
        """Record these messages of a timer extent as cancelled (again: no change)."""

    async def cancelled_scheduled(self, queue: str, extent: str, lo: int, hi: int) -> set[int]:
        """The cancelled sequence numbers of a timer extent from ``lo`` to ``hi``."""

    async def cancelled_in(self, queue: str) -> dict[str, set[int]]:
        """Every cancelled sequence number of the queue, by timer extent."""

    async def cancelled_everywhere(self) -> dict[str, dict[str, set[int]]]:
        """Every cancelled sequence number of every queue, by queue and timer extent, in
        one read (an output host that follows many changed queues at once)."""

    # membership and leadership
    async def heartbeat(self, host: Host) -> None: ...

    async def list_hosts(
        self, role: str | None, alive_within: float | None, load: bool = True
    ) -> list[Host]:
        """The hosts of ``role`` (None: every role) that heartbeat within the last
        ``alive_within`` seconds (None: every host ever seen), by id, each with its
        zone and latest load report (``load=False``: without it, ``Host.load`` None; a
        busy host's report names every extent it served lately, and who is alive is
        asked often: routing, the output hosts' ownership ticks)."""

    async def lease_holder(self, name: str) -> str | None:
        """Who holds the lease now (None when nobody holds an unexpired one: a unit taken
        under a host lease is held while that host lease is, in the session it names)."""

    async def lease_holders(self, prefix: str) -> dict[str, str]:
        """The leases held now whose names start with ``prefix`` (as ``lease_holder``
        says): name -> holder."""

    async def try_lease(self, name: str, holder: str, ttl_seconds: float) -> int | None:
        """Take or renew the lease for ``ttl_seconds``, judged by the store's clock.
        Returns the lease's epoch when ``holder`` holds it now (it grows by one each
        time the holder changes, and stays on a renewal), else None."""

    async def try_leases(self, names: list[str], holder: str, ttl_seconds: float) -> dict[str, int]:
        """``try_lease`` of each of ``names`` (a unit taken under a host lease is left
        alone: ``take_units`` takes it), in one statement: name -> epoch of those
        ``holder`` holds now (an output host takes hundreds of units after a power loss:
        one round trip each took 15-25 s on a loaded machine)."""

    async def renew_leases(
        self, names: list[str], holder: str, ttl_seconds: float
    ) -> dict[str, int]:
        """Renew, in one statement, each lease of ``names`` that ``holder`` still holds
        (as ``try_lease`` renews one: its epoch stays): name -> epoch of those renewed.
        A lease another holder has taken is left alone and absent from the answer."""

    # host leases: an output host's one lease covering its units (hostleases.py)
    async def begin_host_lease(self, host: str, ttl_seconds: float) -> int | None:
        """Begin a new session of ``host``'s host lease, for ``ttl_seconds`` by the
        store's clock, once its last session (if any) has expired: its number (greater
        than any before), or None while that one has not expired (the host restarted
        quickly, or another process runs with its id)."""

    async def renew_host_lease(self, host: str, session: int, ttl_seconds: float) -> bool:
        """Renew the session for ``ttl_seconds``; False once it has ended (a host took
        one of its units after it expired, or a new session began): then every unit it
        held may be another's. A session that expired and nobody ended renews."""

    async def take_units(
        self, names: list[str], host: str, session: int, ttl_seconds: float
    ) -> dict[str, int] | None:
        """Take, in one transaction, those of the unit leases ``names`` that nobody
        holds (``lease_holder``), ending the expired sessions of their holders, and
        renew the session: name -> epoch of those the session holds now (an epoch
        grows on each change of holder or session). None when the session has ended."""

    async def release_units(self, names: list[str], host: str, session: int) -> None:
        """Let go of units the session holds: each becomes a lease of its own that
        expires when the host lease would have now (anyone takes it after that)."""

    async def lease_stamp(self) -> tuple[tuple[Any, ...], ...]:
        """What the unit leases' holders (``lease_holders``) depend on besides the
        catalog, a row per host lease, so that an idle output host need not read every
        unit's lease to learn that nothing moved: each host's session, a count of its
        takes and releases, whether its host lease is live and whether a unit it
        released may still be held (``lease_stamp_pending``). Equal stamps read at two
        times: no unit lease was taken, released or ended between them, except by a
        released unit's own expiry while it was pending."""
