"""The scaling policy (injected clock), the choice of the extent to seal, placement by
load and zone, and load reports."""

from __future__ import annotations

from cherami.loadmeter import LatencyRing, LoadMeter, LoadSources
from cherami.metadata.models import OPEN, Extent, ExtentLoad, Host, LoadReport
from cherami.roles.controller.placement import Placements, pick_input_host, pick_stores
from cherami.roles.controller.scaling import (
    KEEP,
    OPEN_ONE,
    SEAL_ONE,
    QueueLoad,
    ScalingPolicy,
    extent_rates,
    extent_to_seal,
    queue_rates,
)

GIB = 1 << 30


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _load(extents: int, rate: float, lo: int = 1, hi: int = 16) -> QueueLoad:
    return QueueLoad(extents=extents, rate=rate, target=500.0, min_extents=lo, max_extents=hi)


def _run(policy: ScalingPolicy, clock: Clock, extents: int, rate: float, seconds: float,
         **kw: int) -> list[tuple[float, int]]:  # fmt: skip
    """Tick every 0.5 s, applying each decision; returns (time, decision) of changes."""
    changes = []
    end = clock.now + seconds
    while clock.now < end:
        decision = policy.decide("q", _load(extents, rate, **kw))
        if decision != KEEP:
            changes.append((clock.now, decision))
            extents += decision
        clock.now += 0.5
    return changes


def test_scales_up_after_the_up_window_one_extent_at_a_time() -> None:
    clock = Clock()
    policy = ScalingPolicy(10, 60, clock)
    start = clock.now
    changes = _run(policy, clock, 1, 1800.0, 45)  # needs 4 extents at 500/s each
    assert [d for _, d in changes] == [OPEN_ONE] * 3
    assert changes[0][0] - start >= 10
    assert all(b[0] - a[0] >= 10 for a, b in zip(changes, changes[1:], strict=False))


def test_a_steady_rate_gives_a_steady_count() -> None:
    clock = Clock()
    policy = ScalingPolicy(10, 60, clock)
    # 2 extents at 400/s each: inside [target/2, target], nothing changes for ten minutes
    assert _run(policy, clock, 2, 800.0, 600) == []
    # after reaching 4 for 1800/s, it stays there
    clock = Clock()
    policy = ScalingPolicy(10, 60, clock)
    extents = 1 + len(_run(policy, clock, 1, 1800.0, 60))
    assert extents == 4
    assert _run(policy, clock, extents, 1800.0, 600) == []


def test_scales_down_after_the_down_window_never_below_min() -> None:
    clock = Clock()
    policy = ScalingPolicy(10, 60, clock)
    start = clock.now
    changes = _run(policy, clock, 4, 100.0, 300, lo=2)
    assert [d for _, d in changes] == [SEAL_ONE, SEAL_ONE]  # 4 -> 2, min_extents 2
    assert changes[0][0] - start >= 60
    assert changes[1][0] - changes[0][0] >= 60


def test_a_short_burst_or_dip_changes_nothing() -> None:
    clock = Clock()
    policy = ScalingPolicy(10, 60, clock)
    assert _run(policy, clock, 2, 800.0, 30) == []
    assert _run(policy, clock, 2, 1200.0, 4) == []  # above, but not on average over 10 s
    assert _run(policy, clock, 2, 800.0, 30) == []
    assert _run(policy, clock, 2, 0.0, 15) == []  # a dip: not below half on average over 60 s


def test_max_extents_caps_and_a_lowered_max_seals() -> None:
    clock = Clock()
    policy = ScalingPolicy(10, 60, clock)
    assert len(_run(policy, clock, 1, 100_000.0, 120, hi=3)) == 2
    assert policy.decide("q", _load(5, 100_000.0, hi=3)) == SEAL_ONE
    assert policy.decide("q", _load(1, 100_000.0, lo=2)) == KEEP  # under min: ensure opens


def test_a_count_changed_elsewhere_keeps_the_windows() -> None:
    """A count moved by something else (a failover opened one more) keeps the windows:
    the queue carried 800 msgs/s an extent before and after, so the up window's 10 s
    end 10 s after the first sample, not 10 s after the change."""
    clock = Clock()
    policy = ScalingPolicy(10, 60, clock)
    _run(policy, clock, 1, 800.0, 9)
    assert [d for _, d in _run(policy, clock, 2, 1600.0, 1.5)] == [OPEN_ONE]
    policy.forget(set())
    assert policy.decide("q", _load(3, 1600.0)) == KEEP


def test_rolling_over_under_load_does_not_hold_scaling_back() -> None:
    """A queue at 1,400 msgs/s on 1 extent (target 500) whose extent rolls over by size
    every 2 s (sealed, its successor open a tick later: the count reads one less for a
    tick). Each roll-over started the up window again, so it never scaled: now it opens
    one after the up window, and the next 10 s after that one showed (and no fourth:
    the ticks a roll-over leaves one extent short do not count 1,400 over 2)."""
    clock = Clock()
    policy = ScalingPolicy(10, 60, clock)
    extents, changes = 1, []
    for tick in range(80):  # 40 s
        rolling = tick % 4 == 3  # one tick in four, one extent short
        decision = policy.decide("q", _load(extents - rolling, 1400.0))
        if decision == OPEN_ONE:
            changes.append(clock.now - 1000.0)
            extents += 1
        clock.now += 0.5
    assert changes == [10.0, 20.5], changes  # then 467 msgs/s an extent: it stays at 3


def test_a_change_that_did_not_happen_is_tried_again() -> None:
    clock = Clock()
    policy = ScalingPolicy(10, 60, clock)
    opened = [t for t, d in _run_stuck(policy, clock, 1, 1400.0, 25) if d == OPEN_ONE]
    assert opened == [1010.0, 1020.0]  # the first open failed: asked again 10 s later


def _run_stuck(
    policy: ScalingPolicy, clock: Clock, extents: int, rate: float, seconds: float
) -> list[tuple[float, int]]:
    """Tick every 0.5 s without applying any decision (the opens fail)."""
    out = []
    end = clock.now + seconds
    while clock.now < end:
        out.append((clock.now, policy.decide("q", _load(extents, rate))))
        clock.now += 0.5
    return out


def _extent(id_: str, host: str, created: float = 0.0) -> Extent:
    return Extent(id=id_, queue="q", kind="plain", status=OPEN, input_host=host,
                  stores=[], created_at=created)  # fmt: skip


def test_extent_to_seal_keeps_an_extent_on_every_input_host() -> None:
    plain = [_extent("a1", "A", 1), _extent("b1", "B", 2), _extent("a2", "A", 3)]
    assert extent_to_seal(plain, {"a1": 10.0, "a2": 50.0}).id == "a1"  # A has two
    assert extent_to_seal(plain[:2], {}).id == "b1"  # equals: the newest
    assert extent_rates([{"a1": 1.0}, {"a1": 2.0, "b1": 3.0}]) == {"a1": 3.0, "b1": 3.0}


def _host(id_: str, role: str = "inputhost", zone: str = "", open_extents: int = 0,
          rate: float = 0.0, free: int | None = None, at: float = 100.0) -> Host:  # fmt: skip
    load = LoadReport(
        at=at, open_extents=open_extents, disk_free_bytes=free,
        disk_total_bytes=None if free is None else 100 * GIB,
        extents={"x": ExtentLoad(msgs_in=rate)} if rate else {},
    )  # fmt: skip
    return Host(id=id_, role=role, address=f"{id_}:1", heartbeat_at=at, zone=zone, load=load)


def test_input_host_spreads_a_queue_then_goes_to_the_least_loaded() -> None:
    placed = Placements(clock=lambda: 50.0)
    hosts = [_host("i0", open_extents=1), _host("i1", open_extents=5), _host("i2", open_extents=3)]
    assert pick_input_host(hosts, [], placed) == "i0"
    mine = [_extent("e1", "i0")]
    assert pick_input_host(hosts, mine, placed) == "i2"  # i0 holds one of the queue's
    mine += [_extent("e2", "i2"), _extent("e3", "i1")]
    assert pick_input_host(hosts, mine, placed) == "i0"  # each has one: least loaded again
    even = [_host("i0", open_extents=2, rate=900.0), _host("i1", open_extents=2, rate=100.0)]
    assert pick_input_host(even, [], placed) == "i1"


def test_placements_the_reports_do_not_show_yet_count() -> None:
    now = [50.0]
    placed = Placements(clock=lambda: now[0])
    hosts = [_host("i0", at=100.0), _host("i1", at=100.0)]
    now[0] = 101.0
    placed.add(["i0"])
    assert pick_input_host(hosts, [], placed) == "i1"
    hosts = [_host("i0", open_extents=1, at=102.0), _host("i1", at=102.0)]  # now reported
    assert pick_input_host(hosts, [], placed) == "i1"
    assert placed.pending(hosts[0]) == 0


def test_stores_distinct_zones_least_loaded_and_disk_floor() -> None:
    placed = Placements(clock=lambda: 0.0)
    hosts = [
        _host("s0", "storehost", "a", 0, free=50 * GIB),
        _host("s1", "storehost", "a", 1, free=50 * GIB),
        _host("s2", "storehost", "b", 5, free=50 * GIB),
        _host("s3", "storehost", "c", 0, free=GIB // 2),  # below the floor
        _host("s4", "storehost", "c", 9, free=50 * GIB),
    ]
    assert pick_stores(hosts, 3, placed) == ["s0", "s2", "s4"]  # a, b, c
    assert pick_stores(hosts, 4, placed) == ["s0", "s2", "s4", "s1"]
    assert pick_stores(hosts, 5, placed)[-1] == "s3"  # only when nothing else is left
    unzoned = [_host(f"s{i}", "storehost", "", 2 - i) for i in range(3)]
    assert pick_stores(unzoned, 2, placed) == ["s2", "s1"]


def test_load_meter_rates_cpu_and_disk() -> None:
    clock, cpu = Clock(), [10.0]
    counts = {"e1": (0, 0, 0, 0)}
    meter = LoadMeter(
        LoadSources(counters=lambda: dict(counts), connections=lambda: 7, data_dir="/"),
        interval=2.0, clock=clock, cpu_clock=lambda: cpu[0],
    )  # fmt: skip
    assert meter.report() is None
    clock.now += 2.0
    cpu[0] += 0.5
    counts["e1"] = (1000, 100_000, 400, 40_000)
    counts["e2"] = (0, 0, 0, 0)
    report = meter.report()
    assert report is not None
    assert report.extents == {
        "e1": ExtentLoad(msgs_in=500.0, bytes_in=50_000.0, msgs_out=200.0, bytes_out=20_000.0)
    }  # e2 was idle: left out
    assert (report.cpu, report.open_extents, report.connections) == (0.25, 2, 7)
    assert report.disk_free_bytes is not None and report.disk_total_bytes is not None
    clock.now += 1.0
    assert meter.report() is report  # not again before the interval


def test_latency_ring_p99() -> None:
    ring = LatencyRing(size=100)
    assert ring.p99_ms() is None
    for i in range(1, 201):
        ring.add(i / 1000)
    assert ring.p99_ms() == 200.0  # the last 100: 101..200 ms
    ring.add(0.0)
    assert ring.p99_ms() == 200.0


def test_a_queue_rate_counts_an_extent_sealed_since_its_report() -> None:
    """The latest reports show "a" (rolled over and sealed since) and not yet "b", its
    successor: the queue still carries a's 900 msgs/s, not 0."""
    queue_of = {"a": "q", "b": "q", "x": "other"}
    assert queue_rates({"a": 900.0}, queue_of) == {"q": 900.0}
    assert queue_rates({"a": 300.0, "b": 600.0, "x": 5.0, "t": 9.0}, queue_of) == {
        "q": 900.0, "other": 5.0,
    }  # fmt: skip
