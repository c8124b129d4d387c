"""Throughput of the Spark source (streaming read, batch read, write) beside the plain
Python streaming consumer, in one run.

Publishes N retained messages of S bytes to a queue, then:

* Spark streaming read: ``readStream.format("cherami")`` on a stream-mode group,
  ``Trigger.AvailableNow``, into the ``noop`` sink (the rows are materialised, then
  dropped), after a small warm-up query that starts Spark's Python workers;
* Spark batch read: ``read.format("cherami")`` of the same messages into ``noop``;
* Spark write: N rows of S bytes into another queue (each row with its dedup id);
* Python: ``AsyncClient.consumer`` on a competing group, acking every message.

    python benchmarks/spark_read.py [--messages 1000000] [--size 256] [--extents 2]

Prints msgs/s for each. The streaming figure is given over the whole query (start to
termination) and over its micro-batches alone (the sum of their trigger times)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cherami.spark  # noqa: E402  (sets PYSPARK_PYTHON and SPARK_LOCAL_IP)
from cherami.client.asyncclient import AsyncClient  # noqa: E402
from cherami.cluster.nodeproc import NodeProcess as ServerProcess  # noqa: E402
from cherami.wire.handshake import SECRET_FILE_ENV  # noqa: E402

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

QUEUE, WARMUP, COPY = "bench-spark-read", "bench-warmup", "bench-spark-write"
SPARK_GROUP, PYTHON_GROUP = "spark", "python"


async def prepare(url: str, queue: str, messages: int, size: int, extents: int) -> float:
    """Create the queue and groups, publish; returns the publish rate."""
    async with AsyncClient(url) as client:
        await client.create_queue(queue, min_extents=extents)
        await client.create_group(queue, SPARK_GROUP, type="stream")
        await client.create_group(queue, PYTHON_GROUP)
        body = os.urandom(size)
        started = time.perf_counter()
        async with client.publisher(queue, max_in_flight=16) as publisher:
            futures = []
            for start in range(0, messages, 1000):
                futures.append(await publisher.send([body] * min(1000, messages - start)))
            await asyncio.gather(*futures)
        return messages / (time.perf_counter() - started)


def spark_read(
    spark: SparkSession, url: str, queue: str, per_trigger: int | None
) -> tuple[int, float, float]:
    """Rows read, seconds for the whole query, seconds in micro-batches."""
    reader = spark.readStream.format("cherami").option("url", url).option("queue", queue)
    reader = reader.option("group", SPARK_GROUP)
    if per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(per_trigger))
    with tempfile.TemporaryDirectory() as checkpoint:
        started = time.perf_counter()
        writer = reader.load().writeStream.format("noop").option("checkpointLocation", checkpoint)
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
        elapsed = time.perf_counter() - started
        progress = query.recentProgress
    rows = sum(p["numInputRows"] for p in progress)
    batches = sum(p["durationMs"].get("triggerExecution", 0) for p in progress if p["numInputRows"])
    return rows, elapsed, batches / 1000


def batch_read(spark: SparkSession, url: str, queue: str) -> float:
    """Seconds of a batch read of every retained message into ``noop``."""
    started = time.perf_counter()
    df = spark.read.format("cherami").option("url", url).option("queue", queue).load()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def spark_write(spark: SparkSession, url: str, queue: str, messages: int, size: int) -> float:
    """Seconds to write ``messages`` rows of ``size`` bytes (built by Spark) to ``queue``."""
    from pyspark.sql import functions as F

    rows = spark.range(messages).select(F.expr(f"repeat('x', {size})").alias("body"))
    started = time.perf_counter()
    rows.write.format("cherami").option("url", url).option("queue", queue).mode("append").save()
    return time.perf_counter() - started


async def python_read(url: str, messages: int) -> tuple[int, float]:
    async with (
        AsyncClient(url) as client,
        client.consumer(QUEUE, PYTHON_GROUP, credit=4000) as consumer,
    ):
        got = 0
        started = time.perf_counter()
        while got < messages:
            batch = await consumer.get_batch(1000, timeout=30)
            if not batch:
                break
            consumer.ack(*batch)
            got += len(batch)
        await consumer.flush()
        return got, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--extents", type=int, default=2, help="open plain extents (partitions)")
    parser.add_argument("--stores", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--per-trigger", type=int, default=None, help="maxMessagesPerTrigger")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")

    with tempfile.TemporaryDirectory() as data:
        node = ServerProcess(Path(data) / "node", stores=args.stores).start()
        try:
            url = node.url
            os.environ[SECRET_FILE_ENV] = str(Path(data) / "node" / "cluster.secret")
            rate = asyncio.run(prepare(url, QUEUE, args.messages, args.size, args.extents))
            asyncio.run(prepare(url, WARMUP, 20_000, args.size, args.extents))
            print(f"published {args.messages:,} x {args.size} B in {args.extents} extents "
                  f"({args.stores} store hosts): {rate:,.0f} msgs/s")  # fmt: skip
            spark = cherami.spark.session("bench-spark-read", master=args.master,
                                          **{"spark.ui.showConsoleProgress": "false"})  # fmt: skip
            spark.sparkContext.setLogLevel("ERROR")
            try:
                _, cold, _ = spark_read(spark, url, WARMUP, None)
                print(f"spark warm-up query (20,000 rows; starts the Python workers): {cold:.1f} s")
                rows, total, batches = spark_read(spark, url, QUEUE, args.per_trigger)
                print(f"spark streaming read ({args.master}, AvailableNow, noop sink): "
                      f"{rows:,} rows, {rows / total:,.0f} msgs/s over the query "
                      f"({total:.1f} s), {rows / batches:,.0f} msgs/s in micro-batches "
                      f"({batches:.1f} s)")  # fmt: skip
                seconds = batch_read(spark, url, QUEUE)
                print(f"spark batch read (noop sink): {args.messages:,} rows, "
                      f"{args.messages / seconds:,.0f} msgs/s ({seconds:.1f} s)")  # fmt: skip
                asyncio.run(prepare(url, COPY, 0, args.size, args.extents))
                seconds = spark_write(spark, url, COPY, args.messages, args.size)
                print(f"spark write ({args.messages:,} rows of {args.size} B, dedup ids): "
                      f"{args.messages / seconds:,.0f} msgs/s ({seconds:.1f} s)")  # fmt: skip
            finally:
                spark.stop()
            got, seconds = asyncio.run(python_read(url, args.messages))
            print(f"python consumer (AsyncClient.consumer, competing group, acks): {got:,} msgs, "
                  f"{got / seconds:,.0f} msgs/s ({seconds:.1f} s)")  # fmt: skip
        finally:
            node.stop()


if __name__ == "__main__":
    main()
