"""Batch read of a queue's retained messages, for analytics and replay.

Reads every extent the queue still has (plain ones, and timer ones unless
``includeDelayed=false``), split into partitions of at most ``partitionMessages``
messages. When the session enables Python filter pushdown
(``spark.sql.python.filterPushdown.enabled``), filters on ``enqueued_at``, ``extent`` and
``seq`` are pushed down: whole extents created after the time range are skipped, and
records outside it are dropped in the worker, before they become rows. Pushdown is never
required: pyspark refuses a reader that implements ``pushFilters`` while the setting is
off (its default), so the source hands Spark the reader with ``pushFilters`` only when
Spark asks for pushdown (see ``source.CheramiDataSource.reader``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import StructType

from cherami.spark import offsets as o
from cherami.spark.access import ReadAccess, grant_source
from cherami.spark.control import ControlClient, ExtentView
from cherami.spark.options import Options
from cherami.spark.partitions import ExtentRange
from cherami.spark.schema import RecordFilter

if TYPE_CHECKING:
    import pyarrow as pa

_RANGE = (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)


def _epoch_us(value: Any) -> int | None:
    """A timestamp literal in microseconds; naive datetimes are local time, as in Spark."""
    if isinstance(value, datetime):
        return round(value.timestamp() * 1_000_000)
    return None


class Bounds:
    """An inclusive integer range narrowed by comparison filters."""

    def __init__(self, low: int | None = None, high: int | None = None) -> None:
        self.low, self.high = low, high

    def narrow(self, f: Filter, value: int) -> None:
        if isinstance(f, EqualTo | GreaterThan | GreaterThanOrEqual):
            low = value + 1 if isinstance(f, GreaterThan) else value
            self.low = low if self.low is None else max(self.low, low)
        if isinstance(f, EqualTo | LessThan | LessThanOrEqual):
            high = value - 1 if isinstance(f, LessThan) else value
            self.high = high if self.high is None else min(self.high, high)


class CheramiBatchReader(DataSourceReader):
    def __init__(self, schema: StructType, options: Options) -> None:
        self.schema = schema
        self.options = options
        start, end = options.start_ms, options.end_ms
        self.time = Bounds(  # microseconds, like Spark timestamps
            None if start is None else start * 1000, None if end is None else end * 1000 - 1
        )
        self.seq = Bounds()
        self.extents: set[str] | None = set(options.extents) or None

    def _keep(self) -> RecordFilter:
        low, high = self.time.low, self.time.high
        return RecordFilter(  # records carry milliseconds: round the bounds inward
            min_ms=None if low is None else -(-low // 1000),
            max_ms=None if high is None else high // 1000,
            min_seq=self.seq.low,
            max_seq=self.seq.high,
        )

    def _wanted(self, view: ExtentView, keep: RecordFilter) -> bool:
        if self.extents is not None and view.id not in self.extents:
            return False
        if not view.plain and not self.options.include_delayed:
            return False
        # an extent holds nothing enqueued before it was created
        return keep.max_ms is None or view.created_ms <= keep.max_ms + 1000

    def _bounds(self, views: list[ExtentView]) -> tuple[o.Offsets, o.Offsets]:
        """Where each plain extent's read starts and ends (``startingOffsets``,
        ``endingOffsets``; next_seq, end exclusive)."""
        latest = o.available(views)
        plain = {v.id for v in views if v.plain}
        start, end = self.options.starting_offsets, self.options.ending_offsets
        starts = o.resolve(start or "earliest", latest, plain, "startingOffsets")
        ends = o.resolve(end or "latest", latest, plain, "endingOffsets")
        return starts, {**latest, **ends}  # extents the JSON leaves out: to the latest

    def partitions(self) -> Sequence[InputPartition]:
        keep = self._keep()
        views = ControlClient(self.options.url, self.options.api_key).extents(self.options.queue)
        starts, ends = self._bounds(views)
        size = self.options.partition_messages
        ranges: list[tuple[ExtentView, int, int]] = []  # (extent, first seq, end seq)
        for view in views:
            if not self._wanted(view, keep) or view.last_seq == 0:
                continue
            if not view.plain:
                ranges.append((view, 1, 0))  # a timer extent: all of it
                continue
            first = max(1, keep.min_seq or 1, starts.get(view.id, 1))
            last = min(view.last_seq, keep.max_seq or view.last_seq, ends.get(view.id, 1) - 1)
            ranges.extend(
                (view, low, min(low + size, last + 1)) for low in range(first, last + 1, size)
            )
        if not ranges:
            return []
        access = ReadAccess(grant_source(self.options))
        creds = access.credentials(view.id for view, _, _ in ranges)
        return [
            ExtentRange(view.id, list(view.stores), first, end, creds[view.id], access.renewer,
                        keep)
            for view, first, end in ranges
        ]  # fmt: skip

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, ExtentRange):
            return iter(())  # pyspark's stand-in partition when there are none
        return partition.read(self.schema)


class PushdownBatchReader(CheramiBatchReader):
    """The batch reader with filter pushdown, for sessions that enable it."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        for f in filters:
            column = f.attribute if hasattr(f, "attribute") else ()
            value = getattr(f, "value", None)
            micros = _epoch_us(value)
            if column == ("enqueued_at",) and isinstance(f, _RANGE) and micros is not None:
                self.time.narrow(f, micros)
            elif column == ("seq",) and isinstance(f, _RANGE) and isinstance(value, int):
                self.seq.narrow(f, value)
            elif isinstance(f, IsNotNull) and column and column[0] in self.schema.fieldNames():
                continue  # no column of this source is ever null
            elif column == ("extent",) and isinstance(f, EqualTo | In):
                wanted = {f.value} if isinstance(f, EqualTo) else set(f.value)
                self.extents = wanted if self.extents is None else self.extents & wanted
            else:
                yield f
