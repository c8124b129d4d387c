"""Set up a SparkSession for the ``cherami`` source."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cherami.spark.listener import AckListener
from cherami.spark.source import CheramiDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

PUSHDOWN = "spark.sql.python.filterPushdown.enabled"


def register(spark: SparkSession) -> SparkSession:
    """Register format ``cherami`` and enable filter pushdown for Python sources (the
    batch reader pushes time, extent and seq filters into the store reads)."""
    spark.dataSource.register(CheramiDataSource)
    spark.conf.set(PUSHDOWN, "true")
    return spark


def session(
    app_name: str = "cherami", master: str = "local[2]", shuffle_partitions: int = 2,
    **conf: str,
) -> SparkSession:  # fmt: skip
    """A SparkSession for small machines (no UI, few shuffle partitions) with the
    source registered."""
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config(PUSHDOWN, "true")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    return register(builder.getOrCreate())


def follow_acks(
    spark: SparkSession, url: str, queue: str, group: str, api_key: str | None = None,
    query: StreamingQuery | None = None,
) -> AckListener:  # fmt: skip
    """Commit each micro-batch's end offset to the group as soon as the batch is done
    (``query``: only that query's progress)."""
    listener = AckListener(url, queue, group, api_key, str(query.id) if query else None)
    spark.streams.addListener(listener)
    return listener
