"""The Kafka source's options, on a plainly built session: starting and ending offsets and
timestamps (batch and stream), maxOffsetsPerTrigger, minOffsetsPerTrigger with
maxTriggerDelay, includeHeaders, and bad values refused by name."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cherami.client.models import OutgoingMessage
from cherami.spark.control import ControlClient
from tests.spark.support import eventually, publish, setup_queue, stream
from tests.support.server import ServerProcess, unique

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def now_ms() -> int:
    """A moment strictly between two publishes (records carry milliseconds)."""
    time.sleep(0.02)
    moment = int(time.time() * 1000)
    time.sleep(0.02)
    return moment


@pytest.fixture(scope="module")
def phases(server: ServerProcess) -> dict[str, Any]:
    """A queue of two extents: phase a, then b, then c, with the moments between them."""
    queue = unique()
    setup_queue(server.url, queue, {"late": "stream", "window": "stream", "slices": "stream",
                                    "gated": "stream"}, min_extents=2)  # fmt: skip
    publish(server.url, queue, [OutgoingMessage(f"a-{i}", {"i": str(i)}) for i in range(200)])
    t1 = now_ms()
    publish(server.url, queue, [f"b-{i}" for i in range(100)])
    t2 = now_ms()
    publish(server.url, queue, [f"c-{i}" for i in range(50)])
    plain = sorted(e.id for e in ControlClient(server.url).extents(queue) if e.plain)
    return {"queue": queue, "t1": t1, "t2": t2, "extents": plain}


def read(spark: SparkSession, url: str, queue: str, **options: Any) -> Any:
    reader = spark.read.format("cherami").option("url", url).option("queue", queue)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def bodies(rows: list[Any]) -> list[str]:
    return sorted(bytes(r.body).decode() for r in rows)


def test_batch_offsets_timestamps_and_headers(
    spark: SparkSession, server: ServerProcess, phases: dict[str, Any]
) -> None:
    queue, t1, t2 = phases["queue"], phases["t1"], phases["t2"]
    window = read(spark, server.url, queue, startingTimestamp=t1, endingTimestamp=t2)
    assert bodies(window.collect()) == sorted(f"b-{i}" for i in range(100))

    e0, e1 = phases["extents"]
    ranged = read(
        spark,
        server.url,
        queue,
        includeDelayed="false",
        startingOffsets=json.dumps({e0: 5}),
        endingOffsets=json.dumps({e0: 10}),
    )
    rows = ranged.collect()  # fmt: skip
    assert sorted(r.seq for r in rows if r.extent == e0) == [5, 6, 7, 8, 9]
    e1_last = next(e.last_seq for e in ControlClient(server.url).extents(queue) if e.id == e1)
    assert sorted(r.seq for r in rows if r.extent == e1) == list(range(1, e1_last + 1))
    latest = read(spark, server.url, queue, startingOffsets="latest", includeDelayed="false")
    assert latest.count() == 0

    headerless = read(spark, server.url, queue, includeHeaders="false")
    assert "attributes" not in headerless.columns
    assert headerless.count() == 350
    with_headers = read(spark, server.url, queue).where("attributes['i'] = '7'").collect()
    assert bodies(with_headers) == ["a-7"]

    with pytest.raises(Exception, match="option 'startingOffsets' must be"):
        read(spark, server.url, queue, startingOffsets="beginning").collect()
    with pytest.raises(Exception, match="option 'startingOffsets' names extents"):
        read(spark, server.url, queue, startingOffsets='{"nope": 2}').collect()


def run_available_now(df: Any, checkpoint: Path) -> tuple[list[str], list[int]]:
    """Bodies read by one AvailableNow run, and each micro-batch's row count."""
    seen: list[str] = []
    query = (
        df.writeStream.foreachBatch(lambda batch, _: seen.extend(bodies(batch.collect())))
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination(90)
    assert query.exception() is None
    return sorted(seen), [p["numInputRows"] for p in query.recentProgress]


def test_stream_offsets_timestamps_and_trigger_limits(
    spark: SparkSession, server: ServerProcess, phases: dict[str, Any], tmp_path: Path
) -> None:
    url, queue = server.url, phases["queue"]
    # startingOffsets=latest: only what comes after the query's start
    late = stream(spark, url, queue, "late", startingOffsets="latest")
    assert run_available_now(late, tmp_path / "late")[0] == []
    publish(url, queue, [f"d-{i}" for i in range(30)])
    late = stream(spark, url, queue, "late", startingOffsets="latest")
    assert run_available_now(late, tmp_path / "late")[0] == sorted(f"d-{i}" for i in range(30))

    window = stream(spark, url, queue, "window", startingTimestamp=phases["t1"],
                    endingTimestamp=phases["t2"])  # fmt: skip
    assert run_available_now(window, tmp_path / "window")[0] == sorted(f"b-{i}" for i in range(100))

    slices = stream(spark, url, queue, "slices", maxOffsetsPerTrigger=100)
    seen, sizes = run_available_now(slices, tmp_path / "slices")
    assert len(seen) == 380 and max(sizes) <= 100 and len([n for n in sizes if n]) == 4

    with pytest.raises(Exception, match="'endingOffsets' applies to batch reads only"):
        query = stream(spark, url, queue, "late", endingOffsets="latest").writeStream.format(
            "noop").start()  # fmt: skip
        query.awaitTermination(60)

    # fewer than minOffsetsPerTrigger: nothing until maxTriggerDelay has passed, then all
    name = unique("gated").replace("-", "_")
    gated = stream(spark, url, queue, "gated", minOffsetsPerTrigger=1000, maxTriggerDelay="4s")
    started = time.monotonic()
    query = gated.writeStream.format("memory").queryName(name).trigger(
        processingTime="200 milliseconds").start()  # fmt: skip
    try:

        def count() -> int:
            return spark.sql(f"SELECT count(*) AS n FROM {name}").first().n  # type: ignore[union-attr]

        time.sleep(max(0.0, 2.0 - (time.monotonic() - started)))
        assert count() == 0, "held back: fewer than minOffsetsPerTrigger"
        eventually(lambda: count() == 380, 30)
    finally:
        query.stop()
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [380]
