"""Real Spark (local[1], one session for every test) against a real node."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.support.server import ServerProcess

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def pytest_configure(config: pytest.Config) -> None:
    # pyspark 4.x warns at import that it does not fully support pandas 3
    config.addinivalue_line(
        "filterwarnings", "ignore:PySpark does not yet fully support pandas:FutureWarning"
    )


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    import cherami.spark

    session = cherami.spark.session(
        "cherami-tests",
        master="local[1]",
        shuffle_partitions=1,
        **{
            "spark.default.parallelism": "1",
            "spark.sql.streaming.pollingDelay": "50ms",
            "spark.python.worker.reuse": "true",
            # short runs: the C1 compiler only, so JIT work does not hog the two cores
            "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One node for the Spark tests (two store hosts, so reads have a replica to fail
    over to); each test uses its own queues."""
    proc = ServerProcess(tmp_path_factory.mktemp("spark-node"), stores=2).start()
    yield proc
    assert proc.stop() == 0
