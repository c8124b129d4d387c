"""How a leading controller replaces the extents of lost hosts (no I/O): after a power
loss every queue needs new extents, opened TENDS_AT_ONCE queues at a time (one queue
after another, 2,100 extents took 23 s to open), the rest left to the next tick once
the lease may have run out, and one line says what was sealed and opened, and how long
it took."""

from __future__ import annotations

import asyncio
import logging
import math
from types import SimpleNamespace
from typing import Any

import pytest

from cherami.context import ProcessContext
from cherami.errors import Unavailable
from cherami.metadata.models import OPEN, Extent, Fence, Queue, QueueConfig
from cherami.roles.controller.leader import LEASE_TTL, MARGIN, TENDS_AT_ONCE, Leader


class _Controller:
    """ensure_extents, recording how many run at once."""

    def __init__(self, stop_after: int = -1) -> None:
        self.running = self.most = 0
        self.opened: list[str] = []
        self.stop_after = stop_after  # the leader's lease runs out after so many
        self.leader: Leader | None = None
        self.fence = Fence(lease="controller-leader", epoch=7)

    async def ensure_extents(self, name: str, patience: float = 10.0) -> int:
        self.running += 1
        self.most = max(self.most, self.running)
        for _ in range(3):  # an open's round trips: the others run meanwhile
            await asyncio.sleep(0)
        self.running -= 1
        self.opened.append(name)
        if len(self.opened) == self.stop_after and self.leader is not None:
            self.leader._acting_until = 0.0
        return 2  # a plain extent and its timer extent


class _Leases:
    """The metadata store's lease: renewed for the holder at ``epoch`` (None: taken)."""

    def __init__(self, epoch: int | None = 7) -> None:
        self.epoch = epoch
        self.asked = 0

    async def try_lease(self, name: str, holder: str, ttl: float) -> int | None:
        self.asked += 1
        return self.epoch


def _leader(
    controller: _Controller, names: list[str], leases: _Leases | None = None,
    now: list[float] | None = None,
) -> Leader:  # fmt: skip
    """A leader whose clock is ``now[0]`` (advanced by the test, never slept for)."""
    stores: Any = SimpleNamespace(stores=None)
    clock = now if now is not None else [100.0]
    ctx = ProcessContext(clock=lambda: clock[0])
    leader = Leader(controller, leases or _Leases(None), "c", stores, ctx=ctx)  # type: ignore[arg-type]
    leader._queues = {
        n: Queue(name=n, config=QueueConfig(replicas=1, min_extents=1), created_at=0.0)
        for n in names
    }
    leader.leading, leader._acting_until = True, math.inf
    controller.leader = leader
    return leader


async def test_queues_open_their_extents_several_at_a_time() -> None:
    names = [f"q{i}" for i in range(3 * TENDS_AT_ONCE)]
    controller = _Controller()
    leader = _leader(controller, names)
    leader._replacing = (leader.clock(), 0, 0)
    await leader._tend_all(names, {n: [] for n in names}, True, {})
    assert sorted(controller.opened) == sorted(names)
    assert controller.most == TENDS_AT_ONCE
    assert not leader._again and leader._replacing[1:] == (0, 2 * len(names))


async def test_once_the_lease_may_have_run_out_the_rest_wait_for_the_next_tick(
    caplog: pytest.LogCaptureFixture,
) -> None:
    names = [f"q{i}" for i in range(3 * TENDS_AT_ONCE)]
    controller = _Controller(stop_after=TENDS_AT_ONCE + 1)
    leader = _leader(controller, names)
    with caplog.at_level(logging.INFO, logger="cherami.controller.leader"):
        await leader._tend_all(names, {n: [] for n in names}, True, {})
    assert set(controller.opened) | leader._again == set(names)
    assert len(controller.opened) < len(names) and not set(controller.opened) & leader._again
    assert caplog.text.count("stops acting") == 1


async def test_a_long_tick_renews_the_lease_and_opens_every_queue() -> None:
    """The acting window nears its end while queues still open extents: the tick renews
    the lease once (the same epoch: still the leader) and goes on with every queue."""
    names = [f"q{i}" for i in range(3 * TENDS_AT_ONCE)]
    controller, leases, now = _Controller(), _Leases(epoch=7), [100.0]
    leader = _leader(controller, names, leases, now)
    leader._acting_until = leader.clock() + 0.5  # within RENEW_WITHIN of its end
    await leader._tend_all(names, {n: [] for n in names}, True, {})
    assert sorted(controller.opened) == sorted(names) and not leader._again
    assert leases.asked == 1 and leader.acting()
    # renewed when asked (its clock stood at 100): it acts until the lease less the margin
    now[0] = 100.0 + LEASE_TTL - MARGIN - 0.01
    assert leader.acting()
    now[0] += 0.02
    assert not leader.acting()


async def test_a_tick_waiting_on_one_slow_call_keeps_the_lead() -> None:
    """A tick that waits on one call longer than the acting window (a seal, a read, one
    queue's opens on a loaded machine) renews the lease meanwhile: renewed only between
    queues, it ran out and the lead changed hands while a store host's extents were
    being replaced."""
    controller, leases = _Controller(), _Leases(epoch=7)
    leader = _leader(controller, [], leases)
    leader._acting_until = leader.clock() + 0.3  # within RENEW_WITHIN of its end

    async def slow_call() -> None:  # answers once the lease was renewed, or times out
        async with asyncio.timeout(10):
            while not leases.asked:
                await asyncio.sleep(0.01)

    await leader._keeping_lease(slow_call())
    assert leases.asked >= 1 and leader.acting()


async def test_one_line_says_what_was_replaced_once_every_queue_is_settled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    leader = _leader(_Controller(), [], now=now)
    leader._replacing = (now[0], 0, 0)
    leader._count(sealed=3)
    leader._count(opened=2)
    leader._again.add("q1")  # not settled yet: no line
    with caplog.at_level(logging.INFO, logger="cherami.controller.leader"):
        leader._replaced()
        assert "replaced" not in caplog.text
        leader._again.clear()
        leader._count(opened=1)
        now[0] += 2.5
        leader._replaced()
        leader._replaced()  # once
    assert caplog.text.count("replaced the extents of lost hosts") == 1
    assert "3 sealed, 3 opened in 2.5 s" in caplog.text
    assert leader._replacing is None


async def test_an_extent_no_seal_reached_is_sealed_once_its_hosts_are_back() -> None:
    """Every store host SIGKILLed and back within a few seconds: the leader's seals
    reached no replica, and once the hosts were alive again it kept the extents open.
    A store host back from a power loss knows no commit point of an open extent, so
    what was published before stayed unseen until the next append to it, which an
    idle extent never gets (376 of 400 deliveries not made in 60 s)."""
    controller = _Controller()
    sealed: list[str] = []

    async def seal_extent(extent: Extent) -> int:
        if not sealed and extent.id == "e1" and controller.running == 0:
            controller.running = -1  # the first try: every store host is down
            raise Unavailable("no replica of extent e1 is reachable")
        sealed.append(extent.id)
        return 1

    controller.seal_extent = seal_extent  # type: ignore[attr-defined]
    leader = _leader(controller, ["q"])
    extent = Extent(id="e1", queue="q", kind="plain", status=OPEN, input_host="in",
                    stores=["s1"], created_at=0.0)  # fmt: skip
    assert leader._healthy("q", [extent], {"in"}, set()) == []  # its store host is dead
    await leader._seal(extent)
    assert not sealed
    # back: alive again, but still owed its seal
    assert leader._healthy("q", [extent], {"in"}, {"s1"}) == []
    await leader._seal(extent)
    assert sealed == ["e1"] and leader._healthy("q", [extent], {"in"}, {"s1"}) == [extent]
