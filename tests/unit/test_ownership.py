"""How output hosts share a group's extents (ownership.py), on a real SQLite metadata
store: fair shares per kind of extent, no unit left to nobody, and a host that comes
back gets its share again."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from cherami import timing
from cherami.context import ProcessContext
from cherami.errors import Unavailable
from cherami.metadata.models import (
    CONSUMED,
    FAILING,
    OPEN,
    SEALED,
    STREAM,
    AckLevel,
    Extent,
    Group,
    GroupConfig,
    Host,
    Queue,
    QueueConfig,
)
from cherami.metadata.sqlite import SqliteMetadataStore
from cherami.roles.outputhost import catalog, hostlease, ownership
from cherami.roles.outputhost.ownership import ExtentOwnership, Unit
from cherami.wire.store import PLAIN, TIMER


class _Outputs:
    """What ownership tells the output host, recorded."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    async def took(self, queue: str, group: str) -> None:
        self.events.append(("took", (queue, group)))

    def dropped(self, queue: str, group: str, extent: str) -> None:
        self.events.append(("dropped", extent))

    async def unload(self, queue: str, group: str, close_code: int) -> None:
        self.events.append(("unload", (queue, group)))


@pytest.fixture
async def meta(tmp_path: Path) -> Any:
    store = SqliteMetadataStore(str(tmp_path / "meta.db"), clock=_Clock())  # leases' clock
    yield store
    await store.close()


async def _queue(meta: SqliteMetadataStore, name: str, groups: list[str], kinds: list[str]) -> None:
    await meta.insert_queue(Queue(name=name, config=QueueConfig(), created_at=time.time()))
    now = time.time()
    for g in groups:
        dlq = f"{name}.{g}.dlq"
        group = Group(queue=name, name=g, config=GroupConfig(), created_at=now, start_ms=0, dlq=dlq)
        await meta.insert_group(group)
    for i, kind in enumerate(kinds):
        extent = Extent(id=f"{name}-e{i}", queue=name, kind=kind, status=OPEN, input_host="in",
                        stores=["s"], created_at=now)  # fmt: skip
        await meta.insert_extent(extent)


async def _alive(meta: SqliteMetadataStore, *hosts: str) -> None:
    for h in hosts:
        await meta.heartbeat(Host(id=h, role="outputhost", address=h, heartbeat_at=time.time()))


# how far the store's clock moves in a round of ticks: a short lease (0.4 s) left
# unrenewed runs out in four rounds, one renewed every round never does
STORE_STEP = 0.1


class _Clock:
    """A host's monotonic clock, advanced by the test (ExtentOwnership's ``clock``)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _host(
    meta: SqliteMetadataStore, name: str, t: timing.Timing = timing.DEFAULT
) -> ExtentOwnership:
    ctx = ProcessContext(timing=t, clock=_Clock())
    return ExtentOwnership(_Outputs(), meta, name, ctx)  # type: ignore[arg-type]


async def _ticks(hosts: list[ExtentOwnership], meta: SqliteMetadataStore, n: int) -> None:
    """``n`` ownership ticks of each host, each host's clock one tick on between them;
    the store's clock (what its leases expire by) STORE_STEP on."""
    for _ in range(n):
        await _alive(meta, *(h.id for h in hosts))
        for h in hosts:
            await h.tick()
        for h in hosts:
            h.clock.now += h.timing.ownership_tick  # type: ignore[attr-defined]
        meta.clock.now += STORE_STEP  # type: ignore[attr-defined]


def _held(*hosts: ExtentOwnership) -> dict[Unit, str]:
    out: dict[Unit, str] = {}
    for h in hosts:
        for unit in h.held:
            assert unit not in out, f"{unit} held by {out[unit]} and {h.id}"
            out[unit] = h.id
    return out


async def test_each_host_gets_its_share_of_each_kind(meta: SqliteMetadataStore) -> None:
    await _queue(meta, "q", ["g"], [PLAIN, PLAIN, TIMER, TIMER])
    a, b = _host(meta, "outputhost-a"), _host(meta, "outputhost-b")
    await _alive(meta, a.id, b.id)
    await _ticks([a, b], meta, 2)
    held = _held(a, b)
    assert len(held) == 4
    for host in (a, b):  # one plain and one timer extent each
        assert sorted(u[2] for u in host.held) in (["q-e0", "q-e2"], ["q-e0", "q-e3"],
                                                   ["q-e1", "q-e2"], ["q-e1", "q-e3"])  # fmt: skip
    assert a.owns("q", "g") and b.owns("q", "g")
    assert a.acting("q", "g", next(iter(a.held))[2])
    assert a.fence("q", "g", "nope") is None


async def test_a_refused_write_stops_acting_at_once_and_the_next_tick_says_why(
    meta: SqliteMetadataStore,
) -> None:
    """The output host tells ownership of a write refused under a unit's fence (it no
    longer stamps a flag on its own cursors): the unit stops acting and has no fence
    at once; the next tick finds the lease taken and drops the unit."""
    await _queue(meta, "q", ["g"], [PLAIN])
    a = _host(meta, "outputhost-a")
    await _ticks([a], meta, 1)
    (unit,) = a.held
    assert a.acting(*unit) and a.fence(*unit) is not None
    lease = ownership.unit_lease(*unit)
    assert a.lease.session is not None  # its host lease runs out in the store
    await meta.renew_host_lease("outputhost-a", a.lease.session, 0.0)
    meta.clock.now += 0.01  # type: ignore[attr-defined]
    b = await meta.begin_host_lease("outputhost-b", timing.DEFAULT.lease_ttl)
    assert b is not None and await meta.take_units([lease], "outputhost-b", b, 3.0)
    a.fenced(*unit)
    assert not a.acting(*unit) and a.fence(*unit) is None
    await a.tick()
    assert unit not in a.held and ("unload", ("q", "g")) in a.outputs.events  # type: ignore[attr-defined]


async def test_no_unit_is_left_to_nobody(meta: SqliteMetadataStore) -> None:
    # shares per group and over all units could leave one unit to nobody: 1 + 1 + 2
    # units over 2 hosts, the first host filling its total share with the small groups
    await _queue(meta, "x", ["g"], [PLAIN])
    await _queue(meta, "y", ["g"], [PLAIN])
    await _queue(meta, "z", ["g"], [PLAIN, PLAIN])
    a, b = _host(meta, "outputhost-a"), _host(meta, "outputhost-b")
    await _ticks([a, b], meta, 2)
    # by the shares alone: the host that filled its total share with the small groups is
    # below its floor share of z, so it takes one of z's all the same
    assert len(_held(a, b)) == 4
    assert all(sum(u[0] == "z" for u in h.held) == 1 for h in (a, b))


async def test_a_unit_unheld_for_long_is_taken_whatever_the_shares(
    meta: SqliteMetadataStore,
) -> None:
    for name in ("x", "y", "z"):
        await _queue(meta, name, ["g"], [PLAIN])
    a, b = _host(meta, "outputhost-a"), _host(meta, "outputhost-b")
    b._taking_after = float("inf")  # alive, but taking nothing (as after an outage)
    await _ticks([a, b], meta, 2)
    assert len(a.held) == 2 and not b.held  # a's total share
    await _ticks([a, b], meta, 1)
    assert len(a.held) == 3 and not b.held  # left unheld for two ticks: taken all the same


async def test_orphans_are_timed_by_this_processs_tick_not_the_default(
    meta: SqliteMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A unit is orphaned after two of the configured ownership ticks (it was two of the
    default 0.5 s ticks whatever the configuration said)."""
    slow = msgspec.structs.replace(timing.DEFAULT, ownership_tick=2.0, lease_ttl=10.0)
    for name in ("x", "y", "z"):
        await _queue(meta, name, ["g"], [PLAIN])
    a, b = _host(meta, "outputhost-a", slow), _host(meta, "outputhost-b", slow)
    b._taking_after = float("inf")
    await _ticks([a, b], meta, 1)  # at 1000: z unheld from then on
    assert len(a.held) == 2
    a.clock.now = 1003.5  # type: ignore[attr-defined]  # seven default ticks, under two of its own
    await a.tick()
    assert len(a.held) == 2
    a.clock.now = 1004.0  # type: ignore[attr-defined]
    await a.tick()
    assert len(a.held) == 3


async def test_a_host_that_comes_back_gets_its_share(
    meta: SqliteMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    short = msgspec.structs.replace(timing.DEFAULT, lease_ttl=0.4, lease_margin=0.1)
    await _queue(meta, "q", ["g"], [PLAIN, PLAIN])
    a, b = _host(meta, "outputhost-a", short), _host(meta, "outputhost-b", short)
    await _ticks([a], meta, 2)  # b is not alive yet: a holds both
    assert len(a.held) == 2
    await _ticks([a, b], meta, 1)  # b is alive: a hands one over
    assert len(a.held) == 1 and not b.held
    assert ("dropped", "q-e1") in a.outputs.events  # type: ignore[attr-defined]
    meta.clock.now += 0.5  # type: ignore[attr-defined]  # its lease runs out; then b takes it
    await _ticks([a, b], meta, 3)
    held = _held(a, b)
    assert len(held) == 2 and len(a.held) == 1 and len(b.held) == 1
    await _ticks([a, b], meta, 3)  # and that is stable
    assert _held(a, b) == held


async def test_merged_dead_letters_are_units_and_cp_groups_are_whole(
    meta: SqliteMetadataStore,
) -> None:
    await _queue(meta, "q", ["g"], [PLAIN])
    await _queue(meta, "q.g.dlq", [], [PLAIN])  # the group's DLQ, one extent
    level = AckLevel(queue="q", group="g", extent="q.g.dlq-e0", limit=b"\x05")
    await meta.put_ack_levels([level])  # a range of it merged back into the group
    cp = Queue(name="c", config=QueueConfig(type="cp"), created_at=time.time())
    await meta.insert_queue(cp)
    await meta.insert_group(Group(queue="c", name="g", config=GroupConfig(),
                                  created_at=time.time(), start_ms=0, dlq="c.g.dlq"))  # fmt: skip
    a = _host(meta, "outputhost-a")
    await _ticks([a], meta, 1)
    assert set(a.held) == {("q", "g", "q-e0"), ("q", "g", "q.g.dlq-e0"), ("c", "g", "*")}
    assert a.holds("c", "g", "any-extent") and a.fence("c", "g", "x") is not None


async def test_a_keyed_queue_s_group_is_whole_once_its_extents_leases_end(
    meta: SqliteMetadataStore,
) -> None:
    """A queue marked keyed (its first keyed message) has each group served whole by one
    host; the WHOLE unit is taken only once every lease of the group's extents has
    ended, so no two hosts act for an extent at once (before: per extent for good)."""
    short = msgspec.structs.replace(timing.DEFAULT, lease_ttl=0.4, lease_margin=0.1)
    await _queue(meta, "q", ["g"], [PLAIN, PLAIN])
    a, b = _host(meta, "outputhost-a", short), _host(meta, "outputhost-b", short)
    await _ticks([a, b], meta, 3)
    assert sorted(u[2] for u in _held(a, b)) == ["q-e0", "q-e1"] and a.held and b.held
    await meta.mark_queue("q", "keyed")
    whole = ("q", "g", ownership.WHOLE)
    for _ in range(12):
        await _ticks([a, b], meta, 1)
        held = await meta.lease_holders(ownership.group_leases("q", "g"))
        if any(h.holds(*whole) for h in (a, b)):
            assert list(held) == [ownership.unit_lease(*whole)], held
        else:
            assert ownership.unit_lease(*whole) not in held
    assert list(_held(a, b)) == [whole]
    assert sum(("unload", ("q", "g")) in h.outputs.events for h in (a, b)) == 2  # type: ignore[attr-defined]


class _Peers:
    """The answers of a host's peers, as the outage watch would get them."""

    def __init__(self, answers: dict[str, bool]) -> None:
        self.answers = answers

    async def ask(self, address: str) -> bool:
        return self.answers[address]


async def _failing_tick(host: ExtentOwnership) -> None:
    """A tick that cannot reach the metadata store."""

    async def unreachable() -> None:
        raise Unavailable("metadata store unreachable")

    real = host.tick
    host.tick = unreachable  # type: ignore[method-assign]
    with pytest.raises(Unavailable):
        await host._tick_noting_outages()
    host.tick = real  # type: ignore[method-assign]


async def test_outage_acting_goes_on_only_on_every_peers_word(
    meta: SqliteMetadataStore,
) -> None:
    await _queue(meta, "q", ["g"], [PLAIN, PLAIN])
    a, b = _host(meta, "outputhost-a"), _host(meta, "outputhost-b")
    await _ticks([a, b], meta, 2)
    assert a.peers == {"outputhost-b": "outputhost-b"} and len(a.held) == 1
    unit = next(iter(a.held))
    await _failing_tick(a)
    assert a.store_unreachable() and not a.riding_out()

    peers = _Peers({"outputhost-b": False})  # b reaches the store: a stops with its lease
    a.outage._ask = peers.ask  # type: ignore[method-assign]
    until = a.held[unit].acting_until
    await a.outage.check()
    assert a.held[unit].acting_until == until and not a.riding_out()

    peers.answers["outputhost-b"] = True  # nobody reaches it: acting goes on
    until = a.held[unit].acting_until = a.clock() + 0.2  # its lease's last moments
    await a.outage.check()
    extended = a.held[unit].acting_until
    assert extended > until and a.riding_out()
    assert extended <= a.clock() + timing.DEFAULT.recovery_grace - timing.DEFAULT.lease_margin

    a.held[unit].acting_until = a.clock() - 0.01  # a window that ran out
    await a.outage.check()  # is never extended: the unit may have been taken meanwhile
    assert not a.acting(*unit)


async def test_telling_a_peer_the_store_is_unreachable_binds_the_teller(
    meta: SqliteMetadataStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A peer acts on for recovery_grace on this host's "unreachable", so this host takes
    nothing for that long from its answer, even when its tick then ends with no call
    having waited past slow_tick (a call asked after the stall answered first: CI saw a
    cut host act on with no slow tick logged by its peer)."""
    await _queue(meta, "q", ["g"], [PLAIN])
    a = _host(meta, "outputhost-a")
    await _alive(meta, a.id)
    a._taking_after = 0.0
    assert a.answer_peer() is False  # reachable: no promise, takes as usual
    a._tick_started = a.clock()  # a tick under way, a call waiting past slow_tick
    a._asking[object()] = a.clock() - timing.DEFAULT.slow_tick - 0.1
    with caplog.at_level("INFO", logger="cherami.outputhost.ownership"):
        assert a.answer_peer() is True
    assert "told a peer the metadata store is unreachable" in caplog.text
    a._asking.clear()  # the stall ends unrecorded: the tick is not slow
    a._tick_started = None
    await a._tick_noting_outages()
    assert not a.held and a._taking_after == 0.0  # not slow, yet takes nothing: its word
    a._vouched_until = a.clock()  # the promise has run out
    await a._tick_noting_outages()
    assert len(a.held) == 1


async def test_every_peers_word_with_every_window_run_out_is_no_acting_on(
    meta: SqliteMetadataStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A host cut off alone may hear "unreachable" from a peer whose tick is merely slow
    (it takes nothing then either) after its own windows ran out: it has nothing to act
    for, and neither acts nor says it does."""
    await _queue(meta, "q", ["g"], [PLAIN, PLAIN])
    a, b = _host(meta, "outputhost-a"), _host(meta, "outputhost-b")
    await _ticks([a, b], meta, 2)
    unit = next(iter(a.held))
    await _failing_tick(a)
    a.held[unit].acting_until = a.clock() - 0.01
    a.outage._ask = _Peers({"outputhost-b": True}).ask  # type: ignore[method-assign]
    with caplog.at_level("INFO", logger="cherami.outputhost.outage"):
        await a.outage.check()
    assert not a.outage.riding and not a.acting(*unit)
    assert "acting on for" not in caplog.text


async def test_no_taking_while_a_tick_is_slow_or_after_an_outage(
    meta: SqliteMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _queue(meta, "q", ["g"], [PLAIN])
    a = _host(meta, "outputhost-a")
    await _alive(meta, a.id)
    await _failing_tick(a)
    await a._tick_noting_outages()  # reaches the store again: renews only, for a while
    assert not a.held and not a.store_unreachable()
    every_tick_slow = msgspec.structs.replace(timing.DEFAULT, slow_tick=-1.0)
    a.timing = every_tick_slow  # slow from its start
    a._taking_after = 0.0
    await a._tick_noting_outages()
    assert not a.held  # a slow tick may be one that waited out an outage: takes nothing
    a.timing = timing.DEFAULT
    a._taking_after = 0.0
    await a._tick_noting_outages()
    assert len(a.held) == 1


class _Loaded:
    """The metadata store seen from a loaded machine: each call takes ``each`` seconds
    of the host's clock."""

    def __init__(self, meta: SqliteMetadataStore, clock: _Clock, each: float) -> None:
        self.meta, self.clock, self.each = meta, clock, each

    def __getattr__(self, name: str) -> Any:
        call = getattr(self.meta, name)

        async def timed(*args: Any, **kwargs: Any) -> Any:
            result = await call(*args, **kwargs)
            self.clock.now += self.each
            return result

        return timed


@pytest.mark.parametrize(("each", "takes"), [(0.2, 4), (1.5, 0)])
async def test_many_quick_calls_are_no_outage_one_slow_call_is(
    meta: SqliteMetadataStore, each: float, takes: int
) -> None:
    """After a power loss the change log names every queue and a tick reads each one:
    many quick calls, 1-4 s in all on a loaded machine. A tick that long counted as an
    outage: the host took nothing, tick after tick, while the leader reopened every
    queue's extents, and their messages were not delivered for a minute (the cluster's
    power-loss restart). One call waiting past timing.slow_tick is still one."""
    for i in range(4):
        await _queue(meta, f"q{i}", ["g"], [PLAIN])
    clock = _Clock()
    loaded = _Loaded(meta, clock, each)
    a = ExtentOwnership(_Outputs(), loaded, "outputhost-a", ProcessContext(clock=clock))  # type: ignore[arg-type]
    await _alive(meta, a.id)
    a._taking_after = 0.0  # past its start's grace
    started = clock.now
    await a._tick_noting_outages()
    assert clock.now - started > timing.DEFAULT.slow_tick  # the tick took that long
    assert len(a.held) == takes
    assert a._taking_after == (0.0 if takes else clock.now + timing.DEFAULT.recovery_grace)


async def _successors(meta: SqliteMetadataStore, n: int) -> None:
    """The queue's ``n`` successors, as the leader opens them after a power loss."""
    for i in range(n):
        extent = Extent(id=f"q-n{i}", queue="q", kind=PLAIN, status=OPEN, input_host="in",
                        stores=["s"], created_at=time.time())  # fmt: skip
        await meta.insert_extent(extent)


async def test_a_tick_takes_many_units_in_one_call(meta: SqliteMetadataStore) -> None:
    """After a power loss a tick takes hundreds of units: a lease call each took 15-25 s
    for 400 on a loaded machine, and the groups read none of them until the tick's end
    (the cluster's power-loss and store-host rounds missed their 30 s bound)."""
    await _queue(meta, "q", ["g"], [PLAIN])
    await _successors(meta, 30)
    calls: list[int] = []
    take = meta.take_units

    async def counting(names: list[str], *args: Any) -> dict[str, int] | None:
        calls.append(len(names))
        return await take(names, *args)

    patched = _Patched(meta, take_units=counting)
    a = ExtentOwnership(_Outputs(), patched, "outputhost-a", ProcessContext(clock=_Clock()))  # type: ignore[arg-type]
    await _alive(meta, a.id)
    a._taking_after = 0.0
    await a.tick()
    assert len(a.held) == 31 and calls == [31]  # q-e0 and the 30 successors: one call


class _Crowded:
    """The metadata store of a loaded machine with many calls under way: each answer
    comes 0.6 s of the host's clock after the last, and list_groups('q0') waits until
    the other queues' have answered (as a call waits for a connection of the pool)."""

    def __init__(self, meta: SqliteMetadataStore, clock: _Clock) -> None:
        self.meta, self.clock, self.others = meta, clock, 0

    def __getattr__(self, name: str) -> Any:
        call = getattr(self.meta, name)

        async def timed(*args: Any, **kwargs: Any) -> Any:
            last = name == "list_groups" and args[0] == "q0"
            async with asyncio.timeout(10):
                while last and self.others < 3:
                    await asyncio.sleep(0)
            result = await call(*args, **kwargs)
            self.clock.now += 0.6
            self.others += name == "list_groups"
            return result

        return timed


async def test_a_call_that_waits_while_others_answer_is_no_outage(
    meta: SqliteMetadataStore,
) -> None:
    """At 1,000 queues after a power loss a tick makes thousands of calls, 8 at a time;
    on a loaded machine one of them waiting past timing.slow_tick (for a connection,
    while the others answer) counted as an outage: the host took nothing, tick after
    tick, and not one successor was taken in 4 minutes. A store that answers is not
    out: only a wait with no call answered is."""
    for i in range(4):
        await _queue(meta, f"q{i}", ["g"], [PLAIN])
    clock = _Clock()
    a = ExtentOwnership(
        _Outputs(), _Crowded(meta, clock), "outputhost-a", ProcessContext(clock=clock)
    )  # type: ignore[arg-type]
    await _alive(meta, a.id)
    a._taking_after = 0.0
    await a._tick_noting_outages()
    assert len(a.held) == 4 and a._taking_after == 0.0


async def test_units_held_keep_acting_while_a_tick_takes_many(
    meta: SqliteMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The units a host held before a tick that takes many (TAKES_AT_ONCE a call) are
    renewed as their windows near their end, not only at the tick's end (they stopped
    acting meanwhile: acks refused, nothing delivered)."""
    await _queue(meta, "q", ["g"], [PLAIN])
    clock = _Clock()
    loaded = _Loaded(meta, clock, 0.0)
    a = ExtentOwnership(_Outputs(), loaded, "outputhost-a", ProcessContext(clock=clock))  # type: ignore[arg-type]
    await _alive(meta, a.id)
    a._taking_after = 0.0
    await a.tick()
    old = next(iter(a.held))
    await _successors(meta, 30)
    acting: list[bool] = []
    take = meta.take_units

    async def noting(names: list[str], *args: Any) -> dict[str, int] | None:
        acting.append(a.acting(*old))
        return await take(names, *args)

    monkeypatch.setattr(ownership, "TAKES_AT_ONCE", 1)  # a call a unit, as before
    loaded.each = 0.2  # each call 0.2 s: 30 takes are 6 s, past the 2.5 s acting window
    loaded.meta = _Patched(meta, take_units=noting)  # type: ignore[assignment]
    await _alive(meta, a.id)
    await a.tick()
    assert len(a.held) == 31 and len(acting) == 30
    assert all(acting)


async def test_units_keep_acting_while_a_tick_loads_the_groups_it_took(
    meta: SqliteMetadataStore,
) -> None:
    """A tick that loads the groups it took (after a restart of the output host, 200
    of them in 25 s at load 22) renews the units it holds meanwhile: renewed before
    the loads, they stopped acting during them (acks refused, nothing delivered)."""
    await _queue(meta, "q", ["g"], [PLAIN])
    clock = _Clock()
    outputs = _Outputs()
    a = ExtentOwnership(outputs, meta, "outputhost-a", ProcessContext(clock=clock))  # type: ignore[arg-type]
    await _alive(meta, a.id)
    a._taking_after = 0.0
    await a._tick_noting_outages()
    old = next(iter(a.held))
    await _successors(meta, 1)
    renewed: list[float] = []

    async def took(queue: str, group: str) -> None:  # a load that outlasts the window
        clock.now += timing.DEFAULT.lease_ttl - timing.DEFAULT.lease_margin
        async with asyncio.timeout(10):
            while a.held[old].acting_until <= clock.now:
                await asyncio.sleep(0.01)
        renewed.append(a.held[old].acting_until)

    outputs.took = took  # type: ignore[method-assign]
    await _alive(meta, a.id)
    await a._tick_noting_outages()
    assert renewed and a.acting(*old) and len(a.held) == 2


async def test_the_groups_of_a_call_load_before_the_next_call_takes(
    meta: SqliteMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a power loss at 1,000 queues a tick took 8,000 units in calls of
    TAKES_AT_ONCE, some of them waiting tens of seconds on the metadata store, and the
    groups of the units taken loaded only at the tick's end: none of them delivered
    meanwhile. Each call's groups load while the tick goes on."""
    for i in range(4):
        await _queue(meta, f"q{i}", ["g"], [PLAIN])
    outputs = _Outputs()
    take = meta.take_units
    calls = 0

    async def second_waits_for_loads(names: list[str], *args: Any) -> dict[str, int] | None:
        nonlocal calls
        calls += 1
        if calls > 1:  # a call that waits: the groups taken before it load meanwhile
            async with asyncio.timeout(5):
                while not any(e[0] == "took" for e in outputs.events):
                    await asyncio.sleep(0.01)
        return await take(names, *args)

    monkeypatch.setattr(ownership, "TAKES_AT_ONCE", 2)
    patched = _Patched(meta, take_units=second_waits_for_loads)
    a = ExtentOwnership(outputs, patched, "outputhost-a", ProcessContext(clock=_Clock()))  # type: ignore[arg-type]
    await _alive(meta, a.id)
    a._taking_after = 0.0
    await a.tick()
    assert calls == 2 and len(a.held) == 4
    assert sorted(e[1] for e in outputs.events if e[0] == "took") == [
        (f"q{i}", "g") for i in range(4)
    ]


class _Patched:
    """A store with some calls replaced."""

    def __init__(self, meta: SqliteMetadataStore, **calls: Any) -> None:
        self.meta, self.calls = meta, calls

    def __getattr__(self, name: str) -> Any:
        return self.calls.get(name) or getattr(self.meta, name)


async def test_an_only_output_host_does_not_act_on(meta: SqliteMetadataStore) -> None:
    await _queue(meta, "q", ["g"], [PLAIN])
    a = _host(meta, "outputhost-a")
    await _ticks([a], meta, 2)
    assert a.peers == {} and len(a.held) == 1
    unit = next(iter(a.held))
    await _failing_tick(a)
    until = a.held[unit].acting_until = a.clock() + 0.2
    await a.outage.check()  # nobody to ask: a host started to replace it may take over
    assert a.held[unit].acting_until == until and not a.riding_out()


async def test_kinds_split_between_hosts_are_rebalanced(
    meta: SqliteMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One host holding every plain extent and the other every timer extent have equal
    totals; the group's plain extents must still be shared. (A fresh group's units were
    taken that way while one host was in its start grace; the hand-over then waited for a
    host below its total share, which never came, and that host delivered nothing.)"""
    short = msgspec.structs.replace(timing.DEFAULT, lease_ttl=0.4, lease_margin=0.1)
    groups = ["g1", "g2", "g3"]
    await _queue(meta, "q", groups, [PLAIN, PLAIN])
    a, b = _host(meta, "outputhost-a", short), _host(meta, "outputhost-b", short)
    await _ticks([a], meta, 2)  # b is not alive yet: a holds every plain extent
    assert len(a.held) == 6
    now = time.time()
    for i in (2, 3):  # timer extents appear, and b takes them while a only renews
        await meta.insert_extent(Extent(id=f"q-e{i}", queue="q", kind=TIMER, status=OPEN,
                                        input_host="in", stores=["s"], created_at=now))  # fmt: skip
    a._taking_after = float("inf")
    for _ in range(20):
        if len(b.held) == 6:
            break
        await _ticks([a, b], meta, 1)
    assert {u[2] for u in b.held} == {"q-e2", "q-e3"} and len(a.held) == 6
    a._taking_after = 0.0

    def balanced() -> bool:
        held = _held(a, b)
        return len(held) == 12 and all(
            sorted(u[2] for u in host.held if u[1] == g) in (["q-e0", "q-e2"], ["q-e0", "q-e3"],
                                                             ["q-e1", "q-e2"], ["q-e1", "q-e3"])
            for host in (a, b) for g in groups
        )  # fmt: skip

    for _ in range(40):
        if balanced():
            break
        await _ticks([a, b], meta, 1)
    assert balanced(), {h.id: sorted(h.held) for h in (a, b)}


class _Counting:
    """A real metadata store that counts the catalog reads made of it."""

    CATALOG = ("list_queues", "get_queue", "list_groups", "list_extents", "take_units",
               "renew_host_lease", "lease_holders", "queues_with_extents", "groups_of")  # fmt: skip

    def __init__(self, store: SqliteMetadataStore, counted: tuple[str, ...] = CATALOG) -> None:
        self._store = store
        self.reads: list[str] = []
        self._counted = counted

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name in self._counted:

            async def counted(*args: Any, **kwargs: Any) -> Any:
                first = args[:1]
                if first and isinstance(first[0], set):  # in order: a set prints as it hashes
                    first = (sorted(first[0]),)
                self.reads.append(f"{name}{first}")
                return await attr(*args, **kwargs)

            return counted
        return attr


async def test_a_tick_reads_only_the_queues_that_changed(meta: SqliteMetadataStore) -> None:
    """The catalog is read whole once; then an idle tick reads none of it, and a change
    reads that queue alone (every tick listed every queue, and each queue's groups and
    extents: three queries per queue every half second), its rows in two calls."""
    for name in ("x", "y", "z"):
        await _queue(meta, name, ["g"], [PLAIN])
    counting = _Counting(meta)
    a = ExtentOwnership(_Outputs(), counting, "outputhost-a", ProcessContext(clock=_Clock()))  # type: ignore[arg-type]
    await _alive(meta, a.id)
    await a.tick()
    assert "list_queues()" in counting.reads and len(a.held) == 3
    counting.reads.clear()
    await a.tick()
    # idle: nothing of the catalog is read, and the units are renewed with the host
    # lease, one row (one statement per unit every tick before, a row a unit)
    assert counting.reads == ["lease_holders('group:',)", "renew_host_lease('outputhost-a',)"]
    counting.reads.clear()
    extent = Extent(id="y-e1", queue="y", kind=PLAIN, status=OPEN, input_host="in",
                    stores=["s"], created_at=time.time())  # fmt: skip
    await meta.insert_extent(extent)
    await a.tick()
    assert [r for r in counting.reads if not r.startswith("renew_host_lease")] == [
        "queues_with_extents(['y'],)", "groups_of(['y'],)", "lease_holders('group:',)",
        "take_units(['group:y/g/y-e1'],)",
    ]  # fmt: skip
    assert ("y", "g", "y-e1") in a.held
    counting.reads.clear()
    group = await meta.get_group("z", "g")
    await meta.delete_group("z", "g")
    await a.tick()
    assert not any(u[0] == "z" for u in a.held) and ("unload", ("z", "g")) in a.outputs.events  # type: ignore[attr-defined]
    catalog = [r for r in counting.reads if r.startswith(("list_", "get_", "queues_", "groups_"))]
    assert all("'x'" not in r and "'y'" not in r for r in catalog)
    assert group.dlq not in {u[0] for u in a.held}


async def test_settled_ticks_renew_one_row_and_read_no_lease(meta: SqliteMetadataStore) -> None:
    """Once every unit is held by a live host with the shares even, a tick whose catalog
    and live hosts have not changed renews the host lease alone: no read of every unit's
    lease (a row a unit: 42,000 rows a second at 1,000 queues on 3 hosts), and no write
    per unit, and no read of every lease every FULL_EVERY seconds either while the lease
    stamp (a row per host lease) has not changed. A full read comes back when the live
    hosts, the catalog or the stamp change (a host lease that lapsed, a take)."""
    for name in ("x", "y", "z"):
        await _queue(meta, name, ["g"], [PLAIN, PLAIN])
    counting = _Counting(meta)
    clock = _Clock()
    a = ExtentOwnership(_Outputs(), counting, "outputhost-a", ProcessContext(clock=clock))  # type: ignore[arg-type]
    b = _host(meta, "outputhost-b")
    b._taking_after = a._taking_after = 0.0
    await _ticks([a, b], meta, 3)
    assert len(_held(a, b)) == 6 and len(a.held) == 3
    counting.reads.clear()
    await _ticks([a, b], meta, 4)
    assert counting.reads == ["renew_host_lease('outputhost-a',)"] * 4
    counting.reads.clear()
    clock.now += 3 * hostlease.FULL_EVERY  # it read every lease every FULL_EVERY before
    await _ticks([a, b], meta, 2)
    assert counting.reads == ["renew_host_lease('outputhost-a',)"] * 2
    counting.reads.clear()
    session = b.lease.session
    assert session is not None and await meta.renew_host_lease(b.id, session, 0)  # lapses
    meta.clock.now += STORE_STEP  # type: ignore[attr-defined]
    await a.tick()  # b is still alive: the stamp tells its units are no one's now
    assert counting.reads[0] == "lease_holders('group:',)"
    await _ticks([b, a], meta, 3)  # b begins again and takes its share back
    assert len(b.held) == 3 and len(a.held) == 3
    counting.reads.clear()
    await _ticks([a, b], meta, 2)
    assert counting.reads == ["renew_host_lease('outputhost-a',)"] * 2
    counting.reads.clear()
    await _alive(meta, "outputhost-c")  # another output host: the shares change
    await a.tick()
    assert counting.reads[0] == "lease_holders('group:',)"


async def test_a_host_whose_lease_ended_drops_every_unit_and_begins_again(
    meta: SqliteMetadataStore,
) -> None:
    """A host that could not renew its host lease before it expired (a pause), and one of
    whose units another host took meanwhile, has lost every unit: its renewal fails, it
    stops acting for all of them at once and drops them, then begins a new session and
    takes its share again (each unit taken from it in a new epoch)."""
    await _queue(meta, "q", ["g"], [PLAIN, PLAIN])
    a, b = _host(meta, "outputhost-a"), _host(meta, "outputhost-b")
    await _ticks([a], meta, 2)  # b is not alive yet: a holds both
    old = {u: h.epoch for u, h in a.held.items()}
    assert len(old) == 2
    meta.clock.now += timing.DEFAULT.lease_ttl + 0.1  # type: ignore[attr-defined]  # a pauses
    b._taking_after = 0.0
    await _alive(meta, a.id, b.id)
    await b.tick()  # a's lease has expired: b takes its share
    assert len(b.held) == 1
    assert all(a.held[u].acting_until > a.clock() for u in a.held)  # a's own clock: it
    a.clock.now += timing.DEFAULT.lease_ttl  # type: ignore[attr-defined]  # paused too
    await a.tick()  # its renewal fails: every unit dropped, as one
    assert not a.held and a.lease.session is None
    assert ("unload", ("q", "g")) in a.outputs.events  # type: ignore[attr-defined]
    await _ticks([a, b], meta, 6)  # a begins again; b hands one back
    assert len(a.held) == 1 and len(b.held) == 1
    ((unit, held),) = a.held.items()
    assert held.epoch > old[unit]


async def test_a_dead_hosts_units_are_taken_within_dead_after_and_a_tick(
    meta: SqliteMetadataStore,
) -> None:
    """Settled hosts read no lease, but a host that dies changes the live hosts: the
    others read every lease again and take its units once its host lease expired."""
    await _queue(meta, "q", ["g"], [PLAIN, PLAIN, PLAIN, PLAIN])
    a, b = _host(meta, "outputhost-a"), _host(meta, "outputhost-b")
    a._taking_after = b._taking_after = 0.0
    await _ticks([a, b], meta, 4)
    assert len(a.held) == 2 and len(b.held) == 2
    await meta.heartbeat(Host(id=a.id, role="outputhost", address=a.id,
                              heartbeat_at=time.time() - 60))  # fmt: skip  # a has died
    ticks = 0
    while len(b.held) < 4 and ticks < 20:
        await b.tick()
        b.clock.now += b.timing.ownership_tick  # type: ignore[attr-defined]
        meta.clock.now += b.timing.ownership_tick  # type: ignore[attr-defined]
        ticks += 1
    # its host lease runs out lease_ttl after its last renewal; then a tick or two
    assert len(b.held) == 4 and ticks <= timing.DEFAULT.lease_ttl / 0.5 + 2


async def test_a_few_queues_changed_among_many_are_read_by_name(
    meta: SqliteMetadataStore,
) -> None:
    """More than BULK_AFTER queues changed, but less than half of those known (queues
    being made in a big cluster): those queues read by name, not the whole catalog at
    every tick (which cost every output host O(queues) a tick while queues were made)."""
    n = catalog.BULK_AFTER + 8
    for i in range(3 * n):
        await _queue(meta, f"q{i}", ["g"], [PLAIN])
    every = ("list_queues", "get_queue", "list_every_group", "list_extents_in",
             "queues_with_extents", "groups_of")  # fmt: skip
    counting = _Counting(meta, every)
    a = ExtentOwnership(_Outputs(), counting, "outputhost-a", ProcessContext(clock=_Clock()))  # type: ignore[arg-type]
    await _alive(meta, a.id)
    await a.tick()  # the first reads everything
    assert "list_every_group()" in counting.reads
    counting.reads.clear()
    await _successors_of(meta, [f"q{i}" for i in range(n)])  # n of 3n changed
    await a.tick()
    assert "list_every_group()" not in counting.reads  # before: read in bulk (n > 32)
    named = sorted(f"q{i}" for i in range(n))
    assert counting.reads == [f"queues_with_extents({named},)", f"groups_of({named},)"]
    assert len(a.held) == 3 * n + n


async def test_a_tick_after_many_queues_changed_reads_the_catalog_in_bulk(
    meta: SqliteMetadataStore,
) -> None:
    """After a power loss the change log names every queue: read queue by queue (a
    queue's record, groups, extents and each group's ack levels, 8 queues at a time),
    1,000 queues took thousands of calls and a tick of 92 s at load 28, and the groups'
    successors were taken only after it. More than BULK_AFTER queues changed: the whole
    catalog in four reads, whatever the number of queues."""
    n = catalog.BULK_AFTER + 8
    for i in range(n):
        await _queue(meta, f"q{i}", ["g"], [PLAIN])
    every = ("list_queues", "get_queue", "list_groups", "list_every_group", "list_extents",
             "list_extents_in", "get_ack_levels", "list_merged_extents", "queues_with_extents",
             "groups_of")  # fmt: skip
    counting = _Counting(meta, every)
    a = ExtentOwnership(_Outputs(), counting, "outputhost-a", ProcessContext(clock=_Clock()))  # type: ignore[arg-type]
    await _alive(meta, a.id)
    await a.tick()  # the first: the log cannot say what changed
    assert len(a.held) == n
    assert counting.reads == [
        "list_queues()", "list_every_group()", "list_extents_in(('open', 'failing', 'sealed'),)",
        "list_merged_extents()",
    ]  # fmt: skip
    counting.reads.clear()
    await _successors_of(meta, [f"q{i}" for i in range(n)])  # every queue changed
    await a.tick()
    assert len(counting.reads) == 4 and "list_every_group()" in counting.reads
    assert len(a.held) == 2 * n
    counting.reads.clear()
    await _successors_of(meta, ["q0", "q1"], "m")  # a few: read by name
    await a.tick()
    assert counting.reads[:2] == [
        "queues_with_extents(['q0', 'q1'],)", "groups_of(['q0', 'q1'],)"
    ]  # fmt: skip
    assert len(a.held) == 2 * n + 2


async def _successors_of(meta: SqliteMetadataStore, queues: list[str], tag: str = "n") -> None:
    for q in queues:
        extent = Extent(id=f"{q}-{tag}", queue=q, kind=PLAIN, status=OPEN, input_host="in",
                        stores=["s"], created_at=time.time())  # fmt: skip
        await meta.insert_extent(extent)


async def test_the_catalog_read_in_bulk_is_the_catalog_read_by_name(
    meta: SqliteMetadataStore,
) -> None:
    """The four bulk reads make of every kind of queue and group what the reads of the
    queues named make: merged dead-letter extents (one whose DLQ extent is gone is no unit), a
    CP queue's and a stream-mode group's one unit, a queue with no group, timer extents,
    sealed and failing extents, consumed ones left out."""
    await _queue(meta, "q", ["g", "h"], [PLAIN, TIMER, PLAIN])
    await meta.set_extent_status("q-e1", SEALED, sealed_seq=4)
    await meta.set_extent_status("q-e2", FAILING)
    await _queue(meta, "q.g.dlq", [], [PLAIN, PLAIN])
    await meta.put_ack_levels([
        AckLevel(queue="q", group="g", extent="q.g.dlq-e0", limit=b"\x05"),
        AckLevel(queue="q", group="g", extent="q.g.dlq-gone", limit=b"\x05"),
        AckLevel(queue="q", group="h", extent="q-e0", acked=2),
    ])  # fmt: skip
    await _queue(meta, "done", ["g"], [PLAIN])
    await meta.set_extent_status("done-e0", CONSUMED)
    await _queue(meta, "lonely", [], [PLAIN])
    cp = Queue(name="c", config=QueueConfig(type="cp"), created_at=time.time())
    await meta.insert_queue(cp)
    await meta.insert_group(Group(queue="c", name="g", config=GroupConfig(),
                                  created_at=time.time(), start_ms=0, dlq="c.g.dlq"))  # fmt: skip
    stream = Group(queue="q", name="s", config=GroupConfig(type=STREAM), created_at=time.time(),
                   start_ms=0, dlq="q.s.dlq")  # fmt: skip
    await meta.insert_group(stream)

    async def ask(call: Any) -> Any:
        return await call

    units = catalog.UnitCatalog(meta, ask)
    bulk = await units._read_all()
    named = await units._read_named({q.name for q in await meta.list_queues()})
    assert bulk == named
    assert bulk["q"][0] == {
        ("q", "g", "q-e0"): PLAIN, ("q", "g", "q-e1"): TIMER, ("q", "g", "q-e2"): PLAIN,
        ("q", "g", "q.g.dlq-e0"): "dlq", ("q", "h", "q-e0"): PLAIN, ("q", "h", "q-e1"): TIMER,
        ("q", "h", "q-e2"): PLAIN, ("q", "s", "*"): "dlq",
    }  # fmt: skip
    assert bulk["c"][0] == {("c", "g", "*"): "dlq"} and bulk["done"][0] == {}
    assert bulk["lonely"] == ({}, set(), set())


async def test_a_unit_the_store_no_longer_has_is_dropped_after_a_failed_tick(
    meta: SqliteMetadataStore, tmp_path: Path
) -> None:
    """A failover to a standby that lacks the last takes (asynchronous replication): the
    host lease renews, but a unit taken in the lost tail is no one's there. The first
    tick after the outage reads every lease (however settled the host was) and drops a
    unit that no one holds in a read made while its host lease was live (it kept it,
    acting while another host could take it)."""
    await _queue(meta, "q", ["g"], [PLAIN, PLAIN])
    a = _host(meta, "outputhost-a")
    a._taking_after = 0.0
    await _ticks([a], meta, 3)
    assert len(a.held) == 2
    lost = ("q", "g", "q-e1")
    with sqlite3.connect(tmp_path / "meta.db") as db:  # the take the standby lacks
        db.execute("DELETE FROM leases WHERE name = ?", (ownership.unit_lease(*lost),))
    await _failing_tick(a)  # the outage of the failover
    await a._tick_noting_outages()
    assert lost not in a.held and len(a.held) == 1
    assert ("dropped", "q-e1") in a.outputs.events  # type: ignore[attr-defined]


class _CountedWalks(dict[Unit, Any]):
    """The units held, counting the walks over them (a renewal walked every unit)."""

    walks = 0

    def values(self) -> Any:
        type(self).walks += 1
        return super().values()

    def items(self) -> Any:
        type(self).walks += 1
        return super().items()

    def __iter__(self) -> Any:
        type(self).walks += 1
        return super().__iter__()


async def test_a_renewal_moves_every_window_without_a_walk_over_the_units(
    meta: SqliteMetadataStore,
) -> None:
    """Every unit held shares the host lease's window: a renewal moves them all in one
    assignment (it wrote each unit's before: 9 of 84 busy samples of an idle output
    host at 2,000 queues). A unit with a window of its own keeps it until the next
    renewal, as before: fenced, it keeps 0 for good; ridden out, the renewal's."""
    await _queue(meta, "q", ["g"], [PLAIN] * 6)
    a = _host(meta, "outputhost-a")
    a._taking_after = 0.0
    await _ticks([a], meta, 2)
    assert len(a.held) == 6
    fenced, ridden, plain = sorted(a.held)[:3]
    a.fenced(*fenced)
    a.held[ridden].acting_until = a.clock() + 100  # as ride_out gives it
    counted = _CountedWalks(a.held)
    a.held = a.lease.held = counted
    _CountedWalks.walks = 0
    a.clock.now += 1.0  # type: ignore[attr-defined]
    assert await a.lease.renew()
    assert _CountedWalks.walks == 0  # no walk over the units held
    assert a.held[plain].acting_until == a.lease.until > a.clock()
    assert a.held[ridden].acting_until == a.lease.until  # the ride ends with a renewal
    assert a.held[fenced].acting_until == 0.0 and not a.acting(*fenced)
    assert all(a.acting(*u) for u in a.held if u != fenced)
    assert a.lease.apart == {a.held[fenced]}
    a.lease.forget(fenced)
    assert not a.lease.apart
