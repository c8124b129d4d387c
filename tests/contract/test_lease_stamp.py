"""The lease stamp contract (``MetadataStore.lease_stamp``), for every MetadataStore: a
row per host lease that changes with every take, release, new or ended session and
lapse, and not with a renewal, so that an idle output host can skip reading every
unit's lease (outputhost/hostlease.py). A ttl of 0 makes a lease that has expired by
the next call."""

from __future__ import annotations

from cherami.metadata.base import MetadataStore
from cherami.metadata.hostleases import lease_stamp_pending

A, B, C = "group:q/g/e1", "group:q/g/e2", "group:q/g/e3"


async def test_the_stamp_changes_with_what_the_holders_depend_on(meta: MetadataStore) -> None:
    assert await meta.lease_stamp() == ()
    s1 = await meta.begin_host_lease("o1", 30)
    assert s1 is not None
    begun = await meta.lease_stamp()
    assert [row[0] for row in begun] == ["o1"] and not lease_stamp_pending(begun)
    assert await meta.renew_host_lease("o1", s1, 30)
    assert await meta.lease_stamp() == begun  # a renewal moves nothing
    assert await meta.take_units([A, B], "o1", s1, 30) == {A: 1, B: 1}
    took = await meta.lease_stamp()
    assert took != begun
    assert await meta.take_units([A], "o1", s1, 30) is not None
    assert await meta.renew_host_lease("o1", s1, 30)
    again = await meta.lease_stamp()
    assert again not in (begun, took)  # a take of its own counts too
    s2 = await meta.begin_host_lease("o2", 30)
    assert s2 is not None
    two = await meta.lease_stamp()
    assert [row[0] for row in two] == ["o1", "o2"] and two[0] == again[0]
    assert await meta.renew_host_lease("o1", s1, 0)  # lapses: A and B are no one's
    lapsed = await meta.lease_stamp()
    assert lapsed[0] != two[0] and lapsed[1] == two[1]
    assert await meta.take_units([A], "o2", s2, 30) == {A: 2}  # ends o1's session
    ended = await meta.lease_stamp()
    assert ended[0] != lapsed[0] and ended[1] != lapsed[1]


async def test_a_release_is_pending_until_the_unit_s_own_lease_ends(meta: MetadataStore) -> None:
    s1 = await meta.begin_host_lease("o1", 30)
    assert s1 is not None and await meta.take_units([A, B], "o1", s1, 30) is not None
    held = await meta.lease_stamp()
    await meta.release_units([A], "o1", s1)
    released = await meta.lease_stamp()
    assert released != held and lease_stamp_pending(released)
    assert await meta.lease_holders("group:") == {A: "o1", B: "o1"}  # until it ends
    s2 = await meta.begin_host_lease("o2", 30)
    assert s2 is not None and await meta.take_units([C], "o2", s2, 30) is not None
    assert await meta.renew_host_lease("o2", s2, 0)
    await meta.release_units([C], "o2", s2)  # ends with the host lease, now
    stamp = await meta.lease_stamp()
    assert lease_stamp_pending(stamp[:1]) and not lease_stamp_pending(stamp[1:])
    assert await meta.lease_holders("group:") == {A: "o1", B: "o1"}
