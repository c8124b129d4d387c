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
termination) and over its micro-batches alone (the sum of their trigger times), with
each micro-batch's phases (Spark's ``durationMs``: latestOffset, queryPlanning,
walCommit, addBatch, commitOffsets) and the CPU seconds per message of the Spark
processes (the JVM and its Python workers and planner) and of the node. ``--repeat N``
runs the streaming read N times (each from the earliest offsets, fresh checkpoint);
``--parts stream,batch`` runs only those parts (stream, batch, write, python)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cherami.spark  # noqa: E402  (sets PYSPARK_PYTHON and SPARK_LOCAL_IP)
from cherami.client.asyncclient import AsyncClient  # noqa: E402
from cherami.devcluster.nodeproc import NodeProcess as ServerProcess  # noqa: E402

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


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its descendants, counting the children it reaped
    (Spark's Python workers and its planner process come and go)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class CpuMeter:
    """CPU seconds of the Spark processes (this driver, the JVM and its descendants) and
    of the node between ``start()`` and ``stop()``."""

    def __init__(self, spark: SparkSession, node_pid: int) -> None:
        self._jvm = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]
        self._node = node_pid
        self.spark = self.node = 0.0

    def _now(self) -> tuple[float, float]:
        me = psutil.Process().cpu_times()
        return tree_cpu(self._jvm) + me.user + me.system, tree_cpu(self._node)

    def start(self) -> None:
        self._begin = self._now()

    def stop(self) -> None:
        spark, node = self._now()
        self.spark, self.node = spark - self._begin[0], node - self._begin[1]


PHASES = ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets")


def spark_read(
    spark: SparkSession, url: str, queue: str, per_trigger: int | None
) -> tuple[int, float, list[Any]]:
    """Rows read, seconds for the whole query, the query's progress reports (each with
    ``startedAt``: its trigger's start in seconds from the query's start, and the
    query's end as ``queryEnd``)."""
    reader = spark.readStream.format("cherami").option("url", url).option("queue", queue)
    reader = reader.option("group", SPARK_GROUP).option("startingOffsets", "earliest")
    if per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(per_trigger))
    with tempfile.TemporaryDirectory() as checkpoint:
        started, wall = time.perf_counter(), time.time()
        writer = reader.load().writeStream.format("noop").option("checkpointLocation", checkpoint)
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
        elapsed = time.perf_counter() - started
        progress = [{**p, "startedAt": _epoch(p["timestamp"]) - wall,
                     "queryEnd": elapsed} for p in query.recentProgress]  # fmt: skip
    rows = sum(p["numInputRows"] for p in progress)
    return rows, elapsed, progress


def _epoch(timestamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def describe(progress: list[dict[str, Any]]) -> str:
    """One line per micro-batch: when it started (seconds into the query), its rows and
    the milliseconds of each phase; then when the last one ended and the query ended."""
    lines, done = [], 0.0
    for p in progress:
        d = p["durationMs"]
        phases = " ".join(f"{k} {d[k]}" for k in PHASES if k in d)
        lines.append(f"    at {p['startedAt']:.2f} s batch {p['batchId']}: "
                     f"{p['numInputRows']:,} rows, {d.get('triggerExecution', 0)} ms "
                     f"({phases})")  # fmt: skip
        done = p["startedAt"] + d.get("triggerExecution", 0) / 1000
    if progress:
        lines.append(f"    last batch done at {done:.2f} s, query ended at "
                     f"{progress[-1]['queryEnd']:.2f} s")  # fmt: skip
    return "\n".join(lines)


def stream_reads(spark: SparkSession, url: str, node_pid: int, args: argparse.Namespace) -> None:
    meter = CpuMeter(spark, node_pid)
    for _ in range(args.repeat):
        meter.start()
        rows, total, progress = spark_read(spark, url, QUEUE, args.per_trigger)
        meter.stop()
        batches = sum(p["durationMs"].get("triggerExecution", 0)
                      for p in progress if p["numInputRows"]) / 1000  # fmt: skip
        print(f"spark streaming read ({args.master}, AvailableNow, noop sink): "
              f"{rows:,} rows, {rows / total:,.0f} msgs/s over the query "
              f"({total:.1f} s), {rows / batches:,.0f} msgs/s in micro-batches "
              f"({batches:.1f} s); CPU per message: Spark {meter.spark / rows * 1e6:.2f} us, "
              f"node {meter.node / rows * 1e6:.2f} us; load {os.getloadavg()[0]:.1f}")  # fmt: skip
        print(describe(progress))


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
    parser.add_argument("--repeat", type=int, default=1, help="streaming reads to run")
    parser.add_argument("--parts", default="stream,batch,write,python",
                        help="comma-separated: stream, batch, write, python")  # fmt: skip
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")

    with tempfile.TemporaryDirectory() as data:
        node = ServerProcess(Path(data) / "node", stores=args.stores).start()
        try:
            url = node.url
            # Spark reads the store hosts with read grants (docs/spark.md): no secret
            rate = asyncio.run(prepare(url, QUEUE, args.messages, args.size, args.extents))
            asyncio.run(prepare(url, WARMUP, 20_000, args.size, args.extents))
            print(f"published {args.messages:,} x {args.size} B in {args.extents} extents "
                  f"({args.stores} store hosts): {rate:,.0f} msgs/s")  # fmt: skip
            spark = cherami.spark.session("bench-spark-read", master=args.master,
                                          **{"spark.ui.showConsoleProgress": "false"})  # fmt: skip
            spark.sparkContext.setLogLevel("ERROR")
            try:
                started = time.perf_counter()
                spark_read(spark, url, WARMUP, None)
                print(f"spark warm-up query (20,000 rows; starts the Python workers): "
                      f"{time.perf_counter() - started:.1f} s")  # fmt: skip
                if "stream" in parts:
                    stream_reads(spark, url, node.proc.pid if node.proc else 0, args)
                if "batch" in parts:
                    seconds = batch_read(spark, url, QUEUE)
                    print(f"spark batch read (noop sink): {args.messages:,} rows, "
                          f"{args.messages / seconds:,.0f} msgs/s ({seconds:.1f} s)")  # fmt: skip
                if "write" in parts:
                    asyncio.run(prepare(url, COPY, 0, args.size, args.extents))
                    seconds = spark_write(spark, url, COPY, args.messages, args.size)
                    print(f"spark write ({args.messages:,} rows of {args.size} B, dedup ids): "
                          f"{args.messages / seconds:,.0f} msgs/s ({seconds:.1f} s)")  # fmt: skip
            finally:
                spark.stop()
            if "python" in parts:
                got, seconds = asyncio.run(python_read(url, args.messages))
                print(f"python consumer (AsyncClient.consumer, competing group, acks): "
                      f"{got:,} msgs, {got / seconds:,.0f} msgs/s ({seconds:.1f} s)")  # fmt: skip
        finally:
            node.stop()


if __name__ == "__main__":
    main()
