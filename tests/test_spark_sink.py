"""The Spark sink against a real server: ``df.write`` / ``df.writeStream`` with
``format("rubris")`` reach WebSocket subscribers and queue consumers; a retried task enqueues
nothing twice; tracked writes complete when consumers ACK; bad rows and a dead server fail the
job with a clear error.

The server runs in the test's event loop (tests/server.py); Spark's calls block, so they run in
a thread while the loop serves the tasks' requests.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from rubris_asgi import Rubris, Session
from rubris_asgi.batches import MemoryBatchStore
from rubris_asgi.client import Client

from .apps import starlette_app
from .server import run_server
from .sparkkit import blocking
from .wirekit import until

TOKEN = "spark-token"


def make_app(**kwargs: Any) -> Rubris:
    rubris = Rubris(api_token=TOKEN, batches=MemoryBatchStore(), **kwargs)

    @rubris.shared("px.{symbol}", snapshot=True)
    async def px(session: Session, symbol: str) -> None:
        return None

    @rubris.shared("tape", ring=10_000)
    async def tape(session: Session) -> None:
        return None

    @rubris.shared("announce", ring=256)
    async def announce(session: Session) -> None:
        return None

    @rubris.queue("jobs", max_length=100_000, codel_target=None)
    async def jobs(session: Session) -> None:
        return None

    return rubris


def writer(df: Any, url: str, **options: str) -> Any:
    w = df.write.format("rubris").option("url", url).option("token", TOKEN)
    for k, v in options.items():
        w = w.option(k, v)
    return w.mode("append")


async def test_batch_write_publishes_to_subscribers(spark: Any) -> None:
    rubris = make_app()
    async with run_server(starlette_app(rubris)) as base:
        url = base + "/rubris"
        async with Client(url) as client:
            tape: list[Any] = []
            last: dict[str, Any] = {}
            await client.subscribe("tape", lambda v, _i: tape.append(v))
            await client.subscribe("px.B", lambda v, _i: last.update(v))
            rows = [(i, "AB"[i % 2], 100.0 + i) for i in range(3000)]
            df = spark.createDataFrame(rows, "i LONG, symbol STRING, price DOUBLE")
            await blocking(spark, writer(df.limit(600), url, topic="tape", batchSize="100").save)
            # one partition: two would race to set the snapshot's last value
            one = df.coalesce(1)
            await blocking(spark, writer(one, url, topic="px.{symbol}", columns="i,price").save)
            # a ring subscriber gets one message of a topic a cycle: 600 take a few seconds
            await until(
                lambda: len(tape) == 600 and last.get("i") == 2999,
                timeout=20,
                what=lambda: (len(tape), last),
            )
            assert sorted(v["i"] for v in tape) == list(range(600))
            assert tape[0] == {
                "i": tape[0]["i"],
                "symbol": "AB"[tape[0]["i"] % 2],
                "price": 100.0 + tape[0]["i"],
            }
            assert last == {"i": 2999, "price": 3099.0}  # only the columns asked for


async def test_stream_write_reaches_subscribers(spark: Any, tmp_path: Path) -> None:
    rubris = make_app()
    inbox = tmp_path / "in"
    inbox.mkdir()
    for f in range(2):
        lines = [json.dumps({"i": f * 100 + i, "symbol": "A"}) for i in range(100)]
        (inbox / f"{f}.json").write_text("\n".join(lines))
    async with run_server(starlette_app(rubris)) as base:
        url = base + "/rubris"
        async with Client(url) as client:
            tape: list[Any] = []
            await client.subscribe("tape", lambda v, _i: tape.append(v["i"]))

            def run() -> None:
                stream = spark.readStream.schema("i LONG, symbol STRING").json(str(inbox))
                query = (
                    stream.writeStream.format("rubris")
                    .option("url", url)
                    .option("token", TOKEN)
                    .option("topic", "tape")
                    .option("checkpointLocation", str(tmp_path / "ck"))
                    .trigger(availableNow=True)
                    .start()
                )
                query.awaitTermination(60)
                query.stop()

            await blocking(spark, run)
            await until(lambda: len(tape) == 200, timeout=15)
            assert sorted(tape) == list(range(200))


async def test_enqueue_retried_task_tracked_completes_once(spark: Any) -> None:
    # The server refuses the fourth enqueue request once (403: not retried), so the task fails
    # after its three accepted requests and Spark runs it again from its first row.
    asked = {"jobs": 0}

    def authorize(request: Any, topic: str) -> bool:
        if topic == "jobs":
            asked["jobs"] += 1
            return asked["jobs"] != 4
        return True

    rubris = make_app(authorize_api=authorize)
    async with run_server(starlette_app(rubris)) as base:
        url = base + "/rubris"
        async with Client(url) as client:
            announced: list[dict[str, Any]] = []
            await client.subscribe("announce", lambda v, _i: announced.append(v))
            done: list[int] = []
            # one partition: the fourth request is its task's fourth (with two running at once
            # it could be the other's first, which has nothing accepted to send again)
            df = spark.range(0, 6000, 1, 1).withColumnRenamed("id", "n")
            options = {"mode": "enqueue", "topic": "jobs", "batchSize": "100"}
            await blocking(
                spark,
                writer(df, url, **options, track="true", announce="announce").save,
            )
            stats = rubris.queue_stats("jobs")
            assert stats.enqueued == 6000  # each row once
            # the retry sent the failed attempt's three accepted requests again
            assert stats.duplicates == 300
            await until(lambda: len(announced) == 2, timeout=10)
            opened, sealed = announced
            batch = opened["batch"]
            assert opened == {"batch": batch, "state": "open"}
            assert sealed["batch"] == batch and sealed["state"] == "sealed"
            assert sealed["total"] == 6000 and sealed["rows"] == 6000
            watcher = asyncio.create_task(client.watch_batch(batch, timeout=30))
            await client.consume("jobs", lambda item: done.append(item.value["n"]), prefetch=500)
            final = await watcher
            assert final["state"] == "complete" and final["done"] == 6000
            assert sorted(done) == list(range(6000))
            # the deliberate 403 alone among the refusals the ops page counts
            assert rubris.engine.telemetry.api_refusals == {403: 1}


async def test_bad_rows_and_options_fail_clearly(spark: Any) -> None:
    rubris = make_app()
    async with run_server(starlette_app(rubris)) as base:
        url = base + "/rubris"
        df = spark.createDataFrame(
            [("A", 1.0), ("B", 2.0), ("C", 3.0), (None, 4.0)], "symbol STRING, price DOUBLE"
        ).coalesce(1)
        with pytest.raises(Exception, match=r"partition 0, row 3: .*'symbol' is null"):
            await blocking(spark, writer(df, url, topic="px.{symbol}").save)
        with pytest.raises(Exception, match=r"option topic 'px.\{sym\}': no column 'sym'"):
            await blocking(spark, writer(df, url, topic="px.{sym}").save)
        nan = spark.createDataFrame([("A", float("nan"))], "symbol STRING, price DOUBLE")
        with pytest.raises(Exception, match=r"row 0: column 'price' is nan"):
            await blocking(spark, writer(nan, url, topic="tape").save)
        with pytest.raises(Exception, match=r"no shared channel offers the topic 'nope'"):
            await blocking(spark, writer(df, url, topic="nope").save)
        with pytest.raises(Exception, match=r"option track needs mode enqueue"):
            await blocking(spark, writer(df, url, topic="tape", track="true").save)
        with pytest.raises(Exception, match=r"HTTP 401"):
            bad = df.write.format("rubris").option("url", url).option("topic", "tape")
            await blocking(spark, bad.mode("append").save)
    # the server is gone: the job fails once the retries run out, naming what failed
    with pytest.raises(Exception, match=r"not delivered within 0.5 s"):
        await blocking(spark, writer(df, url, topic="tape", retryFor="0.5").save)


async def test_stream_enqueue_tracked_replay_enqueues_nothing_twice(
    spark: Any, tmp_path: Path
) -> None:
    rubris = make_app()
    inbox = tmp_path / "in"
    inbox.mkdir()
    for f in range(2):
        (inbox / f"{f}.json").write_text(
            "\n".join(json.dumps({"n": f * 100 + i}) for i in range(100))
        )
    checkpoint = tmp_path / "ck"

    def run() -> None:
        stream = spark.readStream.schema("n LONG").option("maxFilesPerTrigger", 1).json(str(inbox))
        query = (
            stream.writeStream.format("rubris")
            .option("url", url)
            .option("token", TOKEN)
            .option("mode", "enqueue")
            .option("topic", "jobs")
            .option("track", "true")
            .option("announce", "announce")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(60)
        query.stop()

    async with run_server(starlette_app(rubris)) as base:
        url = base + "/rubris"
        async with Client(url) as client:
            announced: list[dict[str, Any]] = []
            await client.subscribe("announce", lambda v, _i: announced.append(v))
            await blocking(spark, run)
            await until(lambda: len([a for a in announced if "rows" in a]) == 2, timeout=10)
            sealed = [a for a in announced if "rows" in a]
            assert [(a["state"], a["total"], a["rows"]) for a in sealed] == [
                ("sealed", 100, 100),
                ("sealed", 100, 100),
            ]
            query_batches = [a["batch"] for a in sealed]
            assert query_batches[0].endswith("-0") and query_batches[1].endswith("-1")
            # each micro-batch's batch opened once, by its task: no 409 from the commit
            assert not rubris.engine.telemetry.api_refusals
            # the driver died after the sink's commit of micro-batch 1 but before Spark
            # recorded it: the restarted query writes micro-batch 1 again
            (checkpoint / "commits" / "1").unlink()
            (checkpoint / "commits" / ".1.crc").unlink(missing_ok=True)
            await blocking(spark, run)
            await until(lambda: len([a for a in announced if "rows" in a]) == 3, timeout=10)
            replay = [a for a in announced if "rows" in a][-1]
            assert replay["batch"] == query_batches[1]  # the same batch
            assert (replay["total"], replay["rows"]) == (100, 100)  # and nothing added to it
            # the replay's task found its batch open: the 409 that tells it so is an answer
            # to a producer that chose the id, not an error the ops page counts
            assert not rubris.engine.telemetry.api_refusals
            stats = rubris.queue_stats("jobs")
            assert (stats.enqueued, stats.duplicates) == (200, 100)
            done: list[int] = []
            await client.consume("jobs", lambda item: done.append(item.value["n"]), prefetch=500)
            for batch in query_batches:
                final = await client.watch_batch(batch, timeout=30)
                assert (final["state"], final["done"]) == ("complete", 100)
            assert sorted(done) == list(range(200))
