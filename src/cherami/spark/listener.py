"""Make a stream-mode group's ack levels follow a streaming query's progress.

The source's ``commit()`` runs one micro-batch late (Spark commits batch N while it
plans batch N+1, and never commits the last batch of an AvailableNow run). This
listener commits each batch's end offset as soon as the batch is done. It recognises
its source among a query's sources by the offsets' keys (extent ids of its queue) and,
when given ``query_id``, only in that query (two queries may read one queue for two
groups)."""

from __future__ import annotations

import json
import logging
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener

from cherami.errors import CheramiError
from cherami.spark.control import ControlClient
from cherami.spark.offsets import DUE, Offsets
from cherami.spark.streamreader import commit_offsets

log = logging.getLogger("cherami.spark.listener")


def parse_offsets(raw: str | None) -> Offsets | None:
    """A source's offset from a progress report, if it has this source's shape."""
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, dict) or not value:
        return None
    if not all(isinstance(k, str) and type(v) is int for k, v in value.items()):
        return None
    return value


class AckListener(StreamingQueryListener):
    def __init__(
        self,
        url: str,
        queue: str,
        group: str,
        api_key: str | None = None,
        query_id: str | None = None,
    ) -> None:
        self.control = ControlClient(url, api_key)
        self.queue = queue
        self.group = group
        self.query_id = query_id
        self._extents: set[str] = set()
        self.committed: Offsets = {}

    def _ours(self, offsets: Offsets) -> bool:
        """Whether the offsets name extents of this queue (extent ids are random, so one
        shared id is enough; offsets keep extents deleted since)."""
        offsets = {e: n for e, n in offsets.items() if not e.endswith(DUE)}  # timer extents
        if not set(offsets) <= self._extents:
            try:
                self._extents = {e.id for e in self.control.extents(self.queue) if e.plain}
            except CheramiError as err:
                log.warning("cannot list extents of %s: %s", self.queue, err)
        return not set(offsets).isdisjoint(self._extents)

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        if self.query_id is not None and str(event.progress.id) != self.query_id:
            return
        self._commit([source.endOffset for source in event.progress.sources])

    def settle(self, query: Any) -> None:
        """Commit the query's last progress now: Spark hands progress to listeners
        asynchronously, so a driver that exits right after an AvailableNow run ends
        calls this first (or the group stays one batch behind its checkpoint)."""
        progress = query.lastProgress
        if progress is not None:
            self._commit([source["endOffset"] for source in progress["sources"]])

    def _commit(self, ends: list[str | None]) -> None:
        for raw in ends:
            offsets = parse_offsets(raw if isinstance(raw, str) or raw is None else json.dumps(raw))
            if offsets is not None and self._ours(offsets):
                commit_offsets(self.control, self.queue, self.group, offsets, self.committed,
                               self._extents)  # fmt: skip

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass
