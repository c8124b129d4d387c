"""What goes with a deleted queue, group or extent beyond their own rows: the unit leases
named after them (``group:QUEUE/GROUP/EXTENT``, the output hosts' ownership), and, once
every replica of a deleted extent is dropped, the extent's row itself
(``MetadataStore.purge_extent``). The statements here are the two stores' shared SQL,
given each store's parameter marker.

A lease row goes only with an extent that is gone for good (its id is never used again),
so a lease name never comes back with its epochs counted from 1 while an old holder may
still act on an old epoch: the leases of a deleted group on its queue's live extents stay
(expired) until those extents go."""

from __future__ import annotations

from typing import Any

from cherami.metadata.base import prefix_end
from cherami.metadata.models import DELETED

Statement = tuple[str, tuple[Any, ...]]
_LEASES = "group:"  # the prefix of every unit's lease (outputhost/ownership.py)


def _prefix(prefix: str, mark: str) -> Statement:
    end = prefix_end(prefix)
    assert end is not None
    return f"name >= {mark} AND name < {mark}", (prefix, end)


def _suffix(suffix: str, mark: str) -> Statement:
    """Names ending in ``suffix`` (no LIKE: names may hold its wildcards)."""
    return (
        f"length(name) > {mark} AND substr(name, length(name) - {mark} + 1) = {mark}",
        (len(suffix), len(suffix), suffix),
    )


def queue_leases(queue: str, mark: str) -> Statement:
    """Every unit lease of a deleted queue's groups (its extents are all deleted)."""
    where, args = _prefix(f"{_LEASES}{queue}/", mark)
    return f"DELETE FROM leases WHERE {where}", args


def dlq_leases(queue: str, group: str, mark: str) -> Statement:
    """The leases of a deleted group's dead-letter extents (merged back into it), before
    its dead-letter queue is deleted: they are deleted with it."""
    where, args = _prefix(f"{_LEASES}{queue}/{group}/", mark)
    cut = len(f"{_LEASES}{queue}/{group}/") + 1
    return (
        f"DELETE FROM leases WHERE {where} AND substr(name, {mark}) IN "
        f"(SELECT id FROM extents WHERE queue = (SELECT dlq FROM groups "
        f"WHERE queue = {mark} AND name = {mark}))",
        (*args, cut, queue, group),
    )


def purge_extent(extent_id: str, queue: str, mark: str) -> list[Statement]:
    """Delete what still names a deleted extent (ack levels, parked rows and unit leases
    written late, by a holder still acting when its queue was deleted), then its row (the
    last statement: whether it changed a row tells). Nothing goes for an extent not
    marked deleted, nor for a successor while its predecessor's row is there (a CP
    queue would see the predecessor without one)."""
    leases, lease_args = _prefix(f"{_LEASES}{queue}/", mark)
    ends, end_args = _suffix(f"/{extent_id}", mark)
    purged = (
        f"EXISTS (SELECT 1 FROM extents e WHERE e.id = {mark} AND e.status = {mark} AND "
        "(e.predecessor IS NULL OR NOT EXISTS (SELECT 1 FROM extents p "
        "WHERE p.id = e.predecessor)))"
    )
    it = (extent_id, DELETED)
    return [
        (
            f"DELETE FROM ack_levels WHERE queue = {mark} AND extent = {mark} AND {purged}",
            (queue, extent_id, *it),
        ),
        (
            f"DELETE FROM redeliveries WHERE queue = {mark} AND extent = {mark} AND {purged}",
            (queue, extent_id, *it),
        ),
        (
            f"DELETE FROM leases WHERE {leases} AND {ends} AND {purged}",
            (*lease_args, *end_args, *it),
        ),
        (f"DELETE FROM extents WHERE id = {mark} AND {purged}", (extent_id, *it)),
    ]
