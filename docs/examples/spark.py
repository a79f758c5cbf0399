"""The Spark data source: write rows to rubris, enqueue them as a tracked batch, read topics back.

Run it: ``python3 docs/examples/spark.py`` (needs ``pip install 'rubris-asgi[spark]'`` and Java
17+; it serves rubris on a free port of 127.0.0.1 in a thread, starts a local SparkSession, and
prints what each step did, then stops both).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import tempfile
import threading
import time
from typing import Any

import uvicorn
from pyspark.sql import SparkSession
from starlette.applications import Starlette
from starlette.routing import Mount

from rubris_asgi import Rubris, Session
from rubris_asgi.batches import MemoryBatchStore
from rubris_asgi.client import Client
from rubris_asgi.spark import register

TOKEN = "example-token"
rubris = Rubris(api_token=TOKEN, batches=MemoryBatchStore())


@rubris.shared("trades.{symbol}", ring=1000)
async def trades(session: Session, symbol: str) -> None:
    return None


@rubris.queue("reprice")
async def reprice(session: Session) -> None:
    return None


@rubris.shared("pipeline.batches", ring=16)
async def pipeline_batches(session: Session) -> None:
    return None


app = Starlette(routes=[Mount("/rubris", rubris)], lifespan=rubris.lifespan)


def serve() -> tuple[str, uvicorn.Server]:
    """rubris on a free port, in a thread of its own (Spark's calls block this one)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", ws_per_message_deflate=False)
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return f"http://127.0.0.1:{sock.getsockname()[1]}/rubris", server


def work_the_batch(url: str, listening: threading.Event) -> None:
    """A worker ACKs every reprice job; another client learns of the tracked batch from its
    announcement and watches it complete. Runs in a thread while Spark writes."""

    async def main() -> None:
        async with Client(url) as worker, Client(url) as watcher:
            announced: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
            await watcher.subscribe("pipeline.batches", lambda v, _i: announced.put_nowait(v))
            listening.set()
            batch = (await asyncio.wait_for(announced.get(), 60))["batch"]
            done: list[int] = []
            await worker.consume("reprice", lambda item: done.append(item.value["job"]))
            final = await watcher.watch_batch(batch, timeout=60)
            print(f"worked {len(done)} jobs; batch:", final)

    asyncio.run(main())


def main() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    logging.basicConfig(level=logging.WARNING)
    url, server = serve()
    spark = (
        SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    try:
        rows = [("AAPL", 189.0 + i / 100, 100 + i) for i in range(5)]
        df = spark.createDataFrame(rows, "symbol STRING, px DOUBLE, qty LONG").coalesce(1)

        # 1. publish each row to trades.{symbol}
        (
            df.write.format("rubris")
            .option("url", url)
            .option("token", TOKEN)
            .option("topic", "trades.{symbol}")
            .option("columns", "px,qty")
            .mode("append")
            .save()
        )
        time.sleep(0.2)  # the intake hands them to the topic within a cycle or two

        # 2. enqueue one job a row, tracked as one batch, announced on pipeline.batches
        listening = threading.Event()
        workers = threading.Thread(target=work_the_batch, args=(url, listening))
        workers.start()
        listening.wait(30)
        jobs = spark.range(20).selectExpr("id AS job", "'AAPL' AS symbol")
        (
            jobs.write.format("rubris")
            .option("url", url)
            .option("token", TOKEN)
            .option("mode", "enqueue")
            .option("topic", "reprice")
            .option("idColumn", "job")
            .option("track", "true")
            .option("announce", "pipeline.batches")
            .mode("append")
            .save()
        )
        workers.join()

        # 3. read the ring back: the default columns, then payload fields by a schema
        reader = spark.read.format("rubris").option("url", url).option("token", TOKEN)
        raw = reader.option("topic", "trades.AAPL").load()
        print("read:", [(r.seq, r.data) for r in raw.orderBy("seq").collect()[:2]])

        # 4. a stream that resumes from its checkpoint on every run
        checkpoint = tempfile.mkdtemp()

        def run_once() -> None:
            query = (
                spark.readStream.format("rubris")
                .option("url", url)
                .option("token", TOKEN)
                .option("topic", "trades.AAPL")
                .option("startingOffsets", "earliest")
                .schema("seq BIGINT, px DOUBLE, qty BIGINT")
                .load()
                .writeStream.foreachBatch(
                    lambda batch, n: print(
                        f"micro-batch {n}:", [tuple(r) for r in batch.orderBy("seq").collect()]
                    )
                )
                .option("checkpointLocation", checkpoint)
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()

        run_once()  # micro-batch 0: the five rows written above
        rubris.publish("trades.AAPL", {"px": 190.0, "qty": 7})
        time.sleep(0.2)
        run_once()  # micro-batch 1: only the new one
    finally:
        spark.stop()
        server.should_exit = True


if __name__ == "__main__":
    main()
