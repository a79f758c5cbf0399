"""Rows to NDJSON entries (``RowEncoder``) and the sink's option checks, without a Spark job."""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

import orjson
import pytest
from pyspark.sql import Row
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DateType,
    DecimalType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from rubris_asgi.spark.options import OptionError, SinkOptions
from rubris_asgi.spark.rows import RowEncoder, RowError

LEG = StructType([StructField("side", StringType()), StructField("qty", LongType())])
SCHEMA = StructType(
    [
        StructField("symbol", StringType()),
        StructField("price", DoubleType()),
        StructField("day", DateType()),
        StructField("fee", DecimalType(10, 2)),
        StructField("blob", BinaryType()),
    ]
)


def encode(schema: StructType, row: Row, index: int = 0, **options: str) -> dict[str, Any]:
    opts = SinkOptions.parse({"url": "http://h/rubris", **options}, schema)
    value: dict[str, Any] = orjson.loads(RowEncoder(opts, "w1", 3).line(index, row))
    return value


def test_the_row_is_the_payload_and_the_template_names_the_topic() -> None:
    schema = StructType(SCHEMA.fields[:4])
    row = Row("AAPL", 189.5, datetime.date(2026, 11, 23), Decimal("1.25"))
    assert encode(schema, row, topic="px.{symbol}") == {
        "topic": "px.AAPL",
        "data": {"symbol": "AAPL", "price": 189.5, "day": "2026-11-23", "fee": 1.25},
    }
    assert encode(schema, row, topic="t", columns="price, symbol") == {
        "topic": "t",
        "data": {"price": 189.5, "symbol": "AAPL"},
    }
    assert encode(schema, row, topic="t", value="symbol") == {"topic": "t", "data": "AAPL"}


def test_nested_rows_are_objects() -> None:
    schema = StructType([StructField("id", LongType()), StructField("legs", ArrayType(LEG))])
    row = Row(id=7, legs=[Row(side="buy", qty=10), Row(side="sell", qty=5)])
    assert encode(schema, row, topic="t")["data"] == {
        "id": 7,
        "legs": [{"side": "buy", "qty": 10}, {"side": "sell", "qty": 5}],
    }


def test_enqueue_ids_are_made_or_taken_from_a_column() -> None:
    schema = StructType(SCHEMA.fields[:2])
    row = Row("AAPL", 1.0)
    assert encode(schema, row, 41, topic="q", mode="enqueue")["id"] == "w1:3:41"
    assert encode(schema, row, topic="q", mode="enqueue", idColumn="symbol")["id"] == "AAPL"


def test_binary_goes_as_base64_alone_and_is_refused_in_json() -> None:
    schema = StructType([SCHEMA.fields[0], SCHEMA.fields[4]])
    row = Row("AAPL", b"\x00\x01")
    assert encode(schema, row, topic="b", value="blob") == {"topic": "b", "data_b64": "AAE="}
    with pytest.raises(RowError, match=r"partition 3, row 5: a value JSON cannot carry"):
        encode(schema, row, 5, topic="b")


@pytest.mark.parametrize(
    ("row", "error"),
    [
        (Row(None, 1.0), r"partition 3, row 0: the topic template's column 'symbol' is null"),
        (Row("A", float("nan")), r"partition 3, row 0: column 'price' is nan"),
        (Row("A", float("-inf")), r"column 'price' is -inf, which JSON cannot carry"),
    ],
)
def test_bad_rows_are_named(row: Row, error: str) -> None:
    with pytest.raises(RowError, match=error):
        encode(StructType(SCHEMA.fields[:2]), row, topic="px.{symbol}")


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"url": "", "topic": "t"}, r"option url is required"),
        ({"url": "h", "topic": "t"}, r"option url is required"),
        ({"topic": "t", "mode": "put"}, r"option mode is publish or enqueue, not 'put'"),
        ({}, r"option topic is required"),
        ({"topic": "px.{sym}"}, r"option topic 'px.\{sym\}': no column 'sym'"),
        ({"topic": "px.{symbol!r}"}, r"must name a column"),
        ({"topic": "t", "value": "symbol", "columns": "price"}, r"exclude each other"),
        ({"topic": "t", "idColumn": "symbol"}, r"idColumn is for mode enqueue"),
        ({"topic": "t", "track": "yes"}, r"option track is true or false"),
        ({"topic": "t", "track": "true"}, r"option track needs mode enqueue"),
        ({"topic": "t", "mode": "enqueue", "announce": "a"}, r"set track"),
        ({"topic": "t", "batchSize": "0"}, r"batchSize must be at least 1"),
        ({"topic": "t", "retryFor": "soon"}, r"retryFor is a number"),
    ],
)
def test_option_mistakes_are_named(options: dict[str, str], error: str) -> None:
    opts = {"url": "http://h/rubris", **options}
    with pytest.raises(OptionError, match=error):
        SinkOptions.parse(opts, StructType(SCHEMA.fields[:2]))


def test_option_names_ignore_case() -> None:
    opts = SinkOptions.parse(
        {"URL": "http://h/rubris/", "Topic": "q", "MODE": "enqueue", "IDCOLUMN": "symbol"},
        StructType(SCHEMA.fields[:2]),
    )
    assert (opts.url, opts.mode, opts.id_column) == ("http://h/rubris", "enqueue", "symbol")


def test_arrow_batches_give_the_payloads_rows_give() -> None:
    import pyarrow as pa

    from rubris_asgi.spark.arrow_rows import arrow_rows

    schema = StructType(
        [
            StructField("id", LongType()),
            StructField("at", TimestampType()),
            StructField("tags", MapType(StringType(), LongType())),
            StructField("legs", ArrayType(LEG)),
        ]
    )
    at = datetime.datetime(2026, 11, 23, 14, 0, tzinfo=datetime.timezone.utc)
    batch = pa.RecordBatch.from_pylist(
        [
            {"id": 1, "at": at, "tags": [("a", 1)], "legs": [{"side": "buy", "qty": 10}]},
            {"id": 2, "at": None, "tags": None, "legs": None},
        ],
        schema=pa.schema(
            [
                ("id", pa.int64()),
                ("at", pa.timestamp("us", tz="Europe/Paris")),
                ("tags", pa.map_(pa.string(), pa.int64())),
                ("legs", pa.list_(pa.struct([("side", pa.string()), ("qty", pa.int64())]))),
            ]
        ),
    )
    opts = SinkOptions.parse({"url": "http://h/rubris", "topic": "t"}, schema)
    encoder = RowEncoder(opts, "w", 0, plain=True)
    lines = [
        orjson.loads(encoder.line(i, r)) for i, r in enumerate(arrow_rows(iter([batch]), schema))
    ]
    first = {
        "id": 1,
        "at": "2026-11-23T14:00:00Z",
        "tags": {"a": 1},
        "legs": [{"side": "buy", "qty": 10}],
    }
    assert [line["data"] for line in lines] == [
        first,
        {"id": 2, "at": None, "tags": None, "legs": None},
    ]
    # the Row path (streams) writes the same: a Row holds the timestamp as naive local time
    local = at.astimezone().replace(tzinfo=None)
    row = Row(id=1, at=local, tags={"a": 1}, legs=[Row(side="buy", qty=10)])
    assert orjson.loads(RowEncoder(opts, "w", 0).line(0, row))["data"] == first
