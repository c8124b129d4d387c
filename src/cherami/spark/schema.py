"""The rows the source produces, built as Arrow record batches straight from stored
records (no per-row Python objects on the way to the JVM)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from itertools import accumulate
from operator import attrgetter
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
from cherami.wire.records import Record, decode_records

if TYPE_CHECKING:
    import numpy as np
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


_ENQUEUED = attrgetter("enqueued_ms")
_DELIVERY = attrgetter("delivery_ms")
_BODY = attrgetter("body")
_ATTRIBUTES = attrgetter("attributes")
_ORIG_ID = attrgetter("orig_id")


def to_arrow(
    schema: pa.Schema, extent: str, batch: Batch, keep: RecordFilter | None = None
) -> pa.RecordBatch | None:
    """One record batch for the records of ``batch``, or None when none is kept.

    Columns are built by C-level loops (``map`` over the decoded records into numpy
    or pyarrow): no Python code runs per record unless records carry attributes or a
    dead-lettered message's original id."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    records = decode_records(batch.records)
    n = len(records)
    seqs = pa.array(_seqs(batch.keys))
    stamp = schema.field("enqueued_at").type
    enqueued = np.fromiter(map(_ENQUEUED, records), np.int64, n)
    delivery = np.fromiter(map(_DELIVERY, records), np.int64, n)
    if any(map(_ORIG_ID, records)):
        ids = pa.array([r.orig_id or f"{extent}:{seq_of(k)}" for r, k in
                        zip(records, batch.keys, strict=True)], pa.string())  # fmt: skip
    else:
        ids = pc.binary_join_element_wise(f"{extent}:", pc.cast(seqs, pa.string()), "")
    columns = [
        ids,
        pa.repeat(pa.scalar(extent, pa.string()), n),
        seqs,
        pa.array(map(_BODY, records), pa.binary(), size=n),
        pa.array(enqueued * 1000, stamp),
        pa.array(delivery * 1000, stamp),
    ]
    if "attributes" in schema.names:
        columns.insert(4, _attributes(schema.field("attributes").type, records))
    out = pa.RecordBatch.from_arrays(columns, schema=schema)
    if keep is not None:
        out = out.filter(_mask(keep, seqs, pa.array(enqueued)))
    return out if out.num_rows else None


def _attributes(kind: pa.DataType, records: list[Record]) -> pa.Array:
    """The attributes as a map column (an empty map for a record without any)."""
    import pyarrow as pa

    attributes = list(map(_ATTRIBUTES, records))
    if not any(attributes):  # the common case: no record has attributes
        ends = pa.repeat(pa.scalar(0, pa.int32()), len(records) + 1)
        empty = pa.array([], pa.string())
        return pa.MapArray.from_arrays(ends, empty, empty, type=kind)
    maps = [a or {} for a in attributes]
    ends = pa.array([0, *accumulate(map(len, maps))], pa.int32())
    return pa.MapArray.from_arrays(
        ends,
        pa.array([k for a in maps for k in a], pa.string()),
        pa.array([v for a in maps for v in a.values()], pa.string()),
        type=kind,
    )


def _seqs(keys: list[bytes]) -> np.ndarray:
    """The sequence numbers of storage keys: the last 8 bytes, big-endian (plain keys are
    8 bytes, timer keys 16, and no key is shorter than 8)."""
    import numpy as np

    joined = b"".join(keys)
    for width in (8, 16):
        if len(joined) == width * len(keys):
            words = np.frombuffer(joined, ">u8").reshape(len(keys), width // 8)
            return words[:, -1].astype(np.int64)
    return np.array([seq_of(k) for k in keys], np.int64)


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
