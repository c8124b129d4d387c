"""Benchmark harness: the driver interface every system implements and the workload runner.

A run publishes numbered messages (8-byte message number and 8-byte publish timestamp in
``time.time_ns()`` at the front of every body, padded to ``message_size``), consumes them
with ``groups`` consumer groups of ``consumers_per_group`` consumers each, checks that every
group acknowledged every published message, and reports what it measured. Nothing is
estimated: a figure that could not be measured is ``None``.
"""

from __future__ import annotations

import asyncio
import math
import os
import struct
import time
import uuid
from array import array
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol, runtime_checkable

Handler = Callable[[bytes], bool]
"""Called once per delivery with the message body; True = ack, False = nack (redeliver)."""

HEADER = struct.Struct(">QQ")  # message number, publish timestamp (ns since the epoch)
SETUP_TIMEOUT_S = 60.0
TEARDOWN_TIMEOUT_S = 30.0
RSS_SAMPLE_INTERVAL_S = 0.2

_NEW, _NACKED, _ACKED = 0, 1, 2


@runtime_checkable
class Driver(Protocol):
    """One system under test. Optional extras, looked up with getattr:

    * ``supports_delay: bool`` -- if True, ``publish`` accepts ``delay_seconds=`` and the
      broker must not deliver before then; otherwise delayed workloads are skipped.
    * ``async def start() -> None`` / ``async def stop() -> None`` -- called by bench.py
      around all runs of the driver (for drivers that run their own server).
    """

    name: str
    durability: str

    async def available(self) -> str | None: ...

    async def setup(self, run_id: str, groups: int) -> None: ...

    async def publish(self, bodies: list[bytes]) -> None: ...

    async def consume(self, group: int, consumer: int, handler: Handler) -> None: ...

    async def teardown(self) -> None: ...

    def server_pids(self) -> list[int]: ...


@dataclass(frozen=True)
class Workload:
    name: str
    message_size: int = 256
    rate: float = 0.0  # msgs/s; 0 = as fast as possible
    groups: int = 1
    consumers_per_group: int = 1
    messages: int | None = None
    duration_seconds: float | None = None
    nack_ratio: float = 0.0
    delay_seconds: float = 0.0
    backlog: bool = False
    batch_size: int = 100
    in_flight: int = 8
    timeout_seconds: float = 120.0
    description: str = ""

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> Workload:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{raw.get('name', '?')}: unknown workload keys {unknown}")
        wl = cls(**raw)
        wl.validate()
        return wl

    def validate(self) -> None:
        if (self.messages is None) == (self.duration_seconds is None):
            raise ValueError(f"{self.name}: give exactly one of messages / duration_seconds")
        if self.message_size < HEADER.size:
            raise ValueError(f"{self.name}: message_size must be >= {HEADER.size}")
        if not 0.0 <= self.nack_ratio <= 1.0:
            raise ValueError(f"{self.name}: nack_ratio must be within 0..1")
        if self.groups < 1 or self.consumers_per_group < 1 or self.batch_size < 1:
            raise ValueError(f"{self.name}: groups, consumers_per_group, batch_size must be >= 1")
        if self.backlog and self.messages is None:
            raise ValueError(f"{self.name}: a backlog workload needs a message count")


# --------------------------------------------------------------------------- bodies


def make_bodies(first: int, count: int, pad: bytes) -> list[bytes]:
    ts = time.time_ns()
    pack = HEADER.pack
    return [pack(n, ts) + pad for n in range(first, first + count)]


def should_nack(number: int, threshold: int) -> bool:
    """Deterministic pseudo-random selection of ``threshold / 2**32`` of message numbers."""
    return (number * 2654435761) & 0xFFFFFFFF < threshold


# --------------------------------------------------------------------------- consuming


class DeliveryClock:
    """First and last acknowledged delivery over all groups (ns, wall clock)."""

    def __init__(self) -> None:
        self.first_ns = 0
        self.last_ns = 0


class GroupTracker:
    """Per-group delivery state: one byte per message number."""

    def __init__(
        self, index: int, nack_threshold: int, clock: DeliveryClock, on_complete: Callable[[], None]
    ) -> None:
        self.index = index
        self.state = bytearray()
        self.acked = 0
        self.deliveries = 0
        self.duplicates = 0
        self.nacked = 0
        self.redelivered_after_nack = 0
        self.e2e_ns: array[int] = array("q")
        self.duplicate_sample: list[int] = []
        self.target = -1  # published count, known once publishing ends
        self.closed = False  # set when the run ends: later deliveries are not counted
        self._threshold = nack_threshold
        self._clock = clock
        self._on_complete = on_complete

    def set_target(self, published: int) -> None:
        self.target = published
        if self.acked >= published:
            self._on_complete()

    def handle(self, body: bytes) -> bool:
        if self.closed:  # e.g. redelivered because another consumer is shutting down
            return True
        now = time.time_ns()
        number, sent_ns = HEADER.unpack_from(body)
        state = self.state
        if number >= len(state):
            state.extend(bytes(max(number + 1 - len(state), len(state), 1024)))
        self.deliveries += 1
        current = state[number]
        if current == _ACKED:
            self.duplicates += 1
            if len(self.duplicate_sample) < 10:
                self.duplicate_sample.append(number)
            return True
        if current == _NEW:
            self.e2e_ns.append(now - sent_ns)
            if self._threshold and should_nack(number, self._threshold):
                state[number] = _NACKED
                self.nacked += 1
                return False
        else:
            self.redelivered_after_nack += 1
        state[number] = _ACKED
        self.acked += 1
        clock = self._clock
        if not clock.first_ns:
            clock.first_ns = now
        clock.last_ns = now
        if self.acked == self.target:
            self._on_complete()
        return True

    def missing(self, published: int) -> list[int]:
        state = self.state[:published]
        state.extend(bytes(published - len(state)))
        if state.count(_ACKED) == published:
            return []
        return [n for n in range(published) if state[n] != _ACKED]


# --------------------------------------------------------------------------- publishing


@dataclass
class PublishLog:
    claimed: int = 0
    confirmed: int = 0
    first_call_ns: int = 0
    last_confirm_ns: int = 0
    batch_latency_ns: array[int] = field(default_factory=lambda: array("q"))
    batch_sizes: array[int] = field(default_factory=lambda: array("q"))

    def claim(self, limit: int | None, batch_size: int) -> tuple[int, int]:
        first = self.claimed
        count = batch_size if limit is None else min(batch_size, limit - first)
        self.claimed += max(count, 0)
        return first, count

    def record(self, started_ns: int, count: int) -> None:
        now = time.time_ns()
        self.batch_latency_ns.append(now - started_ns)
        self.batch_sizes.append(count)
        self.confirmed += count
        self.last_confirm_ns = max(self.last_confirm_ns, now)


class Publisher:
    def __init__(self, driver: Driver, wl: Workload) -> None:
        self.driver = driver
        self.wl = wl
        self.log = PublishLog()
        self.pad = b"\0" * (wl.message_size - HEADER.size)
        self.limit = (
            wl.messages
            if wl.messages is not None
            else (int(wl.rate * wl.duration_seconds) if wl.rate and wl.duration_seconds else None)
        )
        self.deadline = math.inf

    async def run(self) -> PublishLog:
        if self.wl.duration_seconds:
            self.deadline = time.monotonic() + self.wl.duration_seconds
        async with asyncio.TaskGroup() as tasks:
            if self.wl.rate > 0:
                await self._run_paced(tasks)
            else:
                for _ in range(self.wl.in_flight):
                    tasks.create_task(self._worker())
        return self.log

    async def _send(self, first: int, count: int) -> None:
        bodies = make_bodies(first, count, self.pad)
        started = time.time_ns()
        if not self.log.first_call_ns:
            self.log.first_call_ns = started
        if self.wl.delay_seconds:
            await self.driver.publish(bodies, delay_seconds=self.wl.delay_seconds)  # type: ignore[call-arg]
        else:
            await self.driver.publish(bodies)
        self.log.record(started, count)

    def _more(self) -> bool:
        if self.limit is not None and self.log.claimed >= self.limit:
            return False
        return time.monotonic() < self.deadline

    async def _worker(self) -> None:
        while self._more():
            first, count = self.log.claim(self.limit, self.wl.batch_size)
            await self._send(first, count)

    async def _run_paced(self, tasks: asyncio.TaskGroup) -> None:
        """Start batch i at start + i * batch_size / rate, at most ``in_flight`` at once."""
        slots = asyncio.Semaphore(self.wl.in_flight)
        start = time.monotonic()
        interval = self.wl.batch_size / self.wl.rate
        batch = 0
        while self._more():
            delay = start + batch * interval - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await slots.acquire()
            first, count = self.log.claim(self.limit, self.wl.batch_size)
            tasks.create_task(self._send_and_release(first, count, slots))
            batch += 1

    async def _send_and_release(self, first: int, count: int, slots: asyncio.Semaphore) -> None:
        try:
            await self._send(first, count)
        finally:
            slots.release()


# --------------------------------------------------------------------------- server RSS


def rss_bytes(pids: Iterable[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", encoding="ascii") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue
    return total


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU time consumed so far by ``pids`` (from /proc/<pid>/stat)."""
    ticks = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
                fields_ = fh.read().rsplit(")", 1)[1].split()
            ticks += int(fields_[11]) + int(fields_[12])
        except (OSError, IndexError, ValueError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


class ServerSampler:
    """Samples the summed RSS of the server pids every 0.2 s; also measures the CPU
    seconds the servers and this (client) process used between start() and stop()."""

    def __init__(self, pids: Callable[[], list[int]]) -> None:
        self._pids = pids
        self.start_bytes: int | None = None
        self.peak_bytes: int | None = None
        self.server_cpu_s: float | None = None
        self.client_cpu_s: float | None = None
        self._cpu_start = (0.0, 0.0)
        self._cached_pids: list[int] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._cpu_start = (cpu_seconds(self._pids()), _own_cpu())
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self.server_cpu_s = round(cpu_seconds(self._pids()) - self._cpu_start[0], 2)
            self.client_cpu_s = round(_own_cpu() - self._cpu_start[1], 2)
        self._sample()

    def _sample(self) -> None:
        value = rss_bytes(self._cached_pids)
        if not value:  # not looked up yet, or the server restarted: find the pids again
            self._cached_pids = self._pids()
            value = rss_bytes(self._cached_pids)
        if not value:
            return
        if self.start_bytes is None:
            self.start_bytes = value
        self.peak_bytes = max(self.peak_bytes or 0, value)

    async def _loop(self) -> None:
        while True:
            self._sample()
            await asyncio.sleep(RSS_SAMPLE_INTERVAL_S)


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system


# --------------------------------------------------------------------------- statistics


def percentiles_ms(
    values_ns: array[int], weights: array[int] | None, qs: Mapping[str, float]
) -> dict[str, float | None]:
    if not values_ns:
        return {k: None for k in qs}
    import numpy as np

    data = np.frombuffer(values_ns, dtype=np.int64)
    if weights is not None:
        data = np.repeat(data, np.frombuffer(weights, dtype=np.int64))
    points = np.percentile(data, list(qs.values()), method="higher")
    return {k: round(float(v) / 1e6, 3) for k, v in zip(qs, points, strict=True)}


def _rate(count: int, start_ns: int, end_ns: int) -> float | None:
    if count <= 0 or end_ns <= start_ns:
        return None
    return round(count / ((end_ns - start_ns) / 1e9), 1)


def _seconds(start_ns: int, end_ns: int) -> float:
    return round((end_ns - start_ns) / 1e9, 3)


def _merge(arrays: Iterable[array[int]]) -> array[int]:
    merged: array[int] = array("q")
    for a in arrays:
        merged.extend(a)
    return merged


# --------------------------------------------------------------------------- runner


class Run:
    """Mutable state of one workload run shared by publisher, consumers and reporting."""

    def __init__(self, wl: Workload) -> None:
        self.wl = wl
        self.clock = DeliveryClock()
        self.done = asyncio.Event()
        self._complete_groups: set[int] = set()
        threshold = int(wl.nack_ratio * 2**32)
        self.groups = [
            GroupTracker(g, threshold, self.clock, self._completer(g)) for g in range(wl.groups)
        ]

    def _completer(self, group: int) -> Callable[[], None]:
        def complete() -> None:
            self._complete_groups.add(group)
            if len(self._complete_groups) == len(self.groups):
                self.done.set()

        return complete

    def set_target(self, published: int) -> None:
        for tracker in self.groups:
            tracker.set_target(published)

    def close(self) -> None:
        for tracker in self.groups:
            tracker.closed = True


def _start_consumers(driver: Driver, run: Run) -> list[asyncio.Task[None]]:
    return [
        asyncio.create_task(driver.consume(g.index, c, g.handle), name=f"consume-g{g.index}-c{c}")
        for g in run.groups
        for c in range(run.wl.consumers_per_group)
    ]


async def _await_watching(main: Awaitable[Any], watched: list[asyncio.Task[None]]) -> Any:
    """Await ``main``; fail fast if one of ``watched`` (consumers) dies first."""
    main_task = asyncio.ensure_future(main)
    try:
        while True:
            done, _ = await asyncio.wait([main_task, *watched], return_when=asyncio.FIRST_COMPLETED)
            if main_task in done:
                return main_task.result()
            for task in done:
                exc = None if task.cancelled() else task.exception()
                raise RuntimeError(f"{task.get_name()} stopped early: {exc!r}")
    finally:
        if not main_task.done():
            main_task.cancel()
            await asyncio.gather(main_task, return_exceptions=True)


CANCEL_TIMEOUT_S = 10.0


async def _cancel_all(tasks: list[asyncio.Task[None]]) -> list[str]:
    """Cancel consumer tasks; returns the names of any that did not stop in time."""
    for task in tasks:
        task.cancel()
    if not tasks:
        return []
    _, stuck = await asyncio.wait(tasks, timeout=CANCEL_TIMEOUT_S)
    return sorted(task.get_name() for task in stuck)


async def _execute(
    driver: Driver, run: Run, publisher: Publisher, consumers: list[asyncio.Task[None]]
) -> None:
    if not run.wl.backlog:
        consumers.extend(_start_consumers(driver, run))
    log = await _await_watching(publisher.run(), consumers)
    run.set_target(log.confirmed)
    if run.wl.backlog:
        consumers.extend(_start_consumers(driver, run))
    await _await_watching(run.done.wait(), consumers)


async def run_workload(driver: Driver, workload: Mapping[str, Any] | Workload) -> dict[str, Any]:
    """Run one workload against one driver and return the measured figures."""
    wl = workload if isinstance(workload, Workload) else Workload.from_mapping(workload)
    result: dict[str, Any] = {
        "system": driver.name,
        "durability": driver.durability,
        "workload": wl.name,
        "params": asdict(wl),
    }
    if wl.delay_seconds and not getattr(driver, "supports_delay", False):
        result["skipped"] = "driver cannot delay delivery"
        return result

    run = Run(wl)
    publisher = Publisher(driver, wl)
    sampler = ServerSampler(driver.server_pids)
    consumers: list[asyncio.Task[None]] = []
    result.update(complete=False, timed_out=False, error=None)
    started = time.monotonic()
    try:
        await asyncio.wait_for(
            driver.setup(f"{wl.name}-{uuid.uuid4().hex[:8]}", wl.groups), SETUP_TIMEOUT_S
        )
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        result["error"] = f"setup failed: {exc!r}"
        await _teardown(driver, result)
        return result
    sampler.start()
    deadline = asyncio.timeout(wl.timeout_seconds)
    try:
        async with deadline:
            await _execute(driver, run, publisher, consumers)
        result["complete"] = True
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        if isinstance(exc, TimeoutError) and deadline.expired():
            result["timed_out"] = True
        else:
            result["error"] = _describe(exc)
    finally:
        run.close()
        stuck = await _cancel_all(consumers)
        if stuck:
            result["stuck_consumers"] = stuck
        await sampler.stop()
        await _teardown(driver, result)
    result["wall_seconds"] = round(time.monotonic() - started, 2)
    result.update(summarize(run, publisher.log, sampler))
    return result


def _describe(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return repr(exc)


async def _teardown(driver: Driver, result: dict[str, Any]) -> None:
    try:
        await asyncio.wait_for(driver.teardown(), TEARDOWN_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        result["teardown_error"] = repr(exc)


def summarize(run: Run, log: PublishLog, sampler: ServerSampler) -> dict[str, Any]:
    published = log.confirmed
    groups = [_group_summary(g, published) for g in run.groups]
    acked = sum(g.acked for g in run.groups)
    clock = run.clock
    mib = 1024 * 1024
    return {
        "published": published,
        "publish_msgs_s": _rate(published, log.first_call_ns, log.last_confirm_ns),
        "publish_seconds": _seconds(log.first_call_ns, log.last_confirm_ns) if published else None,
        "consume_msgs_s": _rate(round(acked / len(run.groups)), clock.first_ns, clock.last_ns),
        "consume_total_msgs_s": _rate(acked, clock.first_ns, clock.last_ns),
        "consume_seconds": _seconds(clock.first_ns, clock.last_ns) if clock.first_ns else None,
        "publish_latency_ms": percentiles_ms(
            log.batch_latency_ns, log.batch_sizes, {"p50": 50, "p99": 99, "p99.9": 99.9}
        ),
        "e2e_latency_ms": percentiles_ms(
            _merge(g.e2e_ns for g in run.groups), None, {"p50": 50, "p99": 99}
        ),
        "peak_rss_mib": round(sampler.peak_bytes / mib, 1) if sampler.peak_bytes else None,
        "start_rss_mib": round(sampler.start_bytes / mib, 1) if sampler.start_bytes else None,
        "server_cpu_seconds": sampler.server_cpu_s,
        "client_cpu_seconds": sampler.client_cpu_s,
        "groups": groups,
        "all_delivered": all(g["missing"] == 0 for g in groups),
    }


def _group_summary(tracker: GroupTracker, published: int) -> dict[str, Any]:
    missing = tracker.missing(published)
    return {
        "group": tracker.index,
        "delivered": tracker.acked,
        "deliveries": tracker.deliveries,
        "duplicates": tracker.duplicates,
        "duplicate_sample": tracker.duplicate_sample,
        "nacked": tracker.nacked,
        "redelivered_after_nack": tracker.redelivered_after_nack,
        "missing": len(missing),
        "missing_sample": missing[:10],
    }
