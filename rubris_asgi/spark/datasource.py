"""``RubrisDataSource``: the class Spark finds under the format name ``rubris``.

It only routes: writers live in ``sink.py``, readers in ``source.py``. Options are checked here,
on the driver, so a mistake (a template column the DataFrame lacks, an unknown mode) fails the
query before any task starts.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType


class RubrisDataSource(DataSource):
    """``format("rubris")``: batch and streaming writes, batch and streaming reads."""

    @classmethod
    def name(cls) -> str:
        return "rubris"

    # each side is imported when it is used: a job that only writes loads no reader code

    def schema(self) -> StructType | str:
        from .source import source_schema

        return source_schema(dict(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from .sink import batch_writer

        return batch_writer(dict(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .sink import stream_writer

        return stream_writer(dict(self.options), schema, overwrite)

    def reader(self, schema: StructType) -> DataSourceReader:
        from .source import batch_reader

        return batch_reader(dict(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .source import stream_reader

        return stream_reader(dict(self.options), schema)


def register(spark: SparkSession | Any) -> None:
    """Make ``format("rubris")`` known to ``spark`` (once per session; again is harmless)."""
    spark.dataSource.register(RubrisDataSource)
