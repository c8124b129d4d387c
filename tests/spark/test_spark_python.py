"""Spark's Python processes run through ``cherami-spark-python`` (the Makefile and the
Spark tests' conftest set ``PYSPARK_PYTHON`` to it): a worker imports pyspark from
site-packages, not from Spark's zip, and still runs Spark's own worker code."""

from __future__ import annotations

import os
import sysconfig
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _where() -> list[str]:
    import sys

    import pyspark

    return [pyspark.__file__ or "", *[p for p in sys.path if p.endswith(".zip")]]


def test_workers_import_pyspark_from_site_packages(spark: SparkSession) -> None:
    assert os.environ["PYSPARK_PYTHON"].endswith("cherami-spark-python")
    found = spark.sparkContext.parallelize([0], 1).map(lambda _: _where()).collect()[0]
    pyspark_file, zips = found[0], found[1:]
    purelib = os.path.realpath(sysconfig.get_paths()["purelib"])
    assert os.path.realpath(pyspark_file).startswith(purelib + os.sep), found
    assert ".zip" not in pyspark_file, found  # Spark's zip lives under site-packages too
    assert not [z for z in zips if "pyspark" in os.path.basename(z) or "py4j" in z], found
