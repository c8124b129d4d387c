"""The host lease contract (metadata/hostleases.py), for every MetadataStore: units taken
under an output host's one lease, held while it is, taken over only once it expired and
fenced by the unit's epoch. A ttl of 0 makes a lease that has expired by the next call."""

from __future__ import annotations

import asyncio
import time

import pytest

from cherami.errors import Fenced
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import AckLevel, Fence, Queue, QueueConfig
from tests.contract.conftest import MetadataBackend

A, B = "group:q/g/e1", "group:q/g/e2"


async def _session(meta: MetadataStore, host: str, ttl: float = 30) -> int:
    session = await meta.begin_host_lease(host, ttl)
    assert session is not None
    return session


async def test_a_session_begins_only_once_the_last_expired(meta: MetadataStore) -> None:
    first = await _session(meta, "o1")
    assert await meta.begin_host_lease("o1", 30) is None  # o1's last session is live
    assert await meta.renew_host_lease("o1", first, 0)  # now it has expired
    second = await _session(meta, "o1")
    assert second > first
    assert not await meta.renew_host_lease("o1", first, 30)  # the old one has ended
    assert await meta.renew_host_lease("o1", second, 30)
    assert await _session(meta, "o2") >= 1  # each host its own


async def test_units_are_held_while_their_host_lease_is(meta: MetadataStore) -> None:
    s1 = await _session(meta, "o1")
    taken = await meta.take_units([A, B, A], "o1", s1, 30)
    assert taken is not None and set(taken) == {A, B}
    assert await meta.lease_holders("group:q/") == {A: "o1", B: "o1"}
    assert await meta.lease_holder(A) == "o1"
    assert await meta.take_units([A, B], "o1", s1, 30) == taken  # its own: epochs stay
    s2 = await _session(meta, "o2")
    assert await meta.take_units([A, B], "o2", s2, 30) == {}  # o1's lease is live
    assert await meta.try_lease(A, "o2", 30) is None  # not a lease of its own either
    assert await meta.renew_host_lease("o1", s1, 0)  # expires, nobody ended it
    assert await meta.lease_holders("group:q/") == {}
    assert await meta.lease_holder(A) is None


async def test_takeover_only_after_expiry_and_the_lapsed_host_cannot_renew(
    meta: MetadataStore,
) -> None:
    s1 = await _session(meta, "o1")
    old = await meta.take_units([A, B], "o1", s1, 30)
    assert old is not None
    s2 = await _session(meta, "o2")
    assert await meta.renew_host_lease("o1", s1, 0)
    new = await meta.take_units([A], "o2", s2, 30)
    assert new == {A: old[A] + 1}  # the epoch grows with the holder
    assert not await meta.renew_host_lease("o1", s1, 30)  # its session ended with the take
    assert await meta.take_units([B], "o1", s1, 30) is None
    assert await meta.lease_holders("group:q/") == {A: "o2"}  # B: nobody's now
    s3 = await _session(meta, "o1")  # o1 begins again and takes B back, in a new epoch
    assert await meta.take_units([A, B], "o1", s3, 30) == {B: old[B] + 1}
    assert await meta.lease_holders("group:q/") == {A: "o2", B: "o1"}


async def test_an_expired_session_nobody_ended_renews(meta: MetadataStore) -> None:
    s1 = await _session(meta, "o1")
    held = await meta.take_units([A], "o1", s1, 0)
    assert held is not None
    await _session(meta, "o2")  # another host, which takes nothing
    assert await meta.lease_holder(A) is None
    assert await meta.renew_host_lease("o1", s1, 30)
    assert await meta.lease_holder(A) == "o1"
    assert await meta.take_units([A], "o1", s1, 30) == held


async def test_a_fence_of_an_old_holder_is_refused(meta: MetadataStore) -> None:
    await meta.insert_queue(Queue(name="q", config=QueueConfig(), created_at=time.time()))
    s1 = await _session(meta, "o1")
    old = await meta.take_units([A], "o1", s1, 0)
    assert old is not None
    level = AckLevel(queue="q", group="g", extent="e1", level=b"\x01", acked=1)
    await meta.put_ack_levels([level], fence=Fence(lease=A, epoch=old[A]))
    s2 = await _session(meta, "o2")
    new = await meta.take_units([A], "o2", s2, 30)
    assert new == {A: old[A] + 1}
    later = AckLevel(queue="q", group="g", extent="e1", level=b"\x05", acked=5)
    with pytest.raises(Fenced):
        await meta.put_ack_levels([later], fence=Fence(lease=A, epoch=old[A]))
    await meta.put_ack_levels([later], fence=Fence(lease=A, epoch=new[A]))
    assert [a.acked for a in await meta.get_ack_levels("q", "g")] == [5]


async def test_a_released_unit_is_taken_once_the_host_lease_would_have_ended(
    meta: MetadataStore,
) -> None:
    s1 = await _session(meta, "o1")
    held = await meta.take_units([A, B], "o1", s1, 30)
    assert held is not None
    await meta.release_units([A], "o1", s1)
    s2 = await _session(meta, "o2")
    assert await meta.take_units([A], "o2", s2, 30) == {}  # o1 may act on till then
    assert await meta.lease_holder(A) == "o1"
    assert await meta.renew_host_lease("o1", s1, 0)
    await meta.release_units([B], "o1", s1)  # released when the host lease has run out
    assert await meta.take_units([A, B], "o2", s2, 30) == {B: held[B] + 1}  # A: not yet
    assert await meta.renew_host_lease("o1", s1, 30)  # a release ends no session


async def test_two_hosts_taking_at_once_get_each_unit_once(meta: MetadataStore) -> None:
    names = [f"group:q/g/e{i}" for i in range(20)]
    sessions = {h: await _session(meta, h) for h in ("o1", "o2", "o3")}
    results = await asyncio.gather(
        *(meta.take_units(names[i::2] + names[:5], h, s, 30)
          for i, (h, s) in enumerate(sessions.items()))
    )  # fmt: skip
    owners: dict[str, str] = {}
    for host, taken in zip(sessions, results, strict=True):
        assert taken is not None
        for name in taken:
            assert name not in owners
            owners[name] = host
    assert owners == await meta.lease_holders("group:q/")
    assert set(owners) == set(names)


async def test_a_renewal_racing_a_takeover_never_both_win(
    metadata_backend: MetadataBackend,
) -> None:
    """o1's host lease has expired; o1 renews while o2 takes one of its units, from two
    stores (two connection pools) at once: either the renewal wins and nothing is taken,
    or the take wins and the renewal fails. Both winning would leave two hosts acting
    for the unit."""
    first, second = await metadata_backend.open(), await metadata_backend.open()
    s1, s2 = await _session(first, "o1"), await _session(first, "o2")
    outcomes = set()
    for i in range(20):
        unit = f"group:q/g/race{i}"
        assert await first.take_units([unit], "o1", s1, 0)  # held, and expired at once
        renewed, taken = await asyncio.gather(
            first.renew_host_lease("o1", s1, 30), second.take_units([unit], "o2", s2, 30)
        )
        assert taken is not None
        assert not (renewed and taken), (i, renewed, taken)
        outcomes.add(bool(renewed))
        if not renewed:  # o1 lost its session: it begins again, as an output host does
            s1 = await _session(first, "o1")
    assert outcomes  # which wins depends on the timing; never both


async def test_fenced_levels_of_many_units_in_one_write_skip_the_stale_fences(
    meta: MetadataStore,
) -> None:
    """An output host's flush writes the levels of every unit it holds in one call: the
    units whose lease moved on are refused (their levels not written), the others land,
    and a level never moves backward there either."""
    await meta.insert_queue(Queue(name="q", config=QueueConfig(), created_at=time.time()))
    s1 = await _session(meta, "o1")
    old = await meta.take_units([A, B], "o1", s1, 0)
    assert old is not None
    s2 = await _session(meta, "o2")
    new = await meta.take_units([B], "o2", s2, 30)  # B moved to o2; A is still o1's epoch
    assert new == {B: old[B] + 1}

    def level(extent: str, acked: int) -> AckLevel:
        return AckLevel(queue="q", group="g", extent=extent, level=bytes([acked]), acked=acked)

    refused = await meta.put_fenced_ack_levels([
        (Fence(lease=A, epoch=old[A]), [level("e1", 3)]),
        (Fence(lease=B, epoch=old[B]), [level("e2", 7)]),  # o1's stale fence of B
    ])  # fmt: skip
    assert refused == {Fence(lease=B, epoch=old[B])}
    assert {a.extent: a.acked for a in await meta.get_ack_levels("q", "g")} == {"e1": 3}
    refused = await meta.put_fenced_ack_levels([
        (Fence(lease=A, epoch=old[A]), [level("e1", 2)]),  # behind: stays at 3
        (Fence(lease=B, epoch=new[B]), [level("e2", 7)]),
        (Fence(lease="group:q/g/nobody", epoch=1), [level("e9", 1)]),  # no such lease
    ])  # fmt: skip
    assert refused == {Fence(lease="group:q/g/nobody", epoch=1)}
    levels = await meta.get_ack_levels("q", "g")
    assert {a.extent: (a.acked, a.level) for a in levels} == {
        "e1": (3, b"\x03"), "e2": (7, b"\x07"),
    }  # fmt: skip
    assert await meta.put_fenced_ack_levels([]) == set()
