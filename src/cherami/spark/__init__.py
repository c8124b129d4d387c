"""A PySpark data source for Cherami queues: format ``cherami`` (docs/spark.md).

Importing this package points Spark's Python workers at this interpreter
(``PYSPARK_PYTHON``: through its ``cherami-spark-python`` launcher when it is installed
beside it, see cherami/sparkpython.py) and Spark at the loopback interface
(``SPARK_LOCAL_IP``), unless they are set already; import it before the SparkSession
starts, or use ``session()``."""

from __future__ import annotations

import os
import sys

from cherami.sparkpython import launcher

os.environ.setdefault("PYSPARK_PYTHON", launcher())
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from cherami.spark.listener import AckListener  # noqa: E402
from cherami.spark.session import follow_acks, register, session  # noqa: E402
from cherami.spark.source import CheramiDataSource  # noqa: E402

__all__ = ["AckListener", "CheramiDataSource", "follow_acks", "register", "session"]
