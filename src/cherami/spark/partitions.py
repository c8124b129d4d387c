"""Spark input partitions: everything a worker needs to read one extent range by itself
(workers are separate processes that never talk to the driver or the frontend)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StructType

from cherami.spark.schema import RecordFilter, arrow_batches
from cherami.spark.storereader import StoreReader
from cherami.wire.handshake import cluster_key

if TYPE_CHECKING:
    import pyarrow as pa


class ExtentRange(InputPartition):
    """Sequence numbers ``first_seq`` up to (not including) ``end_seq`` of a plain extent;
    ``end_seq`` 0 reads everything the replica holds (timer extents in batch reads)."""

    def __init__(
        self,
        extent: str,
        stores: list[str],
        first_seq: int,
        end_seq: int,
        keep: RecordFilter | None = None,
    ) -> None:
        super().__init__(extent)
        self.extent = extent
        self.stores = stores
        self.first_seq = first_seq
        self.end_seq = end_seq
        self.keep = keep
        # made on the driver: workers read with the driver's cluster key (its
        # CHERAMI_CLUSTER_SECRET or CHERAMI_CLUSTER_SECRET_FILE), not their own environment
        self.key = cluster_key()

    def __repr__(self) -> str:
        return f"ExtentRange({self.extent}, {self.first_seq}..{self.end_seq})"

    def read(self, schema: StructType) -> Iterator[pa.RecordBatch]:
        with StoreReader(self.stores, key=self.key) as reader:
            if self.end_seq:
                batches = reader.read_range(self.extent, self.first_seq, self.end_seq)
            else:
                batches = reader.read_all(self.extent)
            yield from arrow_batches(schema, self.extent, batches, self.keep)
