"""Real Spark (local[1,2]: one core, two attempts per task; one session for every test)
against a real node. The session is built the ordinary way, with Spark's defaults
(Python filter pushdown off), and the source registered with a plain
``spark.dataSource.register``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from cherami.sparkpython import launcher
from cherami.wire.handshake import SECRET_ENV, SECRET_FILE_ENV
from cherami.wire.tls import TLS_CA_ENV
from tests.support.server import ServerProcess
from tests.support.tlscerts import Certs, make_certs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

os.environ.setdefault("PYSPARK_PYTHON", launcher())
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# the driver and its workers hold no cluster secret: they read the store hosts with read
# grants the frontend issues (docs/spark.md, "Authentication")
for _name in (SECRET_ENV, SECRET_FILE_ENV):
    os.environ.pop(_name, None)


def pytest_configure(config: pytest.Config) -> None:
    # pyspark 4.x warns at import that it does not fully support pandas 3
    config.addinivalue_line(
        "filterwarnings", "ignore:PySpark does not yet fully support pandas:FutureWarning"
    )


@pytest.fixture(scope="session")
def tls_certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A test CA and a certificate for 127.0.0.1 (test_spark_tls.py)."""
    return make_certs(tmp_path_factory.mktemp("spark-certs"))


@pytest.fixture(scope="session")
def spark(server: ServerProcess, tls_certs: Certs) -> Iterator[SparkSession]:
    """Spark's Python workers inherit the JVM's environment, which names the CA that
    verifies a TLS cluster and no cluster secret."""
    from pyspark.sql import SparkSession

    os.environ[TLS_CA_ENV] = str(tls_certs.ca)

    from cherami.spark import CheramiDataSource

    session = (
        SparkSession.builder.master("local[1,2]")  # a failed task gets a second attempt
        .appName("cherami-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.default.parallelism", "1")
        .config("spark.sql.streaming.pollingDelay", "50ms")
        # short runs: the C1 compiler only, so JIT work does not hog the two cores
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .getOrCreate()
    )
    session.dataSource.register(CheramiDataSource)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One node for the Spark tests (two store hosts, so reads have a replica to fail
    over to); each test uses its own queues."""
    data_dir = tmp_path_factory.mktemp("spark-node")
    proc = ServerProcess(data_dir, stores=2).start()
    yield proc
    assert proc.stop() == 0
