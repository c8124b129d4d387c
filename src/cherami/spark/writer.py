"""Publish a DataFrame (batch or streaming) to a queue, exactly once.

Columns: ``body`` (string or binary, required), ``attributes`` (map of string to string,
optional), ``delay_seconds`` (number, optional), ``key`` (string, optional: the
ordering key, docs/api.md "Ordering keys"), the TTL as ``expires_in_seconds`` (number,
optional) or ``expires_at`` (timestamp, optional); other columns are ignored. Each task
publishes its rows through the streaming publisher and returns once every message is
durable.

Every row carries a deduplication id (``dedup_id``), the same in every attempt of its
task: ``spark:<write>:<partition>:<row>`` for batch writes (``<write>`` made on the
driver once per write), ``spark:<query id>:<batch id>:<partition>:<row>`` for
streaming writes (a restarted query replays a batch with the same id), or the value of
the column named by ``dedupIdColumn``. The queue stores a repeated id within its dedup
window once, so a retried task or a replayed micro-batch publishes each row once."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    MapType,
    NumericType,
    StringType,
    StructType,
    TimestampType,
)

from cherami.client.models import OutgoingMessage
from cherami.errors import InvalidRequest
from cherami.spark.options import Options

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("cherami.spark.writer")

MAX_IN_FLIGHT = 8


@dataclass
class Published(WriterCommitMessage):
    count: int


def check_input(schema: StructType, column: str | None = None) -> None:
    fields = {f.name: f.dataType for f in schema.fields}
    if not isinstance(fields.get("body"), StringType | BinaryType):
        raise InvalidRequest("writing to cherami needs a 'body' column of string or binary")
    attributes = fields.get("attributes")
    if attributes is not None and not (
        isinstance(attributes, MapType)
        and isinstance(attributes.keyType, StringType)
        and isinstance(attributes.valueType, StringType)
    ):
        raise InvalidRequest("the 'attributes' column must be a map of string to string")
    for name in ("delay_seconds", "expires_in_seconds"):
        if name in fields and not isinstance(fields[name], NumericType):
            raise InvalidRequest(f"the {name!r} column must be a number")
    if "expires_at" in fields and not isinstance(fields["expires_at"], TimestampType):
        raise InvalidRequest("the 'expires_at' column must be a timestamp")
    key = fields.get("key")
    if key is not None and not isinstance(key, StringType):
        raise InvalidRequest("the 'key' column must be a string")
    if column is not None and not isinstance(fields.get(column), StringType):
        raise InvalidRequest(f"option 'dedupIdColumn': no string column {column!r} to write")


def to_messages(batch: pa.RecordBatch, dedup_ids: list[str] | None = None) -> list[OutgoingMessage]:
    names = batch.schema.names
    bodies = batch.column(names.index("body")).to_pylist()
    attrs: list[Any] = (
        batch.column(names.index("attributes")).to_pylist()
        if "attributes" in names
        else [None] * len(bodies)
    )
    delays, ttls, expires = (
        batch.column(names.index(name)).to_pylist() if name in names else [None] * len(bodies)
        for name in ("delay_seconds", "expires_in_seconds", "expires_at")
    )
    keys: list[Any] = (
        batch.column(names.index("key")).to_pylist() if "key" in names else [None] * len(bodies)
    )
    ids: list[Any] = dedup_ids if dedup_ids is not None else [None] * len(bodies)
    out = []
    rows = zip(bodies, attrs, delays, ids, keys, ttls, expires, strict=True)
    for body, attributes, delay, dedup_id, key, ttl, expires_at in rows:
        if body is None:
            raise InvalidRequest("a row to publish has a null body")
        out.append(
            OutgoingMessage(
                body,
                dict(attributes) if attributes else None,
                float(delay or 0),
                dedup_id,
                key or None,
                None if ttl is None else float(ttl),
                expires_at,
            )  # fmt: skip
        )
    return out


class DedupIds:
    """The deduplication ids of one task's rows, in order: ``prefix`` and the row's
    index in the task, or the values of the user's column."""

    def __init__(self, prefix: str, column: str | None) -> None:
        self.prefix = prefix
        self.column = column
        self.rows = 0

    def of(self, batch: pa.RecordBatch) -> list[str]:
        if self.column is not None:
            values = batch.column(batch.schema.names.index(self.column)).to_pylist()
            if any(v is None or v == "" for v in values):
                raise InvalidRequest(f"a row to publish has no {self.column!r} (dedupIdColumn)")
            return [str(v) for v in values]
        first, self.rows = self.rows, self.rows + batch.num_rows
        return [f"{self.prefix}{i}" for i in range(first, self.rows)]


def task_prefix(write: str) -> str:
    """``spark:<write>:<partition>:`` for this task; streaming writes name the query and
    the micro-batch (Spark's local properties of the task)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return f"spark:{write}:0:"
    query = ctx.getLocalProperty("sql.streaming.queryId")
    batch = ctx.getLocalProperty("streaming.sql.batchId")
    scope = f"{query}:{batch}" if query and batch is not None else write
    return f"spark:{scope}:{ctx.partitionId()}:"


async def _publish(options: Options, batches: Iterator[pa.RecordBatch], ids: DedupIds) -> int:
    from cherami.client.asyncclient import AsyncClient

    sent = 0
    client = AsyncClient(options.url, options.api_key)
    async with client, client.publisher(options.queue, MAX_IN_FLIGHT) as publisher:
        futures = []
        while True:  # the next rows come in a thread, so acks are taken meanwhile
            batch = await asyncio.to_thread(next, batches, None)
            if batch is None:
                break
            messages = to_messages(batch, ids.of(batch))
            for start in range(0, len(messages), options.publish_batch):
                chunk = messages[start : start + options.publish_batch]
                futures.append(await publisher.send(chunk))
                sent += len(chunk)
        await asyncio.gather(*futures)
    return sent


def publish(options: Options, batches: Iterator[pa.RecordBatch], write: str) -> Published:
    ids = DedupIds(task_prefix(write), options.dedup_id_column)
    return Published(asyncio.run(_publish(options, iter(batches), ids)))


class CheramiWriter(DataSourceArrowWriter):
    def __init__(self, options: Options) -> None:
        self.options = options
        self.write_id = uuid.uuid4().hex  # made on the driver: the same in every task attempt

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        return publish(self.options, iterator, self.write_id)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.count for m in messages if isinstance(m, Published))
        log.info("published %d messages to %s", total, self.options.queue)


class CheramiStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: Options) -> None:
        self.options = options
        self.write_id = uuid.uuid4().hex  # used only if a task names no streaming query

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        return publish(self.options, iterator, self.write_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        total = sum(m.count for m in messages if isinstance(m, Published))
        log.info("batch %d: published %d messages to %s", batchId, total, self.options.queue)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("batch %d aborted; its rows are published once when it runs again", batchId)
