"""The Spark sink writing keyed topics (live tables, protocol.md 5b): options ``keyColumn`` and
``opColumn``, the entries rows become, a batch write with a retried task, and a stream keeping
a table equal to the latest state of each key of its source."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from pyspark.sql import Row
from pyspark.sql.types import (
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from rubris_asgi import Rubris, Session
from rubris_asgi.spark.options import OptionError, SinkOptions
from rubris_asgi.spark.rows import RowEncoder, RowError

from .apps import starlette_app
from .server import run_server
from .sparkkit import blocking

TOKEN = "spark-keyed-token"
SCHEMA = StructType(
    [
        StructField("sym", StringType()),
        StructField("px", DoubleType()),
        StructField("qty", LongType()),
        StructField("op", StringType()),
    ]
)


def encode(row: Row, index: int = 0, schema: StructType = SCHEMA, **options: str) -> Any:
    opts = SinkOptions.parse({"url": "http://h/rubris", "topic": "book", **options}, schema)
    return orjson.loads(RowEncoder(opts, "w1", 2).line(index, row))


# rows to entries, without a Spark job


def test_rows_become_sets_patches_and_deletes() -> None:
    keyed = {"keyColumn": "sym", "opColumn": "op"}
    # the payload is the row less its op column; set (the default) is left out of the entry
    assert encode(Row("A", 1.5, 10, None), **keyed) == {
        "topic": "book",
        "key": "A",
        "data": {"sym": "A", "px": 1.5, "qty": 10},
    }
    assert encode(Row("A", 1.5, 10, "set"), **keyed)["data"] == {"sym": "A", "px": 1.5, "qty": 10}
    assert encode(Row("A", None, 3, " PATCH "), columns="px,qty", **keyed) == {
        "topic": "book",
        "key": "A",
        "op": "patch",
        "data": {"px": None, "qty": 3},  # a merge patch: the null removes px
    }
    # a delete carries no data, so nothing of the payload is checked (a NaN is no error)
    assert encode(Row("A", float("nan"), None, "delete"), **keyed) == {
        "topic": "book",
        "key": "A",
        "op": "delete",
    }
    # without opColumn every row is a set, the whole row its payload
    assert encode(Row("A", 1.0, 1, "delete"), keyColumn="sym")["data"]["op"] == "delete"
    # an integer key goes in decimal; a topic template works as for any topic
    ints = StructType([StructField("level", IntegerType()), StructField("sym", StringType())])
    line = encode(Row(18925, "AAPL"), schema=ints, keyColumn="level", topic="book.{sym}")
    assert line == {"topic": "book.AAPL", "key": "18925", "data": {"level": 18925, "sym": "AAPL"}}


@pytest.mark.parametrize(
    ("row", "error"),
    [
        (Row(None, 1.0, 1, None), r"partition 2, row 4: the key column 'sym' is null"),
        (Row("", 1.0, 1, None), r"partition 2, row 4: the key column 'sym' is empty"),
        (Row("A", 1.0, 1, "upsert"), r"the op column 'op' is 'upsert': set, patch, delete"),
        (Row("A", 1.0, 1, "replace"), r"the op column 'op' is 'replace'"),
        (Row("A", float("inf"), 1, "set"), r"column 'px' is inf"),
    ],
)
def test_bad_keyed_rows_are_named(row: Row, error: str) -> None:
    with pytest.raises(RowError, match=error):
        encode(row, 4, keyColumn="sym", opColumn="op")


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"keyColumn": "sym", "mode": "enqueue"}, r"keyColumn is for mode publish"),
        ({"opColumn": "op"}, r"option opColumn needs keyColumn"),
        ({"keyColumn": "symbol"}, r"option keyColumn: no column 'symbol'"),
        ({"keyColumn": "sym", "opColumn": "action"}, r"option opColumn: no column 'action'"),
        ({"keyColumn": "px"}, r"column 'px' is double; a key is a string"),
        ({"keyColumn": "sym", "opColumn": "qty"}, r"column 'qty' is bigint; it must be a string"),
        ({"keyColumn": "sym", "opColumn": "sym"}, r"name the same column"),
    ],
)
def test_keyed_option_mistakes_are_named(options: dict[str, str], error: str) -> None:
    with pytest.raises(OptionError, match=error):
        SinkOptions.parse({"url": "http://h/rubris", "topic": "book", **options}, SCHEMA)


def test_keyed_option_names_ignore_case() -> None:
    opts = SinkOptions.parse(
        {"url": "http://h/rubris", "topic": "book", "KEYCOLUMN": "sym", "opcolumn": "op"}, SCHEMA
    )
    assert (opts.key_column, opts.op_column) == ("sym", "op")


# against a server


def make_app(**kwargs: Any) -> Rubris:
    rubris = Rubris(api_token=TOKEN, batches=False, **kwargs)

    @rubris.shared("book", keyed=True)
    async def book(session: Session) -> None:
        return None

    @rubris.shared("quotes.{venue}", keyed=True, max_keys=1000)
    async def quotes(session: Session, venue: str) -> None:
        return None

    return rubris


def fold(rows: list[dict[str, Any]], key: str = "sym") -> dict[str, Any]:
    """The latest state of each key of ``rows`` taken in order, as the sink's ops make it."""
    table: dict[str, Any] = {}
    for row in rows:
        op = row.get("op") or "set"
        value = {k: v for k, v in row.items() if k != "op"}
        if op == "delete":
            table.pop(row[key], None)
        else:
            table[row[key]] = value
    return table


async def test_a_batch_write_sets_and_deletes_keys_and_a_retry_repeats_nothing(
    spark: Any,
) -> None:
    # The server refuses the third request to "book" once (403: not retried), so the task
    # fails after two accepted requests and Spark runs it again from its first row: its sets
    # and deletes are sent again, and the table ends the same.
    asked = {"book": 0}

    def authorize(request: Any, name: str) -> bool:
        if name == "book":
            asked["book"] += 1
            return asked["book"] != 3
        return True

    rubris = make_app(authorize_api=authorize)
    rows = []
    for i in range(500):
        sym = f"S{i % 40}"
        op = "delete" if i % 7 == 3 else "set"
        rows.append({"sym": sym, "px": 100.0 + i, "qty": i, "op": op})
    async with run_server(starlette_app(rubris)) as base:
        url = base + "/rubris"
        # one partition: its rows, and so each key's, are sent in order
        df = spark.createDataFrame(
            [(r["sym"], r["px"], r["qty"], r["op"]) for r in rows], SCHEMA
        ).coalesce(1)
        write = (
            df.write.format("rubris")
            .option("url", url)
            .option("token", TOKEN)
            .option("topic", "book")
            .option("keyColumn", "sym")
            .option("opColumn", "op")
            .option("batchSize", "100")
            .mode("append")
        )
        await blocking(spark, write.save)
        assert asked["book"] >= 6  # five requests, one refused and sent again
        expected = fold(rows)
        assert 0 < len(expected) < 40  # some keys ended deleted
        assert rubris.entries("book") == expected
        # what a reader outside the process reads: the same table
        async with httpx.AsyncClient(base_url=url) as http:
            r = await http.get(
                "/api/topics/book",
                params={"limit": 10_000},
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            body = r.json()
            assert body["reset"] is True and body["next"] == body["head"]
            assert {e["key"]: e["data"] for e in body["entries"]} == expected
        # a topic template and patches: each venue's table of its symbols
        patches = spark.createDataFrame(
            [("X", "A", 1.0, None, None), ("X", "A", None, 5, "patch"), ("Y", "B", 2.0, 1, None)],
            "venue STRING, sym STRING, px DOUBLE, qty LONG, op STRING",
        ).coalesce(1)
        write = (
            patches.write.format("rubris")
            .option("url", url)
            .option("token", TOKEN)
            .option("topic", "quotes.{venue}")
            .option("keyColumn", "sym")
            .option("opColumn", "op")
            .option("columns", "px,qty")
            .mode("append")
        )
        await blocking(spark, write.save)
        # the patch's null px removed px; its qty merged in
        assert rubris.entries("quotes.X") == {"A": {"qty": 5}}
        assert rubris.entries("quotes.Y") == {"B": {"px": 2.0, "qty": 1}}


@pytest.mark.slow
async def test_a_stream_keeps_a_live_table(spark: Any, tmp_path: Path) -> None:
    # Each file is one micro-batch (maxFilesPerTrigger 1) and one partition, its rows in order:
    # sets, changes and deletes of a few keys. After every micro-batch the table is the
    # latest state of each key of the rows so far.
    rubris = make_app()
    inbox = tmp_path / "in"
    inbox.mkdir()
    files: list[list[dict[str, Any]]] = [
        [{"sym": s, "px": 10.0 + i, "qty": i, "op": None} for i, s in enumerate("ABCDE")],
        [
            {"sym": "A", "px": 11.5, "qty": 7, "op": "set"},
            {"sym": "B", "px": None, "qty": None, "op": "delete"},
            {"sym": "F", "px": 20.0, "qty": 1, "op": None},
            {"sym": "A", "px": 12.0, "qty": 8, "op": None},  # the same key twice in a batch
        ],
        [
            {"sym": "B", "px": 30.0, "qty": 3, "op": None},  # back after its delete
            {"sym": "C", "px": None, "qty": None, "op": "DELETE"},
            {"sym": "Z", "px": None, "qty": None, "op": "delete"},  # never held: nothing
        ],
    ]
    start = 1_700_000_000
    for n, lines in enumerate(files):
        path = inbox / f"{n}.json"
        path.write_text("\n".join(json.dumps(line) for line in lines))
        os.utime(path, (start + n, start + n))  # the stream takes them in this order
    seen: list[int] = []

    def run() -> None:
        stream = (
            spark.readStream.schema("sym STRING, px DOUBLE, qty LONG, op STRING")
            .option("maxFilesPerTrigger", 1)
            .json(str(inbox))
        )
        query = (
            stream.writeStream.format("rubris")
            .option("url", url)
            .option("token", TOKEN)
            .option("topic", "book")
            .option("keyColumn", "sym")
            .option("opColumn", "op")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(90)
        seen.extend(int(p["numInputRows"]) for p in query.recentProgress)
        query.stop()

    async with run_server(starlette_app(rubris)) as base:
        url = base + "/rubris"
        await blocking(spark, run)
        assert [n for n in seen if n] == [5, 4, 3]  # one micro-batch a file
        rows = [{**row, "op": (row["op"] or "set").lower()} for lines in files for row in lines]
        expected = fold(rows)
        assert expected == {
            "A": {"sym": "A", "px": 12.0, "qty": 8},
            "B": {"sym": "B", "px": 30.0, "qty": 3},
            "D": {"sym": "D", "px": 13.0, "qty": 3},
            "E": {"sym": "E", "px": 14.0, "qty": 4},
            "F": {"sym": "F", "px": 20.0, "qty": 1},
        }
        assert rubris.entries("book") == expected


async def test_the_source_says_a_keyed_topic_is_not_for_it() -> None:
    from rubris_asgi.spark.pages import RubrisSourceError, TopicClient
    from rubris_asgi.spark.source_options import SourceOptions

    rubris = make_app()
    async with run_server(starlette_app(rubris)) as base:
        rubris.set("book", "AAPL", {"px": 1})
        opts = SourceOptions.parse({"url": base + "/rubris", "token": TOKEN, "topic": "book"})

        def read() -> None:
            with TopicClient(opts) as client:
                client.page("book", 0, 0, 10)

        with pytest.raises(RubrisSourceError, match="'book' is a keyed topic"):
            await asyncio.to_thread(read)
