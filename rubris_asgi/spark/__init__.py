"""The ``rubris`` data source for PySpark (the ``spark`` extra): write to rubris, read from it.

::

    from rubris_asgi.spark import register
    register(spark)                      # once per SparkSession
    df.write.format("rubris").option("url", "http://127.0.0.1:8000/rubris") \\
        .option("token", token).option("topic", "prices.{symbol}").mode("append").save()
    spark.readStream.format("rubris").option("url", ...).option("topic", "trades").load()

docs/spark.md has every option and the guarantees of each mode.
"""

from __future__ import annotations

from .datasource import RubrisDataSource, register

__all__ = ["RubrisDataSource", "register"]
