"""The Spark Python launcher's path rule (no I/O beyond a temporary directory)."""

from __future__ import annotations

import os
from pathlib import Path

from cherami.sparkpython import path_without_bundled_zips


def _site(tmp: Path, packages: tuple[str, ...]) -> Path:
    purelib = tmp / "site-packages"
    for package in packages:
        (purelib / package).mkdir(parents=True)
        (purelib / package / "__init__.py").write_text("")
    (purelib / "pyspark" / "python" / "lib").mkdir(parents=True, exist_ok=True)
    return purelib


def test_drops_only_the_zips_of_the_installed_pyspark(tmp_path: Path) -> None:
    purelib = _site(tmp_path, ("pyspark", "py4j"))
    lib = purelib / "pyspark" / "python" / "lib"
    other = tmp_path / "spark-3.5" / "python" / "lib"
    path = os.pathsep.join([
        str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip"), "/opt/app",
        str(other / "pyspark.zip"), "", str(lib / "extra.zip"),
    ])  # fmt: skip
    kept = path_without_bundled_zips(path, str(purelib)).split(os.pathsep)
    assert kept == ["/opt/app", str(other / "pyspark.zip"), str(lib / "extra.zip")]


def test_keeps_a_zip_whose_package_is_not_installed(tmp_path: Path) -> None:
    purelib = _site(tmp_path, ("pyspark",))  # no py4j in site-packages
    lib = purelib / "pyspark" / "python" / "lib"
    path = os.pathsep.join([str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")])
    assert path_without_bundled_zips(path, str(purelib)) == str(lib / "py4j-0.10.9.9-src.zip")
