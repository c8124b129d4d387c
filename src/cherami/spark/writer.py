"""Publish a DataFrame (batch or streaming) to a queue.

Columns: ``body`` (string or binary, required), ``attributes`` (map of string to string,
optional), ``delay_seconds`` (number, optional); other columns are ignored. Each task
publishes its rows through the streaming publisher and returns once every message is
durable. Delivery into the queue is at least once: a retried task publishes its rows
again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, MapType, NumericType, StringType, StructType

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


def check_input(schema: StructType) -> None:
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
    delay = fields.get("delay_seconds")
    if delay is not None and not isinstance(delay, NumericType):
        raise InvalidRequest("the 'delay_seconds' column must be a number")


def to_messages(batch: pa.RecordBatch) -> list[OutgoingMessage]:
    names = batch.schema.names
    bodies = batch.column(names.index("body")).to_pylist()
    attrs: list[Any] = (
        batch.column(names.index("attributes")).to_pylist()
        if "attributes" in names
        else [None] * len(bodies)
    )
    delays: list[Any] = (
        batch.column(names.index("delay_seconds")).to_pylist()
        if "delay_seconds" in names
        else [None] * len(bodies)
    )
    out = []
    for body, attributes, delay in zip(bodies, attrs, delays, strict=True):
        if body is None:
            raise InvalidRequest("a row to publish has a null body")
        out.append(
            OutgoingMessage(body, dict(attributes) if attributes else None, float(delay or 0))
        )
    return out


async def _publish(options: Options, batches: Iterator[pa.RecordBatch]) -> int:
    from cherami.client.asyncclient import AsyncClient

    sent = 0
    client = AsyncClient(options.url, options.api_key)
    async with client, client.publisher(options.queue, MAX_IN_FLIGHT) as publisher:
        futures = []
        for batch in batches:
            messages = to_messages(batch)
            for start in range(0, len(messages), options.publish_batch):
                chunk = messages[start : start + options.publish_batch]
                futures.append(await publisher.send(chunk))
                sent += len(chunk)
        await asyncio.gather(*futures)
    return sent


def publish(options: Options, batches: Iterator[pa.RecordBatch]) -> Published:
    return Published(asyncio.run(_publish(options, batches)))


class CheramiWriter(DataSourceArrowWriter):
    def __init__(self, options: Options) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        return publish(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.count for m in messages if isinstance(m, Published))
        log.info("published %d messages to %s", total, self.options.queue)


class CheramiStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: Options) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        return publish(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        total = sum(m.count for m in messages if isinstance(m, Published))
        log.info("batch %d: published %d messages to %s", batchId, total, self.options.queue)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("batch %d aborted; its published messages stay in the queue", batchId)
