"""The ``cherami`` data source: streaming and batch reads of a queue, batch and
streaming writes to it."""

from __future__ import annotations

import sys

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from cherami.spark.options import Options
from cherami.spark.schema import check_schema, source_schema


class CheramiDataSource(DataSource):
    """``spark.readStream.format("cherami").option("url", ...).option("queue", ...)
    .option("group", ...).load()``; see docs/spark.md for every option."""

    @classmethod
    def name(cls) -> str:
        return "cherami"

    def schema(self) -> StructType:
        return source_schema(self._options().include_headers)

    def _options(self) -> Options:
        return Options.parse(self.options)

    def reader(self, schema: StructType) -> DataSourceReader:
        """The batch reader; with ``pushFilters`` only when Spark's pushdown step asks
        for it (pyspark fails a read whose reader implements ``pushFilters`` while the
        session leaves Python filter pushdown off, its default)."""
        from cherami.spark.batchreader import CheramiBatchReader, PushdownBatchReader

        kind = PushdownBatchReader if _pushing_down() else CheramiBatchReader
        options = self._options()
        return kind(check_schema(schema, options.include_headers), options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from cherami.spark.streamreader import CheramiStreamReader

        options = self._options()
        options.check_stream()
        return CheramiStreamReader(check_schema(schema, options.include_headers), options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from cherami.spark.writer import CheramiWriter, check_input

        options = self._options()
        check_input(schema, options.dedup_id_column)
        return CheramiWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from cherami.spark.writer import CheramiStreamWriter, check_input

        options = self._options()
        check_input(schema, options.dedup_id_column)
        return CheramiStreamWriter(options)


PUSHDOWN_STEP = "data_source_pushdown_filters.py"


def _pushing_down() -> bool:
    """Whether Spark's filter pushdown step (``pyspark.sql.worker.
    data_source_pushdown_filters``, run only when the session enables pushdown) is the
    caller: the only place that tells a Python data source the setting is on."""
    frame = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            return False
        if frame.f_code.co_filename.endswith(PUSHDOWN_STEP):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False
