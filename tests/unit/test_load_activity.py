"""Load reports read what changed since their last look (loadmeter.Activity), so an idle
extent costs them nothing; the rates are the same as from every extent's counters."""

from __future__ import annotations

from collections.abc import Hashable

from cherami.loadmeter import GONE_KEPT, Activity, Counts, LoadMeter, LoadSources


def test_since_names_the_keys_touched_after_a_version_newest_first() -> None:
    now = [0.0]
    act = Activity(clock=lambda: now[0])
    for key in ("a", "b", "c"):
        act.touch(key)
    seen = act.version
    act.touch("a")
    assert act.since(seen) == ["a"] and act.since(0) == ["a", "c", "b"]
    act.gone("b")
    assert act.since(seen) == ["b", "a"] and act.is_gone("b")
    now[0] = GONE_KEPT + 1  # named for a while, then forgotten
    assert act.since(0) == ["a", "c"] and not act.is_gone("b")


class _Role:
    """A role's counters per key (an extent's writer, a group's cursor on an extent)."""

    def __init__(self) -> None:
        self.activity = Activity()
        self.counts: dict[Hashable, tuple[str, Counts]] = {}
        self.given_up: set[Hashable] = set()
        self.reads = 0  # keys looked at by reports

    def add(self, key: str, extent: str, msgs: int, size: int) -> None:
        _, (m, b, o, ob) = self.counts.get(key, (extent, (0, 0, 0, 0)))
        self.counts[key] = (extent, (m + msgs, b + size, o, ob))
        self.activity.touch(key)

    def changes(self, version: int) -> tuple[int, dict[Hashable, tuple[str, Counts] | None]]:
        keys = self.activity.since(version)
        self.reads += len(keys)
        return self.activity.version, {
            k: None if k in self.given_up else self.counts[k] for k in keys
        }


def test_a_report_reads_only_what_changed_and_sums_keys_of_one_extent() -> None:
    now = [100.0]
    role = _Role()
    meter = LoadMeter(
        LoadSources(changes=role.changes, open_extents=lambda: 1000),
        interval=2.0, clock=lambda: now[0], cpu_clock=lambda: 0.0,
    )  # fmt: skip
    for i in range(1000):
        role.add(f"w{i}", f"e{i}", 1, 10)  # each extent took one append once
    now[0] += 2
    first = meter.report()
    assert first is not None and len(first.extents) == 1000
    assert first.extents["e7"].msgs_in == 0.5 and first.open_extents == 1000
    role.reads = 0
    role.add("w7", "e7", 4, 40)  # two keys (two groups' cursors) on one extent
    role.add("x7", "e7", 2, 20)
    now[0] += 2
    second = meter.report()
    assert second is not None and set(second.extents) == {"e7"}
    assert (second.extents["e7"].msgs_in, second.extents["e7"].bytes_in) == (3.0, 30.0)
    assert role.reads == 2  # not the 999 idle ones
    now[0] += 2
    third = meter.report()
    assert third is not None and third.extents == {}


def test_a_key_given_up_is_forgotten_and_one_counting_again_from_zero_is_not_negative() -> None:
    now = [0.0]
    role = _Role()
    meter = LoadMeter(
        LoadSources(changes=role.changes), interval=1.0, clock=lambda: now[0],
        cpu_clock=lambda: 0.0,
    )  # fmt: skip
    role.add("w", "e", 100, 1000)
    now[0] += 1
    meter.report()
    role.given_up.add("w")
    role.activity.gone("w")
    now[0] += 1
    assert meter.report() is not None  # the meter forgets it
    role.given_up.clear()
    role.counts["w"] = ("e", (0, 0, 0, 0))  # opened again: counts from 0
    role.add("w", "e", 3, 30)
    now[0] += 1
    report = meter.report()
    assert report is not None and report.extents["e"].msgs_in == 3.0
