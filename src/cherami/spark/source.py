"""The ``cherami`` data source: streaming and batch reads of a queue, batch and
streaming writes to it."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from cherami.spark.options import Options
from cherami.spark.schema import SCHEMA, check_schema


class CheramiDataSource(DataSource):
    """``spark.readStream.format("cherami").option("url", ...).option("queue", ...)
    .option("group", ...).load()``; see docs/spark.md for every option."""

    @classmethod
    def name(cls) -> str:
        return "cherami"

    def schema(self) -> StructType:
        return SCHEMA

    def _options(self) -> Options:
        return Options.parse(self.options)

    def reader(self, schema: StructType) -> DataSourceReader:
        from cherami.spark.batchreader import CheramiBatchReader

        return CheramiBatchReader(check_schema(schema), self._options())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from cherami.spark.streamreader import CheramiStreamReader

        return CheramiStreamReader(check_schema(schema), self._options())

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from cherami.spark.writer import CheramiWriter, check_input

        check_input(schema)
        return CheramiWriter(self._options())

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from cherami.spark.writer import CheramiStreamWriter, check_input

        check_input(schema)
        return CheramiStreamWriter(self._options())
