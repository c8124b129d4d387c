"""A streaming query whose driver is SIGKILLed in the middle of a micro-batch, restarted
from its checkpoint into the same Parquet sink: every message is in the sink once, and
the group's ack levels are at the checkpoint (never ahead of it, at its end after the
restart). The driver is a process of its own, built the plain way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.spark.support import eventually, group_offsets, publish, queue_ends, setup_queue
from tests.support.server import ServerProcess, unique

pytestmark = pytest.mark.spark

DRIVER = """
import sys, time
from pyspark.sql import SparkSession, functions as F
from cherami.spark import CheramiDataSource, follow_acks

url, queue, group, out, checkpoint, trigger = sys.argv[1:7]
spark = (SparkSession.builder.master("local[1]").appName("killed-driver")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1")
         # as the tests' session: C1 only and the serial GC, so the JVM starts sooner
         .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
         .getOrCreate())
spark.dataSource.register(CheramiDataSource)
slow = F.udf(lambda body: (time.sleep(0.002), body)[1], "binary")  # batches take a while
reports = (spark.readStream.format("cherami").option("url", url).option("queue", queue)
           .option("group", group).option("maxOffsetsPerTrigger", "500").load()
           .select("id", slow("body").cast("string").alias("body")))
writer = (reports.writeStream.format("parquet").option("path", out)
          .option("checkpointLocation", checkpoint))
writer = writer.trigger(availableNow=True) if trigger == "availableNow" else writer.trigger(
    processingTime="50 milliseconds")
query = writer.start()
acks = follow_acks(spark, url, queue, group, query=query)
query.awaitTermination()
acks.settle(query)
"""


def source_offsets(checkpoint: Path, batch: int) -> dict[str, int]:
    """The plain extents' end offsets of a batch in Spark's offset log."""
    lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
    return {e: n for e, n in json.loads(lines[2]).items() if not e.endswith("/due")}


def batches(log: Path) -> list[int]:
    return sorted(int(p.name) for p in log.glob("[0-9]*")) if log.is_dir() else []


def sink_files(out: Path) -> set[str]:
    """The Parquet files the sink committed (its _spark_metadata log): files a killed
    batch wrote but never committed are not part of the table."""
    files: set[str] = set()
    for log in sorted((out / "_spark_metadata").iterdir()):
        if log.name.startswith("."):
            continue
        for line in log.read_text().splitlines()[1:]:
            entry = json.loads(line)
            if entry["action"] == "add":
                files.add(entry["path"].removeprefix("file://"))
            else:
                files.discard(entry["path"].removeprefix("file://"))
    return files


def test_a_killed_driver_restarts_from_its_checkpoint_exactly_once(
    server: ServerProcess, tmp_path: Path
) -> None:
    url, queue = server.url, unique()
    setup_queue(url, queue, {"etl": "stream"}, min_extents=2)
    sent = [f"m{i}" for i in range(3000)]
    publish(url, queue, sent)
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def driver(trigger: str) -> subprocess.Popen[bytes]:
        args = [url, queue, "etl", str(out), str(checkpoint), trigger]
        return subprocess.Popen([sys.executable, str(script), *args], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip

    first = driver("processingTime")
    try:
        # mid-batch: batch N is in the offset log and not yet in the commit log (N >= 2)
        def mid_batch() -> bool:
            started, done = batches(checkpoint / "offsets"), batches(checkpoint / "commits")
            return bool(started) and started[-1] >= 2 and started[-1] not in done

        eventually(mid_batch, 120, 0.01)
        os.killpg(first.pid, signal.SIGKILL)  # the driver and its JVM, at once
    finally:
        first.wait(30)
    committed = batches(checkpoint / "commits")
    assert batches(checkpoint / "offsets")[-1] > committed[-1], "killed in the middle of a batch"
    at_checkpoint = source_offsets(checkpoint, committed[-1])
    acked = group_offsets(url, queue, "etl")
    assert all(acked.get(e, 1) <= n for e, n in at_checkpoint.items()), "acks never ahead"
    assert sum(n - 1 for n in at_checkpoint.values()) < len(sent), "killed before the end"

    second = driver("availableNow")
    assert second.wait(180) == 0
    rows = pq.ParquetDataset(sorted(sink_files(out))).read().to_pylist()
    assert len(rows) == len(sent) and {r["body"] for r in rows} == set(sent), "each once"
    assert len({r["id"] for r in rows}) == len(rows)
    ends = queue_ends(url, queue)
    assert source_offsets(checkpoint, batches(checkpoint / "commits")[-1]) == ends
    eventually(lambda: group_offsets(url, queue, "etl") == ends, 15)  # acks at the checkpoint
