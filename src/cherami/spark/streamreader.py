"""Streaming read of a queue for a stream-mode consumer group.

One Spark partition per extent with new messages; offsets are ``{extent: next_seq}``
for plain extents and ``{extent/due: due_ms}`` for timer extents (delayed messages are
read once due: each micro-batch reads the records that became due since the last one).
The Spark checkpoint is the source of truth: a new query starts from the group's
committed offsets, a restarted one from its checkpoint. The group's ack levels follow
the checkpoint: ``commit()`` (one micro-batch late) and the query listener (each batch's
end offset, see ``listener``) move them forward, never back."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from cherami.errors import CheramiError, InvalidRequest, Unavailable
from cherami.metadata.models import STREAM
from cherami.spark import offsets as o
from cherami.spark.access import ReadAccess, grant_source
from cherami.spark.control import ControlClient, ExtentView
from cherami.spark.options import Options
from cherami.spark.partitions import ExtentRange
from cherami.spark.schema import RecordFilter
from cherami.spark.storereader import StoreReader

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("cherami.spark.streamreader")


class CheramiStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(
        self, schema: StructType, options: Options, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.schema = schema
        self.options = options
        self.group = options.require_group()
        self._extents: dict[str, ExtentView] = {}
        self._latest: o.Offsets | None = None
        self._target: o.Offsets | None = None
        self._committed: o.Offsets = {}
        self._start_ms = 0
        self._group_known = False
        self._gate = o.TriggerGate(
            options.min_messages_per_trigger, options.max_trigger_delay_ms, clock
        )
        self._due_target: int | None = None  # Trigger.AvailableNow: the due time to read to
        self._access = ReadAccess(grant_source(options))  # grants, kept until stale

    def _control(self) -> ControlClient:
        return ControlClient(self.options.url, self.options.api_key)

    def _group_offsets(self) -> o.Offsets:
        """The group's committed offsets (and start time); refuses competing groups."""
        reply = self._control().group_offsets(self.options.queue, self.group)
        if reply.get("type", STREAM) != STREAM:
            raise InvalidRequest(
                f"group {self.group} is not a stream-mode group; create it with type 'stream'"
            )
        self._start_ms = int(reply.get("start_ms", 0))
        self._group_known = True
        return o.normalize(reply["offsets"])

    def _refresh(self, start: o.Offsets | None = None) -> o.Offsets:
        """List the queue's extents; ``start``: the offsets still to read from, checked
        for extents that retention deleted before they were read to their end."""
        views = self._control().extents(self.options.queue)
        before = self._latest or {}
        self._extents = {v.id: v for v in views}
        self._latest = o.available(views)
        if start:
            for extent, seq in o.lost(start, before, set(self._extents)).items():
                self._data_lost(f"extent {extent} was deleted before seq {seq}.."
                                f"{before[extent] - 1} was read")  # fmt: skip
        return self._latest

    def _data_lost(self, what: str) -> None:
        if self.options.fail_on_data_loss:
            raise CheramiError(
                f"data loss on queue {self.options.queue}: {what} (retention removed it); "
                "set failOnDataLoss=false to go on without it"
            )
        log.warning("data loss on queue %s: %s; going on", self.options.queue, what)

    # offsets
    def initialOffset(self) -> dict[str, int]:
        committed = self._group_offsets()
        latest = self._refresh()
        self._committed = committed
        plain = {e for e, view in self._extents.items() if view.plain}
        timers = [e for e, view in self._extents.items() if not view.plain]
        # delayed messages: from the first due (with startingOffsets=latest: due from now)
        due_from = due_cut() if self.options.starting_offsets == "latest" else 0
        due = {o.due_key(e): due_from for e in timers}
        if self.options.starting_offsets is not None:
            start = o.resolve(self.options.starting_offsets, latest, plain, "startingOffsets")
        elif self.options.start_ms is not None:
            start = {}  # from the earliest, records before startingTimestamp dropped
        else:
            start = {e: n for e, n in committed.items() if e in self._extents}
        return o.normalize({**start, **due})

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_messages_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        try:
            latest = o.cap(self._refresh(o.normalize(start)), self._target)
        except Unavailable as err:  # the frontend restarts: no new data for now
            log.warning("cannot list extents of %s: %s", self.options.queue, err)
            return o.normalize(start)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = o.advance(o.normalize(start), latest, max_rows)
        if self._target is None and not self._gate.admits(o.count(start, end)):
            return o.normalize(start)  # fewer than minOffsetsPerTrigger: wait for more
        return o.normalize({**end, **self._due(start)})

    def _due(self, start: dict[str, int]) -> o.Offsets:
        """How far each timer extent is read now: to the due cut when a record is due
        since its offset (else it stays, so an idle queue makes no empty micro-batches)."""
        cut = self._due_target if self._due_target is not None else due_cut()
        out: o.Offsets = {}
        asked = [
            (extent, view, start.get(o.due_key(extent), 0))
            for extent, view in self._extents.items()
            if not view.plain and cut > start.get(o.due_key(extent), 0)
        ]
        try:
            creds = self._access.credentials(extent for extent, _, _ in asked)
        except Unavailable as err:  # the frontend restarts: read them later
            log.warning("cannot get read grants for %s: %s", self.options.queue, err)
            return out
        for extent, view, since in asked:
            try:
                with StoreReader(list(view.stores), credential=creds[extent]) as reader:
                    if reader.has_due(extent, since, cut):
                        out[o.due_key(extent)] = cut
            except CheramiError as err:  # its replicas are out: read it later
                log.warning("cannot read timer extent %s: %s", extent, err)
        return out

    def reportLatestOffset(self) -> dict[str, int] | None:
        return self._latest

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._refresh()
        self._due_target = due_cut()

    # planning and reading
    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        if not self._group_known:
            self._group_offsets()  # a restart from a checkpoint: learn the group's start time
        plan = o.ranges(start, end)
        if any(e not in self._extents for e, _, _ in [*plan, *o.due_ranges(start, end)]):
            self._refresh()
        due = o.due_ranges(start, end)
        for extent, first, stop in plan:
            if extent not in self._extents:
                self._data_lost(f"extent {extent} was deleted before seq {first}..{stop - 1} "
                                "was read")  # fmt: skip
        for extent, from_ms, to_ms in due:
            if extent not in self._extents:
                self._data_lost(f"timer extent {extent} was deleted before the messages due "
                                f"from {from_ms} to {to_ms} ms were read")  # fmt: skip
        reads = [(e, a, b, False) for e, a, b in plan if e in self._extents]
        reads += [(e, a, b, True) for e, a, b in due if e in self._extents]
        creds = self._access.credentials(e for e, _, _, _ in reads) if reads else {}
        keep, fail_on_loss = self._keep(), self.options.fail_on_data_loss
        return [
            ExtentRange(e, list(self._extents[e].stores), first, stop, creds[e],
                        self._access.renewer, keep, fail_on_loss, due=is_due)
            for e, first, stop, is_due in reads
        ]  # fmt: skip

    def _keep(self) -> RecordFilter | None:
        """Records enqueued before the group's start or ``startingTimestamp``, or at or
        after ``endingTimestamp``, are dropped in the worker."""
        low = max(self._start_ms, self.options.start_ms or 0) or None
        end = self.options.end_ms
        if low is None and end is None:
            return None
        return RecordFilter(min_ms=low, max_ms=None if end is None else end - 1)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ExtentRange)
        return partition.read(self.schema)

    # acks follow the checkpoint
    def commit(self, end: dict[str, int]) -> None:
        if any(extent not in self._extents for extent in end):
            self._refresh()
        known = {e for e, view in self._extents.items() if view.plain}
        commit_offsets(self._control(), self.options.queue, self.group, end, self._committed, known)

    def stop(self) -> None:
        pass


DUE_GRACE_MS = 500


def due_cut() -> int:
    """The due time a micro-batch reads delayed messages up to (not including): a little
    behind the clock, so a message is never read before it is due and the store has had
    time to take every record due before it."""
    return int(time.time() * 1000) - DUE_GRACE_MS


def commit_offsets(
    control: ControlClient,
    queue: str,
    group: str,
    end: dict[str, int],
    committed: o.Offsets,
    known: set[str],
) -> None:
    """POST the offsets that move the group forward, for the extents the queue still
    has; a failure is logged, never raised (the checkpoint is the truth, and the next
    commit carries the same offsets again)."""
    ahead = {e: n for e, n in o.normalize(end).items() if e in known and n > committed.get(e, 1)}
    if not ahead:
        return
    try:
        committed.update(control.commit(queue, group, ahead))
    except CheramiError as err:
        log.warning("could not commit offsets of group %s on %s: %s", group, queue, err)
