"""Exactly-once writes into a queue: a task whose Python worker is killed after it
published part of its rows is retried, a streaming micro-batch is replayed after a
restart, a DataFrame is written twice with the user's dedup column; the queue ends with
each row once."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import pytest

from tests.spark.support import publish, setup_queue, stream
from tests.support.server import ServerProcess, unique

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark

ARROW_BATCH = "spark.sql.execution.arrow.maxRecordsPerBatch"


def stored(url: str, queue: str) -> int:
    with urllib.request.urlopen(f"{url}/v1/queues/{queue}") as reply:
        return int(json.load(reply)["stats"]["messages_published"])


def write(df: DataFrame, url: str, queue: str, **options: str) -> None:
    writer = df.write.format("cherami").option("url", url).option("queue", queue)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.mode("append").save()


def bodies(spark: SparkSession, url: str, queue: str) -> list[str]:
    df = spark.read.format("cherami").option("url", url).option("queue", queue).load()
    return [bytes(r.body).decode() for r in df.select("body").collect()]


def writer_workers(url: str) -> list[psutil.Process]:
    """Spark's Python workers connected to the node (the write's publisher)."""
    port = int(url.rsplit(":", 1)[1])
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.pid == os.getpid() or "pyspark" not in " ".join(proc.info["cmdline"] or []):
            continue
        try:
            if any(c.raddr and c.raddr.port == port for c in proc.net_connections("tcp")):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_a_task_that_dies_mid_publish_is_retried_and_each_row_is_stored_once(
    spark: SparkSession, server: ServerProcess
) -> None:
    from pyspark.sql import functions as F

    url, queue, n = server.url, unique(), 200_000
    setup_queue(url, queue, {})
    rows = spark.range(n).selectExpr("CAST(id AS STRING) AS body").coalesce(1)
    killed: list[int] = []  # messages stored when the writing task was killed

    def kill_mid_publish() -> None:  # beside the write (the session is bound to its thread)
        deadline = time.monotonic() + 120
        while stored(url, queue) < 20_000 and time.monotonic() < deadline:
            time.sleep(0.02)
        for worker in writer_workers(url):
            worker.kill()  # the task dies with part of its rows published
            killed.append(stored(url, queue))

    killer = threading.Thread(target=kill_mid_publish)
    killer.start()
    spark.conf.set(ARROW_BATCH, "2000")  # the writer gets rows as they come
    try:
        write(rows, url, queue)  # the retried task finishes it
    finally:
        spark.conf.unset(ARROW_BATCH)
        killer.join(150)
    assert killed and 20_000 <= killed[0] < n, "the task died after publishing part of its rows"
    df = spark.read.format("cherami").option("url", url).option("queue", queue).load()
    counts = df.select(F.count("*").alias("rows"), F.countDistinct("body").alias("bodies")).first()
    assert counts is not None and (counts.rows, counts.bodies) == (n, n), "each row once"


def test_rows_keyed_by_the_users_column_are_stored_once(
    spark: SparkSession, server: ServerProcess
) -> None:
    url = server.url
    keyed = spark.createDataFrame(
        [(f"k{i}", f"v{i}") for i in range(100)], "key STRING, body STRING"
    )
    copy = unique()
    setup_queue(url, copy, {})
    for _ in range(2):
        write(keyed, url, copy, dedupIdColumn="key")
    assert sorted(bodies(spark, url, copy)) == sorted(f"v{i}" for i in range(100))
    with pytest.raises(Exception, match="option 'dedupIdColumn'"):
        write(keyed, url, copy, dedupIdColumn="nope")


def test_a_replayed_micro_batch_publishes_each_row_once(
    spark: SparkSession, server: ServerProcess, tmp_path: Path
) -> None:
    url, source, sink = server.url, unique(), unique()
    setup_queue(url, source, {"pipe": "stream"}, min_extents=2)
    setup_queue(url, sink, {})
    publish(url, source, [f"m{i}" for i in range(1000)])
    checkpoint = tmp_path / "pipe"

    def run() -> Any:
        query = (
            stream(spark, url, source, "pipe", maxOffsetsPerTrigger=300)
            .select("body", "attributes").writeStream.format("cherami").option("url", url)
            .option("queue", sink).option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True).start()
        )  # fmt: skip
        query.awaitTermination(90)
        assert query.exception() is None
        return query

    first = run()
    batches = [p["batchId"] for p in first.recentProgress if p["numInputRows"]]
    assert len(batches) == 4 and stored(url, sink) == 1000
    # the restart of a query that died before its last batch was in the commit log
    last = batches[-1]
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    replayed = run()
    assert [p["batchId"] for p in replayed.recentProgress if p["numInputRows"]] == [last]
    got = bodies(spark, url, sink)
    assert len(got) == 1000 and set(got) == {f"m{i}" for i in range(1000)}, "each row once"
