"""Messages to rows: the default shape, a schema's columns from a JSON payload's fields, and a
schema inferred from what the topics hold now.

With a schema, each column is the payload field of its name converted to the column's type
(``topic``, ``epoch`` and ``seq`` come from the message's place); a value the type cannot take
fails the read, naming the topic, the seq and the column.
"""

from __future__ import annotations

import base64
import datetime
import decimal
from collections.abc import Callable
from typing import Any

import orjson
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from .pages import TopicClient
from .source_options import RubrisSourceError, SourceOptionError, SourceOptions

META = ("topic", "epoch", "seq")
"""Columns a schema may name that come from the message's place, not its payload."""
DEFAULT_SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("epoch", LongType()),
        StructField("seq", LongType()),
        # the mark tells this shape from a schema the user gave with the same columns, which
        # would mean a payload field named data
        StructField("data", StringType(), metadata={"rubris": "payload"}),
    ]
)
"""Without a schema: ``data`` is the payload as JSON text (JSON topics), the text (text
topics) or base64 (bytes topics)."""


class _BadValue(Exception):
    """A payload value the schema cannot take (the row maker adds the topic and seq)."""


Convert = Callable[[Any], Any]
RowMaker = Callable[[str, int, dict[str, Any]], tuple[Any, ...]]
"""(topic, epoch, message of a page) → one row."""


def is_default(schema: StructType) -> bool:
    """Rows of the default shape (the topic, the numbers and the payload as text): the schema
    is ``DEFAULT_SCHEMA``, as Spark hands it back, never one the user wrote."""
    return schema.fields == DEFAULT_SCHEMA.fields  # a field's equality includes its metadata


def row_maker(schema: StructType, codec: str, topic: str) -> RowMaker:
    """How ``topic``, of ``codec``, turns into rows of ``schema``."""
    if is_default(schema):

        def default_row(topic: str, epoch: int, m: dict[str, Any]) -> tuple[Any, ...]:
            if codec == "json":
                data = orjson.dumps(m["data"]).decode()
            else:
                data = m["data"] if codec == "text" else m["data_b64"]
            return topic, epoch, m["seq"], data

        return default_row
    if codec != "json":
        raise RubrisSourceError(
            f"topic {topic!r} is a {codec} topic, and a schema of payload fields needs JSON "
            "topics: read it without a schema (the payload is in the column data)"
        )
    columns: list[tuple[str, Convert | None]] = [
        (f.name, None if f.name in META else converter(f.dataType)) for f in schema.fields
    ]

    def fields_row(topic: str, epoch: int, m: dict[str, Any]) -> tuple[Any, ...]:
        seq = m["seq"]
        value = m["data"]
        if not isinstance(value, dict):
            raise RubrisSourceError(
                f"topic {topic!r} seq {seq} (epoch {epoch}): the payload {_describe(value)} "
                "is not a JSON object, and a schema of payload fields needs objects"
            )
        row: list[Any] = []
        for name, convert in columns:
            if convert is None:
                row.append(topic if name == "topic" else epoch if name == "epoch" else seq)
                continue
            try:
                row.append(convert(value.get(name)))
            except _BadValue as exc:
                raise RubrisSourceError(
                    f"topic {topic!r} seq {seq} (epoch {epoch}): column {name!r}: {exc}"
                ) from None
        return tuple(row)

    return fields_row


_INT_BITS: dict[type[DataType], int] = {LongType: 64, IntegerType: 32, ShortType: 16, ByteType: 8}


def converter(dt: DataType) -> Convert:
    """A JSON value to what Spark takes for ``dt`` (None stays None); raises ``_BadValue``."""
    bits = _INT_BITS.get(type(dt))
    if bits is not None:
        low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        return lambda v: _integer(v, low, high, dt.simpleString())
    if isinstance(dt, (DoubleType, FloatType)):
        return _real
    if isinstance(dt, StringType):
        # nested values keep their JSON text rather than failing
        return lambda v: v if v is None or isinstance(v, str) else orjson.dumps(v).decode()
    if isinstance(dt, BooleanType):
        return lambda v: _typed(v, bool, "a boolean")
    if isinstance(dt, DecimalType):
        return _decimal
    if isinstance(dt, TimestampType):
        return _timestamp
    if isinstance(dt, TimestampNTZType):
        return _timestamp_ntz
    if isinstance(dt, DateType):
        return _date
    if isinstance(dt, BinaryType):
        return _binary
    if isinstance(dt, ArrayType):
        item = converter(dt.elementType)
        return lambda v: None if v is None else [item(x) for x in _typed(v, list, "a list")]
    if isinstance(dt, MapType):
        value_of = converter(dt.valueType)
        return lambda v: (
            None if v is None else {k: value_of(x) for k, x in _typed(v, dict, "an object").items()}
        )
    if isinstance(dt, StructType):
        inner = [(f.name, converter(f.dataType)) for f in dt.fields]
        return lambda v: (
            None
            if v is None
            else {name: c(_typed(v, dict, "an object").get(name)) for name, c in inner}
        )
    return lambda v: v  # anything else as JSON gave it: Spark's own conversion decides


def _describe(v: Any) -> str:
    text = orjson.dumps(v).decode() if not isinstance(v, float) else repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _typed(v: Any, kind: type, what: str) -> Any:
    if v is None or (type(v) is kind):
        return v
    raise _BadValue(f"expected {what}, got {_describe(v)}")


def _integer(v: Any, low: int, high: int, name: str) -> int | None:
    if v is None:
        return None
    if type(v) is float and v.is_integer():
        v = int(v)  # JSON writers give 3.0 for 3: the value is integral, the column takes it
    if type(v) is not int:
        raise _BadValue(f"expected an integer for {name}, got {_describe(v)}")
    if not low <= v <= high:
        raise _BadValue(f"{v} is out of range for {name}")
    return int(v)


def _real(v: Any) -> float | None:
    if v is None:
        return None
    if type(v) not in (int, float):
        raise _BadValue(f"expected a number, got {_describe(v)}")
    return float(v)


def _decimal(v: Any) -> decimal.Decimal | None:
    if v is None:
        return None
    if type(v) not in (int, float, str):
        raise _BadValue(f"expected a number, got {_describe(v)}")
    try:
        return decimal.Decimal(str(v))
    except decimal.InvalidOperation:
        raise _BadValue(f"expected a decimal, got {_describe(v)}") from None


def _timestamp(v: Any) -> datetime.datetime | None:
    """Seconds since the epoch, or ISO 8601 (UTC when it names no zone)."""
    if v is None:
        return None
    if type(v) in (int, float):
        try:
            return datetime.datetime.fromtimestamp(v, datetime.timezone.utc)
        except (OverflowError, OSError, ValueError):
            raise _BadValue(f"{_describe(v)} seconds since the epoch is out of range") from None
    if isinstance(v, str):
        try:
            t = datetime.datetime.fromisoformat(v)
        except ValueError:
            raise _BadValue(f"expected an ISO 8601 time, got {_describe(v)}") from None
        return t if t.tzinfo is not None else t.replace(tzinfo=datetime.timezone.utc)
    raise _BadValue(f"expected seconds since the epoch or an ISO 8601 time, got {_describe(v)}")


def _timestamp_ntz(v: Any) -> datetime.datetime | None:
    """As ``_timestamp``, in UTC without its zone."""
    t = _timestamp(v)
    return None if t is None else t.astimezone(datetime.timezone.utc).replace(tzinfo=None)


def _date(v: Any) -> datetime.date | None:
    if v is None:
        return None
    try:
        return datetime.date.fromisoformat(_typed(v, str, "an ISO 8601 date"))
    except ValueError:
        raise _BadValue(f"expected an ISO 8601 date, got {_describe(v)}") from None


def _binary(v: Any) -> bytes | None:
    if v is None:
        return None
    try:
        return base64.b64decode(_typed(v, str, "base64"), validate=True)
    except ValueError:
        raise _BadValue(f"expected base64, got {_describe(v)}") from None


# --------------------------------------------------------------------------- inferred schema


_INFERRED: dict[type, DataType] = {
    bool: BooleanType(),
    int: LongType(),
    float: DoubleType(),
    str: StringType(),
}


def infer_schema(opts: SourceOptions) -> StructType:
    """``topic``, ``epoch``, ``seq``, then the fields of the JSON objects the topics hold now,
    in the order first seen: LONG, DOUBLE (also for a field seen as both an integer and a
    float), BOOLEAN or STRING (anything else: mixed types, lists, objects, only nulls)."""
    seen: dict[str, DataType | None] = {}
    found = 0
    with TopicClient(opts) as http:
        for topic in opts.topics:
            page = http.page(topic, after=0)
            if page.codec != "json":
                raise SourceOptionError(
                    f"inferSchema reads JSON objects, and {topic!r} is a {page.codec} topic"
                )
            for m in page.messages:
                value = m["data"]
                if not isinstance(value, dict):
                    continue
                found += 1
                for name, v in value.items():
                    if name in META:
                        continue  # the message's own columns win over a payload field
                    kind = None if v is None else _INFERRED.get(type(v), StringType())
                    seen[name] = _merge(seen.get(name), kind) if name in seen else kind
    if not found:
        raise SourceOptionError(
            f"inferSchema found no JSON object in {', '.join(map(repr, opts.topics))}: "
            "publish some first, or give a schema"
        )
    fields = [StructField(n, t if t is not None else StringType()) for n, t in seen.items()]
    return StructType(list(DEFAULT_SCHEMA.fields[:3]) + fields)


def _merge(a: DataType | None, b: DataType | None) -> DataType | None:
    if a is None or b is None:
        return a or b
    if a == b:
        return a
    if {type(a), type(b)} == {LongType, DoubleType}:
        return DoubleType()
    return StringType()
