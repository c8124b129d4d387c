"""The rows the source produces, built as Arrow record batches straight from stored
records (no per-row Python objects on the way to the JVM)."""

from __future__ import annotations

import json
import sys
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import accumulate
from typing import TYPE_CHECKING

from pyspark.sql.types import (
    BinaryType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from cherami.wire.keys import seq_of
from cherami.wire.records import Record, decode_record

if TYPE_CHECKING:
    import pyarrow as pa

    from cherami.spark.storereader import Batch

SCHEMA = StructType([
    StructField("id", StringType()),
    StructField("extent", StringType()),
    StructField("seq", LongType()),
    StructField("body", BinaryType()),
    StructField("attributes", MapType(StringType(), StringType())),
    StructField("enqueued_at", TimestampType()),
    StructField("delivery_at", TimestampType()),
])  # fmt: skip


def source_schema(include_headers: bool = True) -> StructType:
    """The rows of a read; without ``attributes`` when ``includeHeaders=false``."""
    if include_headers:
        return SCHEMA
    return StructType([f for f in SCHEMA.fields if f.name != "attributes"])


def check_schema(schema: StructType, include_headers: bool = True) -> StructType:
    """The schema Spark asks for must be this source's (columns may not be renamed)."""
    expected = source_schema(include_headers)
    if schema.fieldNames() != expected.fieldNames():
        raise ValueError(f"the cherami source produces {expected.simpleString()}")
    return schema


@cache
def arrow_schema(schema_json: str) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(StructType.fromJson(json.loads(schema_json)), timezone="UTC")


@dataclass(frozen=True, slots=True)
class RecordFilter:
    """Which records to keep: enqueue time in ``[min_ms, max_ms]`` and sequence number
    in ``[min_seq, max_seq]`` (None: unbounded)."""

    min_ms: int | None = None
    max_ms: int | None = None
    min_seq: int | None = None
    max_seq: int | None = None


def to_arrow(
    schema: pa.Schema, extent: str, batch: Batch, keep: RecordFilter | None = None
) -> pa.RecordBatch | None:
    """One record batch for the records of ``batch``, or None when none is kept."""
    import pyarrow as pa
    import pyarrow.compute as pc

    records = [decode_record(raw) for raw in batch.records]
    seqs = pa.array(_seqs(batch.keys), pa.int64())
    stamp = schema.field("enqueued_at").type
    enqueued = pa.array([r.enqueued_ms for r in records], pa.int64())
    if any(r.orig_id for r in records):
        ids = pa.array([r.orig_id or f"{extent}:{seq_of(k)}" for r, k in
                        zip(records, batch.keys, strict=True)], pa.string())  # fmt: skip
    else:
        ids = pc.binary_join_element_wise(f"{extent}:", pc.cast(seqs, pa.string()), "")
    columns = [
        ids,
        pa.array([extent] * len(records), pa.string()),
        seqs,
        pa.array([r.body for r in records], pa.binary()),
        pc.multiply(enqueued, 1000).cast(stamp),
        pc.multiply(pa.array([r.delivery_ms for r in records], pa.int64()), 1000).cast(stamp),
    ]
    if "attributes" in schema.names:
        columns.insert(4, _attributes(schema.field("attributes").type, records))
    out = pa.RecordBatch.from_arrays(columns, schema=schema)
    if keep is not None:
        out = out.filter(_mask(keep, seqs, enqueued))
    return out if out.num_rows else None


def _attributes(kind: pa.DataType, records: list[Record]) -> pa.Array:
    import pyarrow as pa

    attributes = [r.attributes or {} for r in records]
    ends = pa.array([0, *accumulate(map(len, attributes))], pa.int32())
    return pa.MapArray.from_arrays(
        ends,
        pa.array([k for a in attributes for k in a], pa.string()),
        pa.array([v for a in attributes for v in a.values()], pa.string()),
        type=kind,
    )


def _seqs(keys: list[bytes]) -> Sequence[int]:
    """The sequence numbers of storage keys (plain keys: 8 bytes, big-endian)."""
    if keys and all(len(k) == 8 for k in keys):
        seqs = array("Q", b"".join(keys))
        if sys.byteorder == "little":
            seqs.byteswap()
        return seqs
    return [seq_of(k) for k in keys]


def _mask(keep: RecordFilter, seqs: pa.Array, enqueued: pa.Array) -> pa.Array:
    import pyarrow as pa
    import pyarrow.compute as pc

    mask = pa.array([True] * len(seqs))
    for values, low, high in ((seqs, keep.min_seq, keep.max_seq),
                              (enqueued, keep.min_ms, keep.max_ms)):  # fmt: skip
        if low is not None:
            mask = pc.and_(mask, pc.greater_equal(values, low))
        if high is not None:
            mask = pc.and_(mask, pc.less_equal(values, high))
    return mask


def arrow_batches(
    schema: StructType, extent: str, batches: Iterator[Batch], keep: RecordFilter | None = None
) -> Iterator[pa.RecordBatch]:
    target = arrow_schema(schema.json())
    for batch in batches:
        out = to_arrow(target, extent, batch, keep)
        if out is not None:
            yield out
