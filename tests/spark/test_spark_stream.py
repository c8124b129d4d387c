"""Streaming read: exactly once into a sink across a restart, acks following the
checkpoint, extents that appear mid-stream, read grants renewed before they expire."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cherami.errors import GrantExpired
from cherami.spark import follow_acks
from cherami.spark.control import ControlClient
from cherami.spark.storereader import StoreReader
from tests.spark.support import (
    eventually,
    group_offsets,
    publish,
    queue_ends,
    run,
    setup_queue,
    stream,
)
from tests.support.server import ServerProcess, unique

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def end_offset(progress: dict[str, Any]) -> dict[str, int]:
    """The plain extents' offsets a micro-batch ended at (timer extents' "<id>/due" left out)."""
    offsets = json.loads(progress["sources"][0]["endOffset"])
    return {e: n for e, n in offsets.items() if not e.endswith("/due")}


def test_exactly_once_across_a_restart_and_acks_follow_the_checkpoint(
    spark: SparkSession, server: ServerProcess, tmp_path: Path
) -> None:
    queue = unique()
    setup_queue(server.url, queue, {"analytics": "stream"}, min_extents=2)
    first = [f"first-{i}" for i in range(3000)]
    publish(server.url, queue, first)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def start(trigger: dict[str, Any], per_trigger: int) -> Any:
        df = stream(spark, server.url, queue, "analytics", maxMessagesPerTrigger=per_trigger)
        writer = df.selectExpr("id", "extent", "seq", "CAST(body AS STRING) AS body").writeStream
        return writer.format("parquet").option("path", out).option(
            "checkpointLocation", checkpoint
        ).trigger(**trigger).start()  # fmt: skip

    query = start({"processingTime": "100 milliseconds"}, 250)
    listener = follow_acks(spark, server.url, queue, "analytics", query=query)
    try:
        eventually(lambda: sum(p["numInputRows"] > 0 for p in query.recentProgress) >= 3)
    finally:
        query.stop()
    stopped_at = end_offset(query.lastProgress)
    assert sum(n - 1 for n in stopped_at.values()) < len(first), "stopped before the end"
    # the group's ack levels are where the checkpoint is: not ahead, not behind
    eventually(lambda: group_offsets(server.url, queue, "analytics") == stopped_at, 15)

    second = [f"second-{i}" for i in range(1000)]
    publish(server.url, queue, second)
    query = start({"availableNow": True}, 1500)  # same checkpoint: resumes where it stopped
    query.awaitTermination(90)
    assert not query.isActive and query.exception() is None

    rows = spark.read.parquet(out).collect()
    bodies = [r.body for r in rows]
    assert len(bodies) == len(first) + len(second), "every message exactly once"
    assert set(bodies) == set(first) | set(second)
    assert len({r.id for r in rows}) == len(rows)

    ends = queue_ends(server.url, queue)
    assert end_offset(query.lastProgress) == ends
    eventually(lambda: group_offsets(server.url, queue, "analytics") == ends, 15)
    eventually(lambda: listener.committed == ends, 5)  # the listener posted the last batch

    # acks never move backward
    behind = {extent: 2 for extent in ends}
    assert ControlClient(server.url).commit(queue, "analytics", behind) == ends
    spark.streams.removeListener(listener)


def test_a_new_extent_mid_stream_is_read(spark: SparkSession, server: ServerProcess) -> None:
    queue = unique()
    setup_queue(server.url, queue, {"live": "stream"}, min_extents=1)
    publish(server.url, queue, [f"a-{i}" for i in range(300)])
    name = unique("sink").replace("-", "_")
    query = (
        stream(spark, server.url, queue, "live")
        .writeStream.format("memory")
        .queryName(name)
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:

        def count() -> int:
            return spark.sql(f"SELECT count(*) AS n FROM {name}").first().n  # type: ignore[union-attr]

        eventually(lambda: count() == 300)

        async def widen(client: Any) -> None:
            await client.update_queue(queue, min_extents=2)

        run(server.url, widen)
        eventually(lambda: len(ControlClient(server.url).extents(queue)) == 2)  # 2 plain
        # the input host learns of the new extent within its extent refresh (about 1 s):
        # publish over a few seconds, so that later batches land in both extents
        for part in range(12):
            publish(server.url, queue, [f"b-{part}-{i}" for i in range(50)])
            time.sleep(0.25)
        eventually(lambda: count() == 900)
    finally:
        query.stop()
    rows = spark.sql(
        f"SELECT extent, count(*) AS n, count(DISTINCT id) AS ids FROM {name} GROUP BY extent"
    )
    per_extent = {r.extent: (r.n, r.ids) for r in rows.collect()}
    assert len(per_extent) == 2
    assert sum(n for n, _ in per_extent.values()) == 900
    assert all(n == ids for n, ids in per_extent.values())


def test_delayed_messages_are_read_when_due_never_before(
    spark: SparkSession, server: ServerProcess, tmp_path: Path
) -> None:
    from cherami.client.models import OutgoingMessage

    queue = unique()
    setup_queue(server.url, queue, {"due": "stream"})
    publish(server.url, queue, [f"now-{i}" for i in range(20)])
    name = unique("due").replace("-", "_")
    seen: dict[str, float] = {}  # body -> when the sink first had it

    def rows() -> int:
        now = time.time()
        for r in spark.sql(f"SELECT CAST(body AS STRING) AS b, delivery_at FROM {name}").collect():
            seen.setdefault(r.b, now)
            assert r.delivery_at.timestamp() <= now, "a delayed message was read before due"
        return len(seen)

    query = (
        stream(spark, server.url, queue, "due").writeStream.format("memory").queryName(name)
        .option("checkpointLocation", str(tmp_path / "due"))
        .trigger(processingTime="100 milliseconds").start()
    )  # fmt: skip
    try:
        eventually(lambda: rows() == 20, 30)
        published = time.time()
        publish(server.url, queue, [OutgoingMessage(f"later-{i}", None, 3.0) for i in range(10)])
        eventually(lambda: rows() == 30, 30)
        time.sleep(1.0)
        assert rows() == 30
    finally:
        query.stop()
    assert all(seen[f"later-{i}"] >= published + 3.0 for i in range(10)), "read when due"
    assert max(seen[f"later-{i}"] for i in range(10)) < published + 10.0

    # restarted from its checkpoint: the delayed messages are not read again
    again = stream(spark, server.url, queue, "due").writeStream.format("noop").option(
        "checkpointLocation", str(tmp_path / "due")).trigger(availableNow=True).start()  # fmt: skip
    again.awaitTermination(60)
    assert sum(p["numInputRows"] for p in again.recentProgress) == 0


def test_a_competing_group_is_refused(spark: SparkSession, server: ServerProcess) -> None:
    queue = unique()
    setup_queue(server.url, queue, {"workers": "competing"})
    query = stream(spark, server.url, queue, "workers").writeStream.format("noop").start()
    with pytest.raises(Exception, match="stream-mode"):
        query.awaitTermination(60)
    assert not query.isActive


def test_a_stream_reads_on_past_its_read_grants_expiry(
    spark: SparkSession, server: ServerProcess
) -> None:
    """The job holds no cluster secret (conftest.py): it reads with read grants, here of
    1 s, which the source renews before they expire."""
    queue = unique()
    setup_queue(server.url, queue, {"long": "stream"})
    publish(server.url, queue, [f"a-{i}" for i in range(100)])
    name = unique("grants").replace("-", "_")
    query = (
        stream(spark, server.url, queue, "long", readGrantLifetime="1s")
        .writeStream.format("memory").queryName(name)
        .trigger(processingTime="100 milliseconds").start()
    )  # fmt: skip

    def count() -> int:
        return spark.sql(f"SELECT count(*) AS n FROM {name}").first().n  # type: ignore[union-attr]

    try:
        eventually(lambda: count() == 100)
        (view,) = [v for v in ControlClient(server.url).extents(queue) if v.plain]
        probe = ControlClient(server.url).read_grants(queue, [view.id], 1.0)[view.id]

        def expired() -> bool:  # a grant made after the first batch's is refused now
            try:
                with StoreReader(list(view.stores), credential=probe) as reader:
                    list(reader.read_all(view.id))
            except GrantExpired:
                return True
            return False

        eventually(expired, 10)
        publish(server.url, queue, [f"b-{i}" for i in range(100)])
        eventually(lambda: count() == 200)
    finally:
        query.stop()
    assert query.exception() is None
