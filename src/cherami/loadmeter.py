"""Load reports: what a host carried over the last interval (2 s by default), sent with
its membership heartbeats. A role keeps cumulative counters (per extent: messages and
bytes in and out); the meter turns their growth into rates once per interval, so the hot
paths only add to counters."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from cherami.metadata.models import ExtentLoad, Host, LoadReport

GIB = 1 << 30
# the free-disk floor of a store host: the smaller of 5% of its disk and 1 GiB. Below
# it, it gets no new replicas while others have room, and input hosts stop appending to
# its extents (publishes answer 429 storage_full); a store host itself refuses appends
# below half of it (a backstop for reports that are up to 2 s old). Appends never
# reach a full disk, so RocksDB never enters its no-space error state.
DISK_FLOOR_FRACTION = 0.05
DISK_FLOOR_BYTES = GIB


def disk_floor(total_bytes: int) -> int:
    return min(DISK_FLOOR_BYTES, int(total_bytes * DISK_FLOOR_FRACTION))


def has_room(host: Host) -> bool:
    """Whether a store host's latest report shows free disk above 1.5 times its floor
    (True when it reported none): below it the store host takes no new replica, and
    below the floor no append (roles/storehost/server.py), so that a report up to 2 s
    old still shows it full once it refuses."""
    report = host.load
    if report is None or report.disk_free_bytes is None or report.disk_total_bytes is None:
        return True
    return report.disk_free_bytes >= disk_floor(report.disk_total_bytes) * 3 // 2


REPORT_INTERVAL = 2.0

# per extent: (messages in, bytes in, messages out, bytes out), counted since it was opened
Counts = tuple[int, int, int, int]


class Activity:
    """What changed, newest last: a role touches a key (an extent writer, a group's
    cursor on an extent) when its counters grow, and a load report reads the keys
    touched since its last look in O(keys touched), so an idle extent costs the reports
    nothing however many there are."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.version = 0
        self._at: dict[Hashable, int] = {}  # key -> the version it was last touched at
        self._gone: dict[Hashable, float] = {}  # keys given up, when
        self._clock = clock

    def touch(self, key: Hashable) -> None:
        self.version += 1
        self._at.pop(key, None)
        self._at[key] = self.version

    def gone(self, *keys: Hashable) -> None:
        """The keys' extents are given up: touched once more, so that meters reading
        them find them gone and forget them, then forgotten here GONE_KEPT seconds later."""
        for key in keys:
            self.touch(key)
            self._gone[key] = self._clock()

    def is_gone(self, key: Hashable) -> bool:
        return key in self._gone

    def since(self, version: int) -> list[Hashable]:
        """The keys touched after ``version`` (newest first)."""
        if self._gone:
            old = self._clock() - GONE_KEPT
            for key in [k for k, at in self._gone.items() if at < old]:
                del self._gone[key]
                self._at.pop(key, None)
        keys = []
        at = self._at
        for key in reversed(at):
            if at[key] <= version:
                break
            keys.append(key)
        return keys


GONE_KEPT = 60.0  # seconds a key given up is still named to meters (they read every 2 s)

# what changed since a version: (the version now, {key: (extent, its counts cumulative
# since the extent was opened) or None for a key given up}) (Activity)
Changes = Callable[[int], tuple[int, dict[Hashable, tuple[str, Counts] | None]]]


@dataclass
class LoadSources:
    """Where a role's figures come from; a source left None is not reported. A role
    that keeps an Activity gives ``changes`` (and ``open_extents``) instead of
    ``counters``: a report then reads only what changed since the last one."""

    counters: Callable[[], dict[str, Counts]] = dict
    open_extents: Callable[[], int] | None = None  # None: the extents the counters name
    changes: Changes | None = None
    connections: Callable[[], int] | None = None
    data_dir: str | None = None
    disk: Callable[[], tuple[int, int]] | None = None  # (free, total): not data_dir's disk
    append_p99_ms: Callable[[], float | None] | None = None


class LoadMeter:
    def __init__(
        self,
        sources: LoadSources,
        interval: float = REPORT_INTERVAL,
        clock: Callable[[], float] = time.time,
        cpu_clock: Callable[[], float] = time.process_time,
    ) -> None:
        self.sources = sources
        self.interval = interval
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._at = clock()
        self._cpu = cpu_clock()
        self._counts: dict[str, Counts] = {}
        self._version = 0  # of the source's Activity, at the last report
        self._seen: dict[Hashable, Counts] = {}  # key -> its counts at the last report
        self.latest: LoadReport | None = None

    def report(self) -> LoadReport | None:
        """The latest report, computed again once ``interval`` has passed since the last
        one (None until the first interval ends)."""
        now = self._clock()
        if now - self._at >= self.interval:
            self.latest = self._compute(now)
        return self.latest

    def _grown(self, now: float) -> tuple[dict[str, Counts], int]:
        """What each extent's counters grew by since the last report (those that did
        not grow are left out), and the extents the counters name."""
        src = self.sources
        grown: dict[str, Counts] = {}
        if src.changes is None:
            counts = src.counters()
            for extent, c in counts.items():
                p = self._counts.get(extent, (0, 0, 0, 0))
                if c != p:
                    grown[extent] = (c[0] - p[0], c[1] - p[1], c[2] - p[2], c[3] - p[3])
            self._counts = counts
            return grown, len(counts)
        self._version, changed = src.changes(self._version)
        seen = self._seen
        for key, change in changed.items():
            if change is None:  # given up: its last counts were reported
                seen.pop(key, None)
                continue
            extent, c = change
            p = seen.get(key, (0, 0, 0, 0))
            seen[key] = c
            d = grown.get(extent, (0, 0, 0, 0))
            grown[extent] = tuple(  # type: ignore[assignment]
                a + max(0, b - q) for a, b, q in zip(d, c, p, strict=True)
            )  # a key whose extent was opened again counts from 0 again
        return {e: g for e, g in grown.items() if any(g)}, 0

    def _compute(self, now: float) -> LoadReport:
        src = self.sources
        elapsed = max(now - self._at, 1e-6)
        cpu = self._cpu_clock()
        grown, named = self._grown(now)
        extents = {
            extent: ExtentLoad(
                msgs_in=round(max(0, m_in) / elapsed, 1),
                bytes_in=round(max(0, b_in) / elapsed, 1),
                msgs_out=round(max(0, m_out) / elapsed, 1),
                bytes_out=round(max(0, b_out) / elapsed, 1),
            )
            for extent, (m_in, b_in, m_out, b_out) in grown.items()
        }
        report = LoadReport(
            at=now,
            interval=round(elapsed, 3),
            cpu=round(max(0.0, cpu - self._cpu) / elapsed, 3),
            open_extents=src.open_extents() if src.open_extents else named,
            connections=src.connections() if src.connections else None,
            append_p99_ms=src.append_p99_ms() if src.append_p99_ms else None,
            extents=extents,
        )
        if src.disk is not None:
            report.disk_free_bytes, report.disk_total_bytes = src.disk()
        elif src.data_dir is not None:
            try:
                usage = shutil.disk_usage(src.data_dir)
            except OSError:
                pass
            else:
                report.disk_free_bytes, report.disk_total_bytes = usage.free, usage.total
        self._at, self._cpu = now, cpu
        return report


class LatencyRing:
    """The last ``size`` durations of something (a synced append round), O(1) to add;
    the p99 is taken from them when a report is made."""

    def __init__(self, size: int = 512) -> None:
        self._values = [0.0] * size
        self._next = 0
        self._filled = 0

    def add(self, seconds: float) -> None:
        self._values[self._next] = seconds
        self._next = (self._next + 1) % len(self._values)
        self._filled = min(self._filled + 1, len(self._values))

    def p99_ms(self) -> float | None:
        if not self._filled:
            return None
        values = sorted(self._values[: self._filled])
        return round(values[min(len(values) - 1, int(len(values) * 0.99))] * 1000, 3)
