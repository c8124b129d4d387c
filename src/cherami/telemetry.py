"""What a process measures for its ``/metrics``: histograms cheap enough for the hot
paths (one bisect per observation), and the process-wide ones that no queue owns (the
synced appends to each store host, the metadata calls). Per-queue and per-group
histograms live on the objects that own them, so they go when those go."""

from __future__ import annotations

import inspect
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any, TypeVar, cast

from cherami.errors import CheramiError, Unavailable

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0
)  # fmt: skip
END_TO_END_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
BATCH_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)


class Histogram:
    """Counts per bucket (upper bounds, ``le``), their sum and their count."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs, the last one ``+Inf``."""
        out, total = [], 0
        for bound, count in zip((*map(repr, self.bounds), "+Inf"), self.counts, strict=True):
            total += count
            out.append((bound, float(total)))
        return out


class ProcessTelemetry:
    """The process-wide measurements: one instance per process (``PROCESS``)."""

    def __init__(self) -> None:
        self.store_appends: dict[str, Histogram] = {}  # by store host id: seconds
        self.store_batches: dict[str, Histogram] = {}  # by store host id: messages
        self.metadata_calls: dict[str, Histogram] = {}  # by operation: seconds
        self.metadata_errors: dict[str, int] = {}  # by operation

    def store_append(self, store: str, seconds: float, messages: int) -> None:
        hist = self.store_appends.get(store) or self.store_appends.setdefault(store, Histogram())
        hist.observe(seconds)
        batch = self.store_batches.get(store) or self.store_batches.setdefault(
            store, Histogram(BATCH_BUCKETS)
        )
        batch.observe(messages)

    def metadata_call(self, op: str, seconds: float, failed: bool) -> None:
        hist = self.metadata_calls.get(op) or self.metadata_calls.setdefault(op, Histogram())
        hist.observe(seconds)
        if failed:
            self.metadata_errors[op] = self.metadata_errors.get(op, 0) + 1


PROCESS = ProcessTelemetry()
T = TypeVar("T")


def timed_metadata(store: T) -> T:
    """``store`` with every coroutine method timed into ``PROCESS`` (an error: the
    store could not answer; a not-found or a conflict is an answer)."""
    return cast(T, _TimedMetadata(store))


class _TimedMetadata:
    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name.startswith("_") or not inspect.iscoroutinefunction(attr) or name == "close":
            return attr
        timed = _timed(name, attr)
        setattr(self, name, timed)  # looked up once
        return timed


def _timed(op: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @wraps(fn)
    async def call(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        failed = True
        try:
            result = await fn(*args, **kwargs)
            failed = False
            return result
        except Unavailable:
            raise
        except CheramiError:
            failed = False
            raise
        finally:
            PROCESS.metadata_call(op, time.perf_counter() - started, failed)

    return call
