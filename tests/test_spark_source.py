"""The Spark source (spark/source.py, with source_options.py, pages.py and convert.py): batch
and streaming reads of shared topics over ``GET {mount}/api/topics/{name}``, offsets in
checkpoints, data loss, schemas, errors.

A real rubris runs under uvicorn in the test's event loop; Spark's calls block, so they run in
a thread (``asyncio.to_thread``) while the loop serves them. Publishing goes straight into the
app (``rubris.publish``), which stores a message at once.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import decimal
import logging
import pickle
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from rubris_asgi import Codec, Config, Rubris, Session
from rubris_asgi.spark import convert, pages, source
from rubris_asgi.spark.convert import DEFAULT_SCHEMA
from rubris_asgi.spark.source import TopicRange
from rubris_asgi.spark.source_options import (
    DataLossError,
    RubrisSourceError,
    SourceOptionError,
    SourceOptions,
)

from .apps import starlette_app
from .server import run_server

TOKEN = "spark-read-token"


def make() -> Rubris:
    rubris = Rubris(Config(), api_token=TOKEN, batches=False)

    @rubris.shared("trades.{symbol}", ring=16)
    async def trades(session: Session, symbol: str) -> None:
        return None

    @rubris.shared("quotes.{name}", ring=64)
    async def quotes(session: Session, name: str) -> None:
        return None

    @rubris.shared("status", snapshot=True)
    async def status(session: Session) -> None:
        return None

    @rubris.shared("log", ring=16, codec=Codec.TEXT)
    async def log(session: Session) -> None:
        return None

    @rubris.shared("blobs", ring=16, codec=Codec.BYTES)
    async def blobs(session: Session) -> None:
        return None

    @rubris.private("inbox")
    async def inbox(session: Session) -> None:
        return None

    return rubris


@pytest.fixture
async def served() -> AsyncIterator[tuple[Rubris, str]]:
    """The app mounted at /rubris, and its mount URL."""
    rubris = make()
    async with run_server(starlette_app(rubris)) as base:
        yield rubris, f"{base}/rubris"


def options(url: str, **more: Any) -> dict[str, str]:
    return {"url": url, "token": TOKEN, **{k: str(v) for k, v in more.items()}}


def load(spark: Any, opts: dict[str, str], schema: str | None = None) -> list[Any]:
    """A batch read, collected, sorted by topic and seq where it has them."""
    reader = spark.read.format("rubris").options(**opts)
    if schema is not None:
        reader = reader.schema(schema)
    return list(reader.load().collect())


def stream(
    spark: Any, opts: dict[str, str], checkpoint: Path, *, schema: str | None = None
) -> list[list[Any]]:
    """One ``trigger(availableNow=True)`` run from ``checkpoint``: the rows of each
    micro-batch, in order. Raises what the query failed with."""
    batches: list[list[Any]] = []

    def collect(df: Any, batch_id: int) -> None:
        batches.append(sorted(df.collect(), key=lambda r: (r["topic"], r["seq"])))

    reader = spark.readStream.format("rubris").options(**opts)
    if schema is not None:
        reader = reader.schema(schema)
    query = (
        reader.load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(90), "the query did not finish"
    finally:
        query.stop()
    return batches


def seqs(rows: list[Any], topic: str | None = None) -> list[int]:
    return sorted(r["seq"] for r in rows if topic is None or r["topic"] == topic)


def flat(batches: list[list[Any]]) -> list[Any]:
    return [r for b in batches for r in b]


async def test_a_batch_read_is_what_each_topic_holds(
    spark: Any, served: tuple[Rubris, str]
) -> None:
    rubris, url = served
    for i in range(1, 21):  # a ring of 16: it holds 5..20
        rubris.publish("trades.A", {"i": i, "px": i + 0.5})
    for i in range(1, 4):
        rubris.publish("trades.B", [i])
    for state in ("starting", "up", "busy"):
        rubris.publish("status", {"state": state})
    rubris.publish("log", "a line")
    rubris.publish("blobs", b"\x00\xff")
    epoch = rubris.engine.topics["trades.A"].epoch
    opts = options(url, topics="trades.A, trades.B,status,log,blobs")
    rows = await asyncio.to_thread(load, spark, opts)
    assert rows and rows[0].__fields__ == ["topic", "epoch", "seq", "data"]
    assert seqs(rows, "trades.A") == list(range(5, 21))
    assert seqs(rows, "trades.B") == [1, 2, 3]
    a = {r["seq"]: r for r in rows if r["topic"] == "trades.A"}
    assert orjson.loads(a[7]["data"]) == {"i": 7, "px": 7.5} and a[7]["epoch"] == epoch
    by_topic = {r["topic"]: r for r in rows if r["topic"] in ("status", "log", "blobs")}
    assert (by_topic["status"]["seq"], orjson.loads(by_topic["status"]["data"])) == (
        3,
        {"state": "busy"},
    )
    assert by_topic["log"]["data"] == "a line"
    assert base64.b64decode(by_topic["blobs"]["data"]) == b"\x00\xff"
    assert len(rows) == 16 + 3 + 3


async def test_a_stream_resumes_from_its_checkpoint_and_fails_on_loss(
    spark: Any, served: tuple[Rubris, str], tmp_path: Path
) -> None:
    rubris, url = served
    checkpoint = tmp_path / "checkpoint"
    for i in range(1, 6):
        rubris.publish("trades.A", {"i": i})
    epoch = rubris.engine.topics["trades.A"].epoch
    opts = options(url, topic="trades.A", startingOffsets="earliest")
    first = flat(await asyncio.to_thread(stream, spark, opts, checkpoint))
    assert seqs(first) == [1, 2, 3, 4, 5]
    assert [orjson.loads(r["data"])["i"] for r in first] == [1, 2, 3, 4, 5]

    for i in range(6, 11):
        rubris.publish("trades.A", {"i": i})
    # the same checkpoint: from seq 5 on, whatever startingOffsets says now
    second = flat(await asyncio.to_thread(stream, spark, opts, checkpoint))
    assert seqs(second) == [6, 7, 8, 9, 10]

    for i in range(11, 41):  # while stopped the ring of 16 overruns: it holds 25..40
        rubris.publish("trades.A", {"i": i})
    with pytest.raises(Exception) as failed:
        await asyncio.to_thread(stream, spark, opts, checkpoint)
    message = str(failed.value)
    assert f"rubris topic 'trades.A': seqs 11..24 of epoch {epoch} are lost" in message
    assert "the ring now holds 25..40" in message and "failOnDataLoss" in message

    lenient = {**opts, "failOnDataLoss": "false"}
    third = flat(await asyncio.to_thread(stream, spark, lenient, checkpoint))
    assert seqs(third) == list(range(25, 41))  # from the oldest held, no duplicates

    for i in range(41, 44):
        rubris.publish("trades.A", {"i": i})
    fourth = flat(await asyncio.to_thread(stream, spark, lenient, checkpoint))
    assert seqs(fourth) == [41, 42, 43]


async def test_latest_start_and_a_snapshot_in_a_running_query(
    spark: Any, served: tuple[Rubris, str]
) -> None:
    rubris, url = served
    for i in range(3):
        rubris.publish("trades.A", {"before": i})  # before the query: latest skips them
    rubris.publish("status", {"state": "old"})
    opts = options(url, topics="trades.A,trades.B,status")

    def start() -> Any:
        return (
            spark.readStream.format("rubris")
            .options(**opts)
            .load()
            .writeStream.format("memory")
            .queryName("rubris_latest")
            .trigger(processingTime="200 milliseconds")  # not a busy loop of requests
            .start()
        )

    query = await asyncio.to_thread(start)
    try:
        await asyncio.to_thread(query.processAllAvailable)
        for i in range(4):
            rubris.publish("trades.A", {"after": i})
        for i in range(2):
            rubris.publish("trades.B", {"after": i})
        for state in ("a", "b", "c"):
            rubris.publish("status", {"state": state})  # conflated: the latest value arrives
        # twice: a trigger that asked for the heads just before the publishes may end the
        # first wait with "no new data"; the second waits for a trigger that started after
        for _ in range(2):
            await asyncio.to_thread(query.processAllAvailable)
        rows = await asyncio.to_thread(lambda: spark.sql("SELECT * FROM rubris_latest").collect())
    finally:
        await asyncio.to_thread(query.stop)
    assert seqs(rows, "trades.A") == [4, 5, 6, 7]
    assert seqs(rows, "trades.B") == [1, 2]
    assert [(r["seq"], orjson.loads(r["data"])) for r in rows if r["topic"] == "status"] == [
        (4, {"state": "c"})
    ]


async def test_max_messages_per_trigger_splits_micro_batches(
    spark: Any, served: tuple[Rubris, str], tmp_path: Path
) -> None:
    rubris, url = served
    for i in range(7):
        rubris.publish("trades.A", i)
    for i in range(3):
        rubris.publish("trades.B", i)
    opts = options(
        url, topics="trades.A,trades.B", startingOffsets="earliest", maxMessagesPerTrigger=4
    )
    batches = await asyncio.to_thread(stream, spark, opts, tmp_path / "checkpoint")
    assert [len(b) for b in batches] == [4, 4, 2]
    assert seqs(flat(batches), "trades.A") == list(range(1, 8))
    assert seqs(flat(batches), "trades.B") == [1, 2, 3]
    # shared fairly: the quiet topic is not left until the busy one is done
    assert {r["topic"] for r in batches[0]} == {"trades.A", "trades.B"}


async def test_a_schema_of_payload_fields(spark: Any, served: tuple[Rubris, str]) -> None:
    rubris, url = served
    rubris.publish("quotes.good", {"sym": "A", "px": 1.5, "qty": 10, "ok": True})
    rubris.publish("quotes.good", {"sym": "B", "px": 2, "qty": 3.0, "extra": [1]})
    rubris.publish("quotes.good", {"sym": "C", "px": None, "qty": 7, "ok": False, "n": {"x": 1}})
    opts = options(url, topic="quotes.good")
    given = "seq BIGINT, sym STRING, px DOUBLE, qty BIGINT, ok BOOLEAN, missing STRING"
    rows = await asyncio.to_thread(load, spark, opts, given)
    assert [r.asDict() for r in sorted(rows, key=lambda r: r["seq"])] == [
        {"seq": 1, "sym": "A", "px": 1.5, "qty": 10, "ok": True, "missing": None},
        {"seq": 2, "sym": "B", "px": 2.0, "qty": 3, "ok": None, "missing": None},
        {"seq": 3, "sym": "C", "px": None, "qty": 7, "ok": False, "missing": None},
    ]
    infer = {**opts, "inferSchema": "true"}
    schema = await asyncio.to_thread(
        lambda: spark.read.format("rubris").options(**infer).load().schema.simpleString()
    )
    assert schema == (
        "struct<topic:string,epoch:bigint,seq:bigint,sym:string,px:double,qty:double,"
        "ok:boolean,extra:string,n:string>"  # qty: 10 and 3.0, so a double
    )
    inferred = await asyncio.to_thread(load, spark, infer)
    got = sorted(inferred, key=lambda r: r["seq"])
    assert [(r["topic"], r["sym"], r["px"], r["qty"], r["extra"], r["n"]) for r in got] == [
        ("quotes.good", "A", 1.5, 10.0, None, None),
        ("quotes.good", "B", 2.0, 3.0, "[1]", None),
        ("quotes.good", "C", None, 7.0, None, '{"x":1}'),
    ]
    # the option schema (DDL) works like .schema()
    ddl = await asyncio.to_thread(load, spark, {**opts, "schema": "sym STRING, qty INT"})
    assert sorted((r["sym"], r["qty"]) for r in ddl) == [("A", 10), ("B", 3), ("C", 7)]

    rubris.publish("quotes.bad", {"qty": 1})
    rubris.publish("quotes.bad", {"qty": 2.5})
    with pytest.raises(Exception) as failed:
        await asyncio.to_thread(load, spark, options(url, topic="quotes.bad"), "qty BIGINT")
    assert "topic 'quotes.bad' seq 2" in str(failed.value)
    assert "column 'qty': expected an integer for bigint, got 2.5" in str(failed.value)


async def test_refusals_are_clear_errors(spark: Any, served: tuple[Rubris, str]) -> None:
    rubris, url = served
    bad_token = {**options(url, topic="trades.A"), "token": "wrong"}
    with pytest.raises(Exception) as failed:
        await asyncio.to_thread(load, spark, bad_token)
    assert (
        f"rubris at {url} refused to read topic 'trades.A': 401 a valid bearer token is required"
        in str(failed.value)
    )
    with pytest.raises(Exception) as failed:
        await asyncio.to_thread(load, spark, options(url, topic="inbox"))
    assert "404 no shared channel offers the topic 'inbox'" in str(failed.value)
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}/rubris"
    with pytest.raises(Exception) as failed:
        await asyncio.to_thread(load, spark, options(closed, topic="trades.A"))
    assert f"cannot reach rubris at {closed} to read topic 'trades.A'" in str(failed.value)


# --------------------------------------------------------------------------- without Spark


async def test_the_stream_reader_on_its_own(served: tuple[Rubris, str]) -> None:
    """The driver's calls as Spark makes them, with a ReadLimit, without a Spark session."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

    rubris, url = served
    for i in range(10):
        rubris.publish("trades.A", i)
    rubris.publish("status", "v1")
    reader = source.stream_reader(
        options(url, topics="trades.A,trades.B,status", startingOffsets="earliest"),
        DEFAULT_SCHEMA,
    )
    assert isinstance(reader, source.RubrisStreamReader)

    def driver() -> dict[str, Any]:
        out: dict[str, Any] = {}
        start = out["initial"] = reader.initialOffset()
        out["capped"] = reader.latestOffset(start, ReadMaxRows(4))
        out["parts"] = reader.partitions(start, out["capped"])
        out["all"] = reader.latestOffset(out["capped"], ReadAllAvailable())
        out["wait"] = reader.latestOffset(out["all"], ReadMinRows(1))
        out["state"] = pickle.loads(pickle.dumps(reader)).__dict__
        return out

    out = await asyncio.to_thread(driver)
    epochs = {t: rubris.engine.topics[t].epoch for t in ("trades.A", "trades.B", "status")}
    assert out["initial"] == {
        "trades.A": {"epoch": epochs["trades.A"], "seq": 0},
        "trades.B": {"epoch": epochs["trades.B"], "seq": 0},
        "status": {"epoch": epochs["status"], "seq": 0},
    }
    # 4 shared out: trades.B has none, status one, trades.A the rest
    assert {t: o["seq"] for t, o in out["capped"].items()} == {
        "trades.A": 3,
        "trades.B": 0,
        "status": 1,
    }
    parts = {p.topic: p for p in out["parts"]}
    assert set(parts) == {"trades.A", "status"}
    # the snapshot's value was fetched with its offset and travels in the partition
    assert parts["status"].held == [{"seq": 1, "data": "v1"}] and parts["status"].codec == "json"
    assert parts["trades.A"].held is None and parts["trades.A"].end_seq == 3
    assert {t: o["seq"] for t, o in out["all"].items()} == {
        "trades.A": 10,
        "trades.B": 0,
        "status": 1,
    }
    assert out["wait"] == out["all"]  # nothing new: the start, as it was
    assert out["state"]["_http"] is None and out["state"]["opts"] == reader.opts

    rows = await asyncio.to_thread(lambda: list(reader.read(parts["trades.A"])))
    assert [(r[0], r[2], r[3]) for r in rows] == [("trades.A", s, str(s - 1)) for s in (1, 2, 3)]
    reader.stop()


async def test_available_now_and_the_calls_before_spark_4_2(served: tuple[Rubris, str]) -> None:
    from pyspark.sql.streaming.datasource import (
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    rubris, url = served
    for i in range(5):
        rubris.publish("trades.A", i)
    opts = options(url, topic="trades.A", startingOffsets="earliest", maxMessagesPerTrigger=2)
    reader = source.stream_reader(opts, DEFAULT_SCHEMA)
    assert isinstance(reader, SupportsTriggerAvailableNow)
    assert reader.getDefaultReadLimit() == ReadMaxRows(2)

    def prepare() -> dict[str, Any]:
        start = reader.initialOffset()
        reader.prepareForTriggerAvailableNow()
        return start

    start = await asyncio.to_thread(prepare)
    for i in range(5):
        rubris.publish("trades.A", i)  # after the query started: not this run's

    def drain() -> list[int]:
        ends, offset = [], start
        while (end := reader.latestOffset(offset, ReadMaxRows(2))) != offset:
            ends.append(end["trades.A"]["seq"])
            offset = end
        return ends

    assert await asyncio.to_thread(drain) == [2, 4, 5]
    reader.stop()

    # Spark 4.0 and 4.1 call latestOffset() alone: the cap counts from the last offset known
    legacy = source.stream_reader(opts, DEFAULT_SCHEMA)

    def old_calls() -> list[int]:
        legacy.initialOffset()
        return [legacy.latestOffset()["trades.A"]["seq"] for _ in range(3)]

    assert await asyncio.to_thread(old_calls) == [2, 4, 6]
    legacy.stop()
    # a restart there knows no start at all: the head, uncapped
    restarted = source.stream_reader(opts, DEFAULT_SCHEMA)
    assert (await asyncio.to_thread(restarted.latestOffset))["trades.A"]["seq"] == 10
    restarted.stop()


async def test_a_range_read_pages_and_sees_an_epoch_change(
    served: tuple[Rubris, str], caplog: pytest.LogCaptureFixture
) -> None:
    rubris, url = served
    for i in range(12):
        rubris.publish("trades.A", i)
    epoch = rubris.engine.topics["trades.A"].epoch
    opts = SourceOptions.parse(options(url, topic="trades.A"))

    def read(part: TopicRange, o: SourceOptions = opts) -> list[tuple[Any, ...]]:
        return list(source.read_range(o, DEFAULT_SCHEMA, part))

    page_size = pages.PAGE
    pages.PAGE = 5  # several pages for one range
    try:
        rows = await asyncio.to_thread(read, TopicRange("trades.A", epoch, 2, epoch, 11))
    finally:
        pages.PAGE = page_size
    assert [r[2] for r in rows] == list(range(3, 12))
    # the range began in an epoch that is gone: its rest is lost
    old = TopicRange("trades.A", epoch + 1, 7, epoch, 12)
    with pytest.raises(DataLossError) as failed:
        await asyncio.to_thread(read, old)
    assert f"its epoch changed from {epoch + 1} to {epoch}" in str(failed.value)
    assert "what followed seq 7" in str(failed.value)
    lenient = SourceOptions.parse(options(url, topic="trades.A", failOnDataLoss="false"))
    with caplog.at_level(logging.WARNING, "rubris_asgi.spark"):
        rows = await asyncio.to_thread(read, old, lenient)
    assert [r[2] for r in rows] == list(range(1, 13))  # the new numbering, from its oldest
    # the source's records only: an app of another test (Litestar's) may have set the root
    # logger to INFO, and httpx logs every request there
    said = [r.getMessage() for r in caplog.records if r.name == "rubris_asgi.spark"]
    assert said == [
        f"rubris topic 'trades.A': its epoch changed from {epoch + 1} to {epoch} (the server "
        f"restarted or the topic was recreated): what followed seq 7 of epoch {epoch + 1} is "
        "lost; going on from what is held (failOnDataLoss=false)"
    ]
    # planned in an epoch the server no longer has: nothing of it can be read
    gone = TopicRange("trades.A", epoch + 1, 0, epoch + 1, 5)
    with pytest.raises(DataLossError, match="before the micro-batch was read"):
        await asyncio.to_thread(read, gone)
    assert await asyncio.to_thread(read, gone, lenient) == []


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ({}, "option url is required"),
        ({"url": "ftp://x"}, "option url is required"),
        ({"url": "http://x"}, "one of the options topic"),
        ({"url": "http://x", "topic": "a", "topics": "b"}, "one of the options topic"),
        ({"url": "http://x", "topics": " , "}, "name no topic"),
        ({"url": "http://x", "topic": "a", "failOnDataLoss": "maybe"}, "failOnDataLoss is true"),
        ({"url": "http://x", "topic": "a", "timeout": "0"}, "timeout must be at least"),
        ({"url": "http://x", "topic": "a", "maxMessagesPerTrigger": "0"}, "at least 1"),
        ({"url": "http://x", "topic": "a", "maxMessagesPerTrigger": "2.5"}, "an integer"),
        ({"url": "http://x", "topic": "a", "startingOffsets": "oldest"}, "startingOffsets"),
        ({"url": "http://x", "topic": "a", "startingOffsets": '{"b": {}}'}, "naming every"),
        (
            {"url": "http://x", "topic": "a", "startingOffsets": '{"a": {"epoch": 1, "seq": -1}}'},
            "integers from 0",
        ),
    ],
)
def test_options_are_checked(given: dict[str, str], reason: str) -> None:
    with pytest.raises(SourceOptionError, match=reason):
        SourceOptions.parse(given)


def test_options_ignore_case_and_keep_given_offsets() -> None:
    opts = SourceOptions.parse(
        {
            "URL": "http://h/rubris/",
            "Topics": "a,b,a",
            "STARTINGOFFSETS": '{"a": {"epoch": 5, "seq": 2}, "b": {"epoch": 6, "seq": 0}}',
            "failondataloss": "FALSE",
            "maxMessagesPerTrigger": "100",
        }
    )
    assert opts.url == "http://h/rubris" and opts.topics == ("a", "b")
    assert opts.starting == {"a": {"epoch": 5, "seq": 2}, "b": {"epoch": 6, "seq": 0}}
    assert not opts.fail_on_data_loss and opts.max_per_trigger == 100 and opts.timeout == 30
    assert source.source_schema({"url": "x"}) == DEFAULT_SCHEMA
    assert source.source_schema({"Schema": "a INT"}) == "a INT"
    with pytest.raises(SourceOptionError, match="exclude each other"):
        source.source_schema({"schema": "a INT", "inferschema": "true"})
    with pytest.raises(SourceOptionError, match="batch read starts at earliest"):
        source.batch_reader(
            {"url": "http://x", "topic": "a", "startingOffsets": "latest"}, DEFAULT_SCHEMA
        )


def test_values_convert_to_the_schema_types() -> None:
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        DateType,
        DecimalType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    def conv(dt: Any) -> Callable[[Any], Any]:
        return convert.converter(dt)

    assert conv(LongType())(3.0) == 3 and conv(LongType())(None) is None
    for bad in (2.5, "3", True, 2**63):
        with pytest.raises(convert._BadValue):
            conv(LongType())(bad)
    with pytest.raises(convert._BadValue, match="out of range for int"):
        conv(IntegerType())(2**31)
    assert conv(StringType())({"a": [1]}) == '{"a":[1]}' and conv(StringType())(5) == "5"
    assert conv(DecimalType(10, 2))(1.25) == decimal.Decimal("1.25")
    utc = datetime.timezone.utc
    assert conv(TimestampType())(0) == datetime.datetime(1970, 1, 1, tzinfo=utc)
    assert conv(TimestampType())("2026-01-02T03:04:05") == datetime.datetime(
        2026, 1, 2, 3, 4, 5, tzinfo=utc
    )
    assert conv(DateType())("2026-01-02") == datetime.date(2026, 1, 2)
    assert conv(BinaryType())("AP8=") == b"\x00\xff"
    assert conv(ArrayType(LongType()))([1, 2.0]) == [1, 2]
    assert conv(MapType(StringType(), LongType()))({"a": 1}) == {"a": 1}
    nested = StructType([StructField("x", LongType()), StructField("y", StringType())])
    assert conv(nested)({"x": 1.0}) == {"x": 1, "y": None}
    with pytest.raises(convert._BadValue, match="expected a list"):
        conv(ArrayType(LongType()))({"a": 1})


def test_shares_are_fair() -> None:
    assert source._shares({"a": 100, "b": 1, "c": 0}, 10) == {"c": 0, "b": 1, "a": 9}
    assert source._shares({"a": 100, "b": 100}, 10) == {"a": 5, "b": 5}
    assert source._shares({"a": 2, "b": 3}, 10) == {"a": 2, "b": 3}
    assert sum(source._shares({"a": 9, "b": 9, "c": 9}, 10).values()) == 10


def test_rows_of_the_default_shape_and_of_payload_fields() -> None:
    from pyspark.sql.types import LongType, StructField, StructType

    # the default columns written by the user are payload fields, not the default shape
    same = StructType([StructField(f.name, f.dataType) for f in DEFAULT_SCHEMA])
    row = convert.row_maker(same, "json", "t")("t", 1, {"seq": 4, "data": {"data": "x"}})
    assert row == ("t", 1, 4, "x")
    assert convert.row_maker(DEFAULT_SCHEMA, "json", "t")("t", 1, {"seq": 4, "data": [1]}) == (
        "t",
        1,
        4,
        "[1]",
    )
    schema = StructType([StructField("a", LongType())])
    with pytest.raises(RubrisSourceError, match="topic 'log' is a text topic"):
        convert.row_maker(schema, "text", "log")
    make = convert.row_maker(schema, "json", "t")
    assert make("t", 1, {"seq": 4, "data": {"a": 2}}) == (2,)
    with pytest.raises(RubrisSourceError, match=r"seq 5 \(epoch 1\): the payload \[1\] is not"):
        make("t", 1, {"seq": 5, "data": [1]})
