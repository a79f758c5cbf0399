"""The demo's data pipeline on Spark: ``python -m example_app.pipeline`` (the ``spark`` extra).

Two jobs against the running demo (``python -m example_app``), both through the ``rubris`` data
source, in ``local[2]``:

- **bars** (Structured Streaming, runs until Ctrl-C): reads the ``trades`` ring as a stream,
  computes per-symbol bars (open, high, low, close, VWAP, volume, trade count) per window
  (5 s by default) and writes each bar, updated every micro-batch while its window is open, to
  ``bars.{symbol}``, which the page draws as candles. Checkpointed: stopped and started again,
  it goes on from where it stopped (trades the ring no longer holds are skipped with a warning).
- **catalog** (a batch job, first): reads the current price of every symbol from the
  ``prices.{symbol}`` snapshots with ``spark.read``, fans a catalog out into one "reprice" job per
  symbol and book (200 jobs) on the ``reprice`` work queue, tracked as one batch; the batch is
  announced on ``pipeline.batches`` and the page shows its progress as the tabs and workers
  ACK the jobs.

The demo's API token: start the demo with ``RUBRIS_API_TOKEN=...`` and give the same here
(``--token`` or the same variable).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from typing import Any

from .market import SYMBOLS

TRADES = "id LONG, symbol STRING, price DOUBLE, qty LONG, side STRING, ts LONG"
"""The trades' JSON fields, as the source reads them."""

BOOKS = ("spot", "1m", "3m", "1y")
"""The catalog: one reprice job per symbol and book."""


def spark_session(master: str = "local[2]", name: str = "rubris-demo-pipeline") -> Any:
    """A local SparkSession, UI off, few shuffle partitions, ``rubris`` registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from rubris_asgi.spark import register

    spark = (
        SparkSession.builder.master(master)
        .appName(name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # a bar a stage drowns the log
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def bars_query(
    spark: Any,
    url: str,
    token: str,
    *,
    window: str = "5 seconds",
    checkpoint: str | None = None,
    trigger: str = "0 seconds",
) -> Any:
    """Start the bars stream: ``trades`` → bars per symbol and window → ``bars.{symbol}``.

    Update mode: every micro-batch writes the bars its trades changed, so a candle grows on the
    page while its window is open (through ``foreachBatch``: Spark gives a Python data source's
    streaming writes append mode only); the watermark (10 s) lets Spark drop windows that can no
    longer change. Each bar: symbol, start and end (ms), open, high, low, close, vwap, volume,
    trades, and ``last_ts``: the time of its newest trade (the bench measures latency from it).
    """
    from pyspark.sql import functions as F

    trades = (
        spark.readStream.format("rubris")
        .option("url", url)
        .option("token", token)
        .option("topic", "trades")
        .option("failOnDataLoss", "false")  # a demo restarted after a while skips what is gone
        .schema(TRADES)
        .load()
        .where(F.col("price").isNotNull() & F.col("qty").isNotNull())
        .withColumn("time", F.timestamp_millis("ts"))
    )
    bars = (
        trades.withWatermark("time", "10 seconds")
        .groupBy(F.window("time", window), "symbol")
        .agg(
            F.min_by("price", "ts").alias("open"),
            F.max("price").alias("high"),
            F.min("price").alias("low"),
            F.max_by("price", "ts").alias("close"),
            (F.sum(F.col("price") * F.col("qty")) / F.sum("qty")).alias("vwap"),
            F.sum("qty").alias("volume"),
            F.count(F.lit(1)).alias("trades"),
            F.max("ts").alias("last_ts"),
        )
        .select(
            "symbol",
            F.unix_millis(F.col("window.start")).alias("start"),
            F.unix_millis(F.col("window.end")).alias("end"),
            "open",
            "high",
            "low",
            "close",
            F.round("vwap", 4).alias("vwap"),
            "volume",
            "trades",
            "last_ts",
        )
    )
    checkpoint = checkpoint or tempfile.mkdtemp(prefix="rubris-bars-")

    def write(changed: Any, _micro_batch: int) -> None:
        # Spark's streaming writes to a Python data source take append mode only; update mode
        # goes through foreachBatch, each micro-batch's changed bars written as a batch
        (
            changed.write.format("rubris")
            .option("url", url)
            .option("token", token)
            .option("topic", "bars.{symbol}")
            .mode("append")
            .save()
        )

    return (
        bars.writeStream.outputMode("update")
        .foreachBatch(write)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=trigger)
        .queryName("bars")
        .start()
    )


def catalog_job(spark: Any, url: str, token: str) -> None:
    """Fan the catalog out into "reprice" jobs, tracked as one batch announced on
    ``pipeline.batches``; returns when the write is done (the jobs are worked after)."""
    from pyspark.sql import functions as F

    prices = (
        spark.read.format("rubris")
        .option("url", url)
        .option("token", token)
        .option("topics", ",".join(f"prices.{s}" for s in SYMBOLS))
        .schema("symbol STRING, last DOUBLE")
        .load()
        .coalesce(2)  # one task a topic otherwise: 50 tiny tasks holding both cores
        .groupBy("symbol")
        .agg(F.last("last").alias("last"))
    )
    catalog = spark.createDataFrame(
        [(s, book) for s in SYMBOLS for book in BOOKS], "symbol STRING, book STRING"
    )
    jobs = (
        catalog.join(prices, "symbol", "left")
        .withColumn("job", 1_000_000 + F.monotonically_increasing_id())
        .select("job", "symbol", "book", F.coalesce("last", F.lit(100.0)).alias("last"))
        .repartition(2)
    )
    (
        jobs.write.format("rubris")
        .option("url", url)
        .option("token", token)
        .option("mode", "enqueue")
        .option("topic", "reprice")
        .option("idColumn", "job")
        .option("track", "true")
        .option("announce", "pipeline.batches")
        .mode("append")
        .save()
    )


def main() -> None:
    ap = argparse.ArgumentParser(description="the demo's Spark pipeline: bars and a catalog")
    ap.add_argument("--url", default="http://127.0.0.1:8000/rubris")
    ap.add_argument("--token", default=os.environ.get("RUBRIS_API_TOKEN"))
    ap.add_argument("--window", default="5 seconds", help="the bars' window, e.g. '1 second'")
    ap.add_argument("--checkpoint", default=None, help="the bars' checkpoint directory")
    ap.add_argument("--no-catalog", action="store_true", help="only the bars stream")
    args = ap.parse_args()
    if not args.token:
        ap.error("the demo's API token: --token, or RUBRIS_API_TOKEN as the demo was started with")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # a line per callback otherwise
    spark = spark_session()
    if not args.no_catalog:  # first: on two cores its tasks would hold up the stream's
        catalog_job(spark, args.url, args.token)
        print(f"catalog: {len(SYMBOLS) * len(BOOKS)} reprice jobs enqueued as one batch")
    query = bars_query(spark, args.url, args.token, window=args.window, checkpoint=args.checkpoint)
    print(f"bars: {args.window} windows of 'trades' -> 'bars.{{symbol}}' (Ctrl-C to stop)")
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        pass
    finally:
        query.stop()
        spark.stop()


if __name__ == "__main__":
    main()
