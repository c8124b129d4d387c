"""Stored records to Arrow record batches, as a worker builds them (no Spark session, no
sockets): every column of plain and timer records, attributes, dead-lettered ids and the
record filter."""

from __future__ import annotations

from datetime import UTC, datetime

from cherami.spark.schema import SCHEMA, RecordFilter, arrow_schema, source_schema, to_arrow
from cherami.spark.storereader import Batch
from cherami.wire.keys import plain_key, timer_key
from cherami.wire.records import Record, encode_record

EXTENT = "00aa11bb22cc33dd"
T0 = 1_780_000_000_000


def _batch(keys: list[bytes], records: list[Record]) -> Batch:
    return Batch(keys, [encode_record(r) for r in records])


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def test_plain_records_become_every_column() -> None:
    records = [Record(T0 + i, T0 + i + (5000 if i == 1 else 0), b"b%d" % i) for i in range(3)]
    out = to_arrow(arrow_schema(SCHEMA.json()), EXTENT, _batch(
        [plain_key(s) for s in (7, 8, 9)], records))  # fmt: skip
    assert out is not None
    assert out.to_pylist() == [
        {"id": f"{EXTENT}:{7 + i}", "extent": EXTENT, "seq": 7 + i, "body": b"b%d" % i,
         "attributes": [], "enqueued_at": _utc(T0 + i),
         "delivery_at": _utc(T0 + i + (5000 if i == 1 else 0))}
        for i in range(3)
    ]  # fmt: skip


def test_attributes_dead_lettered_ids_and_timer_keys() -> None:
    records = [
        Record(T0, T0 + 9000, b"a", {"k": "v", "x": "y"}),
        Record(T0, T0 + 9500, b"b", None, orig_id="ffee:4"),
    ]
    keys = [timer_key(T0 + 9000, 3), timer_key(T0 + 9500, 5)]
    out = to_arrow(arrow_schema(SCHEMA.json()), EXTENT, _batch(keys, records))
    assert out is not None
    rows = out.to_pylist()
    assert [r["seq"] for r in rows] == [3, 5]
    assert [r["id"] for r in rows] == [f"{EXTENT}:3", "ffee:4"]
    assert [r["attributes"] for r in rows] == [[("k", "v"), ("x", "y")], []]


def test_filter_and_schema_without_attributes() -> None:
    records = [Record(T0 + i * 1000, T0 + i * 1000, b"x") for i in range(5)]
    keys = [plain_key(s) for s in range(1, 6)]
    target = arrow_schema(source_schema(include_headers=False).json())
    keep = RecordFilter(min_ms=T0 + 1000, max_ms=T0 + 3000, max_seq=3)
    out = to_arrow(target, EXTENT, _batch(keys, records), keep)
    assert out is not None
    assert "attributes" not in out.schema.names
    assert out.column("seq").to_pylist() == [2, 3]
    assert to_arrow(target, EXTENT, _batch(keys, records), RecordFilter(min_seq=6)) is None
