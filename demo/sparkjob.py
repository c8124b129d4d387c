"""The analytics side: a Spark Structured Streaming job on the queue's stream-mode group
that counts crashes per signature per minute into Parquet."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cherami.spark import follow_acks
from cherami.spark.control import ControlClient

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

REPORT = (
    "uuid STRING, product STRING, version STRING, platform STRING, signature STRING, "
    "crash_time TIMESTAMP"
)
MALFORMED = "(malformed)"


class CrashAggregation:
    """Each micro-batch's counts go to ``<out>/batches/batch_id=<n>`` (overwritten when a
    batch is replayed, so a replay never counts twice); ``finish()`` folds them into
    ``<out>/crashes_per_signature_per_minute``."""

    def __init__(self, spark: SparkSession, url: str, queue: str, group: str, out: Path) -> None:
        self.spark, self.url, self.queue, self.group = spark, url, queue, group
        self.out = out
        self.batches = out / "batches"
        self.result = out / "crashes_per_signature_per_minute"
        self.query: StreamingQuery | None = None
        self._listener: Any = None

    def start(self, trigger_seconds: float = 2.0) -> StreamingQuery:
        from pyspark.sql import functions as F

        shutil.rmtree(self.out, ignore_errors=True)
        reports = (
            self.spark.readStream.format("cherami").option("url", self.url)
            .option("queue", self.queue).option("group", self.group).load()
        )  # fmt: skip
        report = F.from_json(F.col("body").cast("string"), REPORT)
        rows = reports.select(report.alias("r"), "enqueued_at").select(
            F.coalesce(F.col("r.signature"), F.lit(MALFORMED)).alias("signature"),
            F.date_trunc("minute", F.coalesce(F.col("r.crash_time"), F.col("enqueued_at")))
            .alias("minute"),
        )  # fmt: skip
        self.query = (
            rows.writeStream.foreachBatch(self._write_batch)
            .option("checkpointLocation", str(self.out / "checkpoint"))
            .trigger(processingTime=f"{trigger_seconds} seconds")
            .start()
        )
        self._listener = follow_acks(self.spark, self.url, self.queue, self.group, query=self.query)
        return self.query

    def _write_batch(self, batch: DataFrame, batch_id: int) -> None:
        counts = batch.groupBy("minute", "signature").count()
        counts.write.mode("overwrite").parquet(str(self.batches / f"batch_id={batch_id}"))

    def caught_up(self) -> bool:
        """The group's ack levels (which follow the checkpoint) reached the queue's end."""
        control = ControlClient(self.url)
        ends = {e.id: e.last_seq + 1 for e in control.extents(self.queue) if e.plain and e.last_seq}
        offsets, _ = control.offsets(self.queue, self.group)
        return all(offsets.get(extent, 1) >= end for extent, end in ends.items())

    def wait_caught_up(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.query is not None and self.query.exception() is not None:
                raise RuntimeError(f"the Spark job failed: {self.query.exception()}")
            if self.caught_up():
                return True
            time.sleep(0.5)
        return False

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()
        if self._listener is not None:
            self.spark.streams.removeListener(self._listener)
            self._listener = None

    def finish(self) -> list[Any]:
        """Fold the per-batch counts; rows of (minute, signature, crashes)."""
        from pyspark.sql import functions as F

        if not self.batches.exists():
            return []
        per_batch = self.spark.read.parquet(str(self.batches))
        totals = per_batch.groupBy("minute", "signature").agg(F.sum("count").alias("crashes"))
        totals.coalesce(1).write.mode("overwrite").parquet(str(self.result))
        return self.spark.read.parquet(str(self.result)).orderBy("minute", "signature").collect()
