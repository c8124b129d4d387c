"""Host leases: one lease per output host that covers the units (``group:`` leases) it
holds, so an idle host renews one row per tick, not one per unit
(``MetadataStore.begin_host_lease`` and the calls after it; design/fencing.md).

A host lease row (table ``host_leases``) is a host's *session*: a number that grows each
time a session of the host begins or ends, and an expiry judged by the store's clock. A
unit row taken under a host lease records its holder and the holder's session
(``leases.session``; NULL for a lease with its own expiry: the controller lead's, a
unit released by its holder, a unit taken before host leases). Such a unit is held
while its holder's row still has that session and has not expired.

Nobody takes a unit of a session that has not *ended*, and a session ends only by a
write to its host's row: the host begins a new one (only once its last one expired),
or a host that takes one of its units after it expired ends it in the same transaction,
with the host row locked so that no renewal slips in between. A renewal names the
session, so it fails once the session ended, and then the host has lost every unit at
once; a session that expired and that nobody ended renews (nobody took a unit of it,
just as a per-unit lease that ran out and was not taken renews). Every change of a
unit's holder or session still bumps the unit's epoch, which fenced writes check.

This module is the two stores' shared part: which of the units asked for may be taken,
from their rows and their holders' host rows, locked."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

HOST_LEASE_PREFIX = "host:"  # what a log line names a host lease by


@dataclass
class TakePlan:
    """What ``take_units`` writes: units kept (held by this session already, or
    released by this host: the epoch stays), taken from another holder or session (the
    epoch grows), new rows; the hosts whose expired sessions it ends."""

    keep: list[str] = field(default_factory=list)
    bump: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    end: list[str] = field(default_factory=list)

    @property
    def taken(self) -> list[str]:
        return self.keep + self.bump


UnitRow = tuple[str, int | None, float]  # holder, session (None: own expiry), expires_at
HostRow = tuple[int, float]  # session, expires_at


def holders_to_lock(units: dict[str, UnitRow], host: str) -> list[str]:
    """The host rows a take locks (in this order): its own and each session holder's."""
    return sorted({holder for holder, session, _ in units.values() if session is not None} | {host})


def plan_take(
    names: list[str],
    units: dict[str, UnitRow],
    hosts: dict[str, HostRow],
    host: str,
    session: int,
    now: float,
) -> TakePlan | None:
    """Which of ``names`` ``host`` (in ``session``) takes, given the rows of those that
    exist and their holders' host rows, all locked, at the store's time ``now``. None
    when the session has ended (the host holds nothing then)."""
    mine = hosts.get(host)
    if mine is None or mine[0] != session:
        return None
    plan = TakePlan()
    for name in sorted(set(names)):
        row = units.get(name)
        if row is None:
            plan.new.append(name)
            continue
        holder, held_in, expires_at = row
        if held_in is None:  # a lease with its own expiry
            if holder == host:
                plan.keep.append(name)
            elif expires_at < now:
                plan.bump.append(name)
            continue
        if holder == host and held_in == session:
            plan.keep.append(name)
            continue
        current = hosts.get(holder)
        if current is None or current[0] != held_in:
            plan.bump.append(name)  # its session ended
        elif current[1] < now:
            if holder not in plan.end:
                plan.end.append(holder)  # expired: ended here, before anyone renews it
            plan.bump.append(name)
    return plan


def lease_stamp_pending(stamp: tuple[tuple[Any, ...], ...]) -> bool:
    """Whether a unit released under a host lease of ``stamp`` (``lease_stamp``) may
    still be held: its own expiry changes who holds it with no write to mark it."""
    return any(row[4] for row in stamp)
