"""Reading from rubris: ``spark.read`` / ``spark.readStream.format("rubris")``.

Each named topic (a snapshot or ring of a shared channel) is read over the HTTP API's
``GET {mount}/api/topics/{name}?epoch=&after=&limit=`` (topic_api.py): what the topic holds
now, by seq. An offset is ``{topic: {"epoch": E, "seq": S}}``, S the last seq read, so a
query restarted from its checkpoint asks for what follows S; the epoch tells a restarted
numbering (server restart, topic recreated) from the old one.

Where things run, which decides what may be kept on ``self``: Spark builds a reader on the
driver for ``initialOffset`` / ``latestOffset`` / ``partitions`` / ``commit`` (one long-lived
Python process, so one HTTP client kept there, closed by ``stop``), and pickles another,
never used, to executors, which only call ``read(partition)``; ``read`` opens its own client
and keeps nothing. A partition is one topic's range ``(start, end]``.

Loss (``failOnDataLoss``, as Kafka's source): a ring drops its oldest messages as new ones
arrive, so a range whose start the ring no longer holds (its ``oldest`` is past ``start + 1``)
lost the messages in between; a changed epoch lost whatever followed ``start`` in the old one.
With ``failOnDataLoss=true`` (the default) that fails the query naming the topic, the seqs and
the epoch; with false it is logged and the reader goes on from what is held. A snapshot topic
keeps its latest value only: values replaced before they were read are conflated, which is
never loss; its value is fetched with the offset that covers it (``latestOffset`` on the
driver) and travels in the partition, so a busy snapshot cannot move past the range before
an executor reads it.

docs/spark.md ("Reading from rubris") lists every option.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import orjson
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
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

log = logging.getLogger("rubris_asgi.spark")

Offset = dict[str, int]
"""One topic's position: ``{"epoch": E, "seq": S}``, S the last seq read."""
Offsets = dict[str, Offset]

PAGE = 10_000
"""Messages asked for in one request (the server's maximum; it also bounds an answer's bytes)."""
HEAD_ONLY = (1 << 63) - 1
"""An ``after`` past any head: the answer carries the numbers and no messages."""
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


class SourceOptionError(ValueError):
    """An option the source cannot work with."""


class RubrisSourceError(RuntimeError):
    """The server refused a read, could not be reached, or sent what the schema cannot take."""


class DataLossError(RubrisSourceError):
    """Messages between a query's offsets are no longer held (``failOnDataLoss=true``)."""


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class SourceOptions:
    """What ``spark.read(Stream).format("rubris")`` was told, checked on the driver."""

    url: str
    token: str | None
    topics: tuple[str, ...]
    starting: str | Offsets
    """``"latest"``, ``"earliest"`` or given offsets."""
    fail_on_data_loss: bool
    max_per_trigger: int | None
    timeout: float

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = _lower(options)
        url = opts.get("url", "").strip()
        if not url.startswith(("http://", "https://")):
            raise SourceOptionError(
                "option url is required: the rubris mount URL, like http://127.0.0.1:8000/rubris"
            )
        topic, listed = opts.get("topic"), opts.get("topics")
        if (topic is None) == (listed is None):
            raise SourceOptionError("give one of the options topic (a name) or topics (a list)")
        names = [topic.strip()] if topic is not None else (listed or "").split(",")
        topics = tuple(dict.fromkeys(n.strip() for n in names if n.strip()))
        if not topics:
            raise SourceOptionError("options topic/topics name no topic")
        max_per_trigger = None
        text = opts.get("maxmessagespertrigger")
        if text is not None:
            if not text.strip().isdigit() or int(text) < 1:
                raise SourceOptionError(
                    f"option maxMessagesPerTrigger is an integer of at least 1, not {text!r}"
                )
            max_per_trigger = int(text)
        return cls(
            url=url.rstrip("/"),
            token=opts.get("token") or None,
            topics=topics,
            starting=_starting(opts.get("startingoffsets", "latest"), topics),
            fail_on_data_loss=_flag(opts, "failOnDataLoss", True),
            max_per_trigger=max_per_trigger,
            timeout=_number(opts, "timeout", 30.0, 0.1),
        )


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in options.items()}


def _flag(opts: dict[str, str], name: str, default: bool) -> bool:
    value = opts.get(name.lower(), str(default)).strip().lower()
    if value not in ("true", "false"):
        raise SourceOptionError(f"option {name} is true or false, not {value!r}")
    return value == "true"


def _number(opts: dict[str, str], name: str, default: float, least: float) -> float:
    text = opts.get(name.lower())
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise SourceOptionError(f"option {name} is a number, not {text!r}") from None
    if not value >= least or math.isinf(value):
        raise SourceOptionError(f"option {name} must be at least {least:g}, got {text!r}")
    return value


def _starting(text: str, topics: tuple[str, ...]) -> str | Offsets:
    word = text.strip().lower()
    if word in ("latest", "earliest"):
        return word
    why = (
        'option startingOffsets is latest, earliest or JSON {"topic": {"epoch": E, "seq": S}} '
        "naming every topic read"
    )
    try:
        given = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise SourceOptionError(f"{why}, not {text[:200]!r}") from None
    if not isinstance(given, dict) or set(given) != set(topics):
        raise SourceOptionError(f"{why}; got {text[:200]}")
    offsets: Offsets = {}
    for name in topics:
        offset = given[name]
        if not isinstance(offset, dict) or set(offset) != {"epoch", "seq"}:
            raise SourceOptionError(f"{why}; {name!r} has {offset!r}")
        if not all(type(offset[k]) is int and offset[k] >= 0 for k in ("epoch", "seq")):
            raise SourceOptionError(f"{why}; {name!r}: epoch and seq are integers from 0")
        offsets[name] = {"epoch": offset["epoch"], "seq": offset["seq"]}
    return offsets


# --------------------------------------------------------------------------- HTTP


@dataclass(frozen=True)
class Page:
    """One answer of ``GET {mount}/api/topics/{name}``."""

    topic: str
    mode: str
    codec: str
    epoch: int
    head: int
    oldest: int
    messages: list[dict[str, Any]]

    @property
    def snapshot(self) -> bool:
        return self.mode == "snapshot"

    def first_unread(self) -> int:
        """The seq before the oldest message held: where ``earliest`` starts (0 while the
        topic is empty: its ``oldest`` is 1)."""
        return self.oldest - 1


class TopicClient:
    """Reads topics over the HTTP API; every failure becomes a ``RubrisSourceError`` naming
    the topic and the server's reason or the URL."""

    def __init__(self, opts: SourceOptions) -> None:
        self.url = opts.url
        headers = {"Authorization": f"Bearer {opts.token}"} if opts.token else {}
        # retries: connection attempts only (a refused or reset connect), never a request
        self._http = httpx.Client(
            base_url=opts.url + "/",
            headers=headers,
            timeout=opts.timeout,
            transport=httpx.HTTPTransport(retries=2),
        )

    def page(self, topic: str, after: int, epoch: int | None = None, limit: int = PAGE) -> Page:
        params: dict[str, int] = {"after": after, "limit": limit}
        if epoch is not None:
            params["epoch"] = epoch
        path = "api/topics/" + quote(topic, safe="/")
        try:
            r = self._http.get(path, params=params)
        except httpx.HTTPError as exc:
            raise RubrisSourceError(
                f"cannot reach rubris at {self.url} to read topic {topic!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        if r.status_code != 200:
            try:
                reason = orjson.loads(r.content)["error"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                reason = r.text[:200] or r.reason_phrase
            hint = {
                401: " (check the option token)",
                404: " (is it a snapshot or ring topic, and is the HTTP API on?)",
            }.get(r.status_code, "")
            raise RubrisSourceError(
                f"rubris at {self.url} refused to read topic {topic!r}: "
                f"{r.status_code} {reason}{hint}"
            )
        try:
            body = orjson.loads(r.content)
            return Page(
                topic,
                body["mode"],
                body["codec"],
                body["epoch"],
                body["head"],
                body["oldest"],
                body["messages"],
            )
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise RubrisSourceError(
                f"{self.url} answered a read of topic {topic!r} with something else than "
                "rubris's answer: is the option url the rubris mount URL?"
            ) from None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> TopicClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- rows


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


# --------------------------------------------------------------------------- schema


def source_schema(options: Mapping[str, str]) -> StructType | str:
    """The schema without ``.schema(...)``: option ``schema`` (DDL), one inferred from what
    the topics hold now (``inferSchema=true``), or ``DEFAULT_SCHEMA``."""
    opts = _lower(options)
    ddl = opts.get("schema")
    infer = _flag(opts, "inferSchema", False)
    if ddl is not None and infer:
        raise SourceOptionError("options schema and inferSchema exclude each other")
    if ddl is not None:
        return ddl
    if infer:
        return infer_schema(SourceOptions.parse(options))
    return DEFAULT_SCHEMA


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


# --------------------------------------------------------------------------- partitions


@dataclass
class TopicRange(InputPartition):
    """One topic's messages after ``start`` up to ``end`` (inclusive), as one Spark task.

    ``held``: the messages already fetched on the driver (a snapshot's value, with its
    ``codec``), read from here instead of asking the server again.
    """

    topic: str
    start_epoch: int
    start_seq: int
    end_epoch: int
    end_seq: int
    held: list[dict[str, Any]] | None = field(default=None)
    codec: str = "json"


def read_range(
    opts: SourceOptions, schema: StructType, part: TopicRange
) -> Iterator[tuple[Any, ...]]:
    """The rows of one range, paging through the server; a loss raised or logged."""
    topic, end = part.topic, part.end_seq
    makers: dict[str, RowMaker] = {}

    def rows(page: Page | None, messages: list[dict[str, Any]]) -> Iterator[tuple[Any, ...]]:
        codec = part.codec if page is None else page.codec
        make = makers.get(codec)
        if make is None:
            make = makers[codec] = row_maker(schema, codec, topic)
        epoch = part.end_epoch if page is None else page.epoch
        for m in messages:
            yield make(topic, epoch, m)

    if part.held is not None:
        yield from rows(None, part.held)
        return
    epoch, after = part.start_epoch, part.start_seq
    with TopicClient(opts) as http:
        page = http.page(topic, after, epoch, _page_limit(after, end))
        if page.epoch != epoch:
            # the server counted ``after`` as 0: this page starts the new numbering
            if page.epoch != part.end_epoch:  # and it is not the one this range was planned in
                if not page.snapshot:
                    lost(opts, _restarted(topic, part.end_epoch, page.epoch, end))
                return
            if not page.snapshot:
                lost(opts, _epoch_changed(topic, epoch, after, page.epoch))
            epoch, after = page.epoch, 0
        while True:
            if not page.snapshot and page.oldest > after + 1:
                last = min(page.oldest - 1, end)
                lost(opts, _overrun(topic, epoch, after + 1, last, page))
            wanted = [m for m in page.messages if m["seq"] <= end]
            yield from rows(page, wanted)
            if not wanted or len(wanted) < len(page.messages) or wanted[-1]["seq"] >= end:
                return  # the range's end, or nothing more held
            after = wanted[-1]["seq"]
            page = http.page(topic, after, epoch, _page_limit(after, end))
            if page.epoch != epoch:
                if not page.snapshot:
                    lost(opts, _restarted(topic, epoch, page.epoch, end, after))
                return


def _page_limit(after: int, end: int) -> int:
    return max(1, min(PAGE, end - after))


def check_loss(opts: SourceOptions, topic: str, start: Offset, end: Offset, page: Page) -> None:
    """What the driver can see of a loss before any task runs (``page``: an answer read with
    ``start``), so the query fails at once rather than after a task's retries."""
    if page.snapshot or not opts.fail_on_data_loss:
        return  # without failing, the executors log it where they skip it
    if start["epoch"] != end["epoch"]:
        lost(opts, _epoch_changed(topic, start["epoch"], start["seq"], end["epoch"]))
    elif page.epoch == start["epoch"] and page.oldest > start["seq"] + 1:
        last = min(page.oldest - 1, end["seq"])
        lost(opts, _overrun(topic, start["epoch"], start["seq"] + 1, last, page))


def lost(opts: SourceOptions, message: str) -> None:
    if opts.fail_on_data_loss:
        raise DataLossError(
            f"{message}. Set the option failOnDataLoss to false to go on from what is held"
        )
    log.warning("%s; going on from what is held (failOnDataLoss=false)", message)


def _seqs(first: int, last: int) -> str:
    return f"seq {first}" if first == last else f"seqs {first}..{last}"


def _overrun(topic: str, epoch: int, first: int, last: int, page: Page) -> str:
    return (
        f"rubris topic {topic!r}: {_seqs(first, last)} of epoch {epoch} are lost: the ring "
        f"now holds {page.oldest}..{page.head}, it overran before they were read"
    )


def _epoch_changed(topic: str, old: int, seq: int, new: int) -> str:
    return (
        f"rubris topic {topic!r}: its epoch changed from {old} to {new} (the server restarted "
        f"or the topic was recreated): what followed seq {seq} of epoch {old} is lost"
    )


def _restarted(topic: str, old: int, new: int, end: int, after: int = 0) -> str:
    return (
        f"rubris topic {topic!r}: its epoch changed from {old} to {new} before the "
        f"micro-batch was read (the server restarted or the topic was recreated): "
        f"{_seqs(after + 1, end)} of epoch {old} are lost"
    )


# --------------------------------------------------------------------------- batch


class RubrisBatchReader(DataSourceReader):
    """``spark.read.format("rubris")``: what each topic holds now, from ``startingOffsets``
    (earliest, the default for a batch read, or given offsets) to its head."""

    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        if opts.starting == "latest":
            raise SourceOptionError(
                "a batch read starts at earliest (the default) or at given startingOffsets; "
                "latest would read nothing"
            )
        self.opts = opts
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        parts: list[InputPartition] = []
        starting = self.opts.starting
        with TopicClient(self.opts) as http:
            for t in self.opts.topics:
                given = starting.get(t) if isinstance(starting, dict) else None
                if given is None:
                    page = http.page(t, 0, None, 1)
                    start = {"epoch": page.epoch, "seq": page.first_unread()}
                else:
                    page = http.page(t, given["seq"], given["epoch"], 1)
                    start = given
                end = {"epoch": page.epoch, "seq": page.head}
                if page.snapshot:
                    # its value came with this answer: no second request, no race with a publish
                    if page.messages:
                        parts.append(_held(t, start, end, page))
                elif page.head > start["seq"] or page.epoch != start["epoch"]:
                    check_loss(self.opts, t, start, end, page)
                    parts.append(
                        TopicRange(t, start["epoch"], start["seq"], end["epoch"], end["seq"])
                    )
        return parts

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, TopicRange)
        return read_range(self.opts, self.schema, partition)


def _held(topic: str, start: Offset, end: Offset, page: Page) -> TopicRange:
    """The range of a snapshot whose value ``page`` carries."""
    return TopicRange(
        topic, start["epoch"], start["seq"], end["epoch"], end["seq"], page.messages, page.codec
    )


def batch_reader(options: Mapping[str, str], schema: StructType) -> DataSourceReader:
    if "startingoffsets" not in _lower(options):
        options = {**options, "startingOffsets": "earliest"}  # a batch read's natural start
    return RubrisBatchReader(SourceOptions.parse(options), schema)


# --------------------------------------------------------------------------- stream


class RubrisStreamReader(DataSourceStreamReader):
    """``spark.readStream.format("rubris")``: micro-batches of what arrives after the
    offsets, with ``maxMessagesPerTrigger`` and ``Trigger.AvailableNow`` on Spark 4.2+."""

    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self._fresh()

    def _fresh(self) -> None:
        # driver-side state only (see the module's docstring): read() needs none of it
        self._http: TopicClient | None = None
        self._last: Offsets | None = None
        """The latest offset known (Spark before 4.2 calls latestOffset() without a start)."""
        self._pages: dict[str, Page] = {}
        """Each topic's answer to the last latestOffset: its oldest, a snapshot's value."""
        self._target: Offsets | None = None
        """Trigger.AvailableNow: the heads when the query started; never read past them."""

    def __getstate__(self) -> dict[str, Any]:
        # a pickled reader (one sent to executors) carries the options, never a connection
        return {"opts": self.opts, "schema": self.schema}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.opts = state["opts"]
        self.schema = state["schema"]
        self._fresh()

    def _client(self) -> TopicClient:
        if self._http is None:
            self._http = TopicClient(self.opts)
        return self._http

    def _heads(self) -> dict[str, Page]:
        http = self._client()
        return {t: http.page(t, HEAD_ONLY, None, 1) for t in self.opts.topics}

    def initialOffset(self) -> Offsets:
        starting = self.opts.starting
        if isinstance(starting, dict):
            offsets = {t: dict(starting[t]) for t in self.opts.topics}
        else:
            offsets = {
                t: {"epoch": p.epoch, "seq": p.head if starting == "latest" else p.first_unread()}
                for t, p in self._heads().items()
            }
        self._last = offsets
        return offsets

    def prepareForTriggerAvailableNow(self) -> None:
        """Spark 4.2+, ``trigger(availableNow=True)``: read up to the heads of now, no further."""
        self._target = {t: {"epoch": p.epoch, "seq": p.head} for t, p in self._heads().items()}

    def getDefaultReadLimit(self) -> Any:
        """Spark 4.2+: ``maxMessagesPerTrigger`` as a ``ReadMaxRows``."""
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        n = self.opts.max_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def latestOffset(self, start: dict[Any, Any] | None = None, limit: Any = None) -> Offsets:
        """Each topic's head, capped by the read limit (Spark 4.2+ passes the start and a
        ``ReadLimit``; before, ``maxMessagesPerTrigger`` counts from the last offset this
        reader knows) and by the AvailableNow target."""
        begin: Offsets | None = start if start is not None else self._last
        http = self._client()
        pages: dict[str, Page] = {}
        for t in self.opts.topics:
            s = begin.get(t) if begin is not None else None
            # after the start, limit 1: the numbers and, for a snapshot, its value in one answer
            pages[t] = (
                http.page(t, HEAD_ONLY, None, 1)
                if s is None
                else http.page(t, s["seq"], s["epoch"], 1)
            )
        self._pages = pages
        if begin is None:  # a restart before Spark 4.2: no start to count from, nothing to cap
            self._last = {t: {"epoch": p.epoch, "seq": p.head} for t, p in pages.items()}
            return self._last
        ready = {t: _ready(begin.get(t), p) for t, p in pages.items()}
        if self._target is not None:
            ready = {t: _capped(begin.get(t), r, self._target.get(t)) for t, r in ready.items()}
        cap = self.opts.max_per_trigger if limit is None else getattr(limit, "max_rows", None)
        least = getattr(limit, "min_rows", None)
        if least is not None and self._target is None:
            if sum(r["seq"] - first for r, first in ready.values()) < least:
                return begin  # not enough yet (ReadMinRows): no micro-batch this time
        if cap is not None:
            shares = _shares({t: r["seq"] - first for t, (r, first) in ready.items()}, cap)
            ready = {
                t: ({"epoch": r["epoch"], "seq": first + shares[t]}, first)
                for t, (r, first) in ready.items()
            }
        end: Offsets = {}
        for t in self.opts.topics:
            r, first = ready[t]
            s = begin.get(t)
            # nothing new: the start as it was, so Spark sees no data and plans no batch
            end[t] = r if s is None or r["seq"] > first or r["epoch"] != s["epoch"] else s
        self._last = end
        return end

    def partitions(self, start: dict[Any, Any], end: dict[Any, Any]) -> Sequence[InputPartition]:
        parts: list[InputPartition] = []
        pages, self._pages = self._pages, {}
        for t in self.opts.topics:
            s, e = start.get(t), end.get(t)
            if e is None or s == e:
                continue
            if s is None:  # a topic added to the query after its checkpoint: from its start
                s = {"epoch": e["epoch"], "seq": 0}
            page = pages.get(t)  # none when Spark replays a batch planned before a restart
            if page is not None and page.snapshot:
                if (page.epoch, page.head) == (e["epoch"], e["seq"]) and page.messages:
                    parts.append(_held(t, s, e, page))
                    continue
            elif page is not None:
                check_loss(self.opts, t, s, e, page)
            parts.append(TopicRange(t, s["epoch"], s["seq"], e["epoch"], e["seq"]))
        self._last = dict(end)
        return parts

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, TopicRange)
        return read_range(self.opts, self.schema, partition)

    def commit(self, end: dict[Any, Any]) -> None:
        """Nothing to tell the server: a reader's position lives in Spark's checkpoint."""

    def stop(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None


def _ready(start: Offset | None, page: Page) -> tuple[Offset, int]:
    """(the offset at the head, the seq reading starts after) for one topic."""
    after = start["seq"] if start is not None and start["epoch"] == page.epoch else 0
    if page.snapshot:
        # one value at most, the head, when the reader does not have it yet
        first = page.head - 1 if page.head > after else page.head
    else:
        first = max(after, page.first_unread())
    return {"epoch": page.epoch, "seq": max(page.head, first)}, first


def _capped(
    start: Offset | None, ready: tuple[Offset, int], target: Offset | None
) -> tuple[Offset, int]:
    """``ready`` held to the AvailableNow target: a later epoch is past it altogether."""
    offset, first = ready
    if target is None:
        return ready
    if offset["epoch"] != target["epoch"]:
        stay = dict(start) if start is not None else offset
        return stay, stay["seq"]
    return {"epoch": offset["epoch"], "seq": max(first, min(offset["seq"], target["seq"]))}, first


def _shares(available: dict[str, int], cap: int) -> dict[str, int]:
    """``cap`` messages shared out fairly: the topics with little take all of theirs, the
    rest split what remains (water filling), so a busy topic cannot starve a quiet one."""
    shares: dict[str, int] = {}
    left = cap
    order = sorted(available, key=lambda t: available[t])
    for i, t in enumerate(order):
        share = min(available[t], left // (len(order) - i))
        shares[t] = share
        left -= share
    return shares


def stream_reader(options: Mapping[str, str], schema: StructType) -> DataSourceStreamReader:
    return RubrisStreamReader(SourceOptions.parse(options), schema)


def _register_available_now() -> None:
    """Spark 4.2+ asks ``isinstance(reader, SupportsTriggerAvailableNow)``; earlier versions
    have no such class and run AvailableNow by wrapping the source instead."""
    try:
        from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
    except ImportError:
        return
    SupportsTriggerAvailableNow.register(RubrisStreamReader)


_register_available_now()
