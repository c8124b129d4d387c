"""Batch read of retained messages (on Spark's defaults, and with time filters pushed
down when the session enables pushdown) and writes, batch and streaming."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cherami.client.models import OutgoingMessage
from cherami.spark.control import ControlClient
from cherami.spark.session import PUSHDOWN
from tests.spark.support import publish, setup_queue
from tests.support.server import ServerProcess, unique

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark


def batch(spark: SparkSession, url: str, queue: str, **options: str) -> DataFrame:
    reader = spark.read.format("cherami").option("url", url).option("queue", queue)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def pause() -> datetime:
    """A moment strictly between two publishes (records carry milliseconds)."""
    time.sleep(0.02)
    moment = datetime.now(UTC)
    time.sleep(0.02)
    return moment


def test_batch_read_filters_on_enqueue_time(spark: SparkSession, server: ServerProcess) -> None:
    from pyspark.sql import functions as F

    queue = unique()
    setup_queue(server.url, queue, {}, min_extents=2)
    before = [f"before-{i}" for i in range(200)]
    inside = [f"inside-{i}" for i in range(120)]
    after = [f"after-{i}" for i in range(80)]
    publish(server.url, queue, before)
    t1 = pause()
    publish(server.url, queue, inside)
    publish(server.url, queue, [OutgoingMessage("delayed", {"k": "v"}, delay_seconds=3600)])
    t2 = pause()
    publish(server.url, queue, after)

    everything = batch(spark, server.url, queue)
    assert everything.count() == 401
    in_window = (F.col("enqueued_at") >= F.lit(t1)) & (F.col("enqueued_at") < F.lit(t2))
    # Spark's default: no Python filter pushdown; Spark filters after the scan
    assert spark.conf.get(PUSHDOWN, "false") == "false"
    plain_window = batch(spark, server.url, queue).where(in_window)
    assert "enqueued_at" in _post_scan_filters(plain_window)
    unpushed = plain_window.select(F.col("body").cast("string").alias("body")).collect()
    assert sorted(r.body for r in unpushed) == sorted([*inside, "delayed"])

    spark.conf.set(PUSHDOWN, "true")
    try:
        window = batch(spark, server.url, queue).where(in_window)
        assert "enqueued_at" not in _post_scan_filters(window), "the time filter is pushed down"
        rows = window.select(F.col("body").cast("string").alias("body"), "attributes",
                             "enqueued_at", "delivery_at").collect()  # fmt: skip
        plain = [e.id for e in ControlClient(server.url).extents(queue) if e.plain]
        one = batch(spark, server.url, queue).where(
            (F.col("extent") == plain[0]) & (F.col("seq") <= 10)
        )
        assert sorted(r.seq for r in one.collect()) == list(range(1, 11))
    finally:
        spark.conf.unset(PUSHDOWN)
    assert sorted(r.body for r in rows) == sorted([*inside, "delayed"])
    delayed = next(r for r in rows if r.body == "delayed")
    assert delayed.attributes == {"k": "v"}
    assert (delayed.delivery_at - delayed.enqueued_at).total_seconds() == pytest.approx(3600, abs=1)

    by_option = batch(spark, server.url, queue, startTime=t1.isoformat(), endTime=t2.isoformat(),
                      includeDelayed="false")  # fmt: skip
    assert sorted(r.body.decode() for r in by_option.select("body").collect()) == sorted(inside)
    assert batch(spark, server.url, queue).where(F.col("enqueued_at") > F.lit(t2)).count() == 80


def _post_scan_filters(df: DataFrame) -> str:
    """The filter conditions Spark still evaluates after the scan."""
    plan = df._jdf.queryExecution().executedPlan().toString()
    return "\n".join(line for line in plan.splitlines() if re.search(r"\bFilter\b", line))


def test_write_round_trip(spark: SparkSession, server: ServerProcess, tmp_path: Path) -> None:
    source, copy = unique(), unique()
    setup_queue(server.url, source, {"pipe": "stream"})
    setup_queue(server.url, copy, {})
    rows = [(f"report-{i}", {"n": str(i)}, 0.0) for i in range(500)]
    df = spark.createDataFrame(
        rows, "body STRING, attributes MAP<STRING, STRING>, delay_seconds DOUBLE"
    )
    df.write.format("cherami").option("url", server.url).option("queue", source).mode(
        "append"
    ).save()
    binary = spark.createDataFrame([(bytes([0, 255, i]),) for i in range(20)], "body BINARY")
    binary.write.format("cherami").option("url", server.url).option("queue", source).mode(
        "append"
    ).save()

    back = batch(spark, server.url, source).collect()
    assert len(back) == 520
    texts = {r.body: r.attributes for r in back if r.body.startswith(b"report-")}
    assert texts == {f"report-{i}".encode(): {"n": str(i)} for i in range(500)}
    assert {r.body for r in back if not r.body.startswith(b"report-")} == {
        bytes([0, 255, i]) for i in range(20)
    }

    # a streaming pipe: the source queue's stream group into another queue
    piped = (
        spark.readStream.format("cherami").option("url", server.url).option("queue", source)
        .option("group", "pipe").load().select("body", "attributes")
        .writeStream.format("cherami").option("url", server.url).option("queue", copy)
        .option("checkpointLocation", str(tmp_path / "pipe")).trigger(availableNow=True).start()
    )  # fmt: skip
    piped.awaitTermination(60)
    assert piped.exception() is None
    copied = batch(spark, server.url, copy).collect()
    assert sorted(r.body for r in copied) == sorted(r.body for r in back)


def test_write_keys(spark: SparkSession, server: ServerProcess) -> None:
    from cherami.client.sync import Client

    queue = unique()
    setup_queue(server.url, queue, {})
    df = spark.createDataFrame(
        [("a", "order-1"), ("b", None), ("c", "")], "body STRING, key STRING"
    )
    df.write.format("cherami").option("url", server.url).option("queue", queue).mode(
        "append"
    ).save()
    with Client(server.url) as client:
        page = client.peek(queue)
    assert {m["body"]: m.get("key") for m in page["messages"]} == {
        "a": "order-1",
        "b": None,
        "c": None,
    }
    bad = spark.createDataFrame([("a", 1)], "body STRING, key INT")
    with pytest.raises(Exception, match="'key' column must be a string"):
        bad.write.format("cherami").option("url", server.url).option("queue", queue).mode(
            "append"
        ).save()
