"""The crash-report demo, small: its counts reconcile."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from demo.crash_reports import DemoConfig, run

from tests.support.server import ServerProcess, unique

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def test_demo_counts_reconcile(spark: SparkSession, server: ServerProcess, tmp_path: Path) -> None:
    config = DemoConfig(reports=800, rate=1000, workers=2, malformed_every=40, queue=unique(),
                        workdir=tmp_path, trigger_seconds=0.5, timeout=60, quiet=True)  # fmt: skip
    result = run(config, spark=spark, url=server.url)
    assert result.published == 800
    assert result.dead_lettered == result.malformed_made == 20
    assert result.processed + result.dead_lettered == result.published
    assert result.spark_total == result.published
    assert result.spark_malformed == 20
    assert result.ok
    assert (tmp_path / "parquet" / "crashes_per_signature_per_minute").is_dir()
