"""The sink's options, read and checked once on the driver (``SinkOptions.parse``), and the
checks both sides' options share (``lower_keys``, ``flag``, ``number``, ``OptionError``).

Spark hands options over as strings under the names the user wrote; they are matched without
regard to case, as Spark's own options are. Every mistake found here fails the query before a
task starts, naming the option and what it accepts.
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pyspark.sql.types import (
    ArrayType,
    ByteType,
    CharType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampType,
    VarcharType,
)

MODES = ("publish", "enqueue")
ROW_OPS = ("set", "patch", "delete")
"""What an ``opColumn`` may say (any case; null: set). A row cannot replace a whole table."""
_TEXT = (StringType, CharType, VarcharType)
_KEY_TYPES = (*_TEXT, ByteType, ShortType, IntegerType, LongType)


class OptionError(ValueError):
    """An option the data source (its sink or its source) cannot work with."""


def lower_keys(options: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in options.items()}


def flag(
    opts: dict[str, str], name: str, default: bool, *, error: type[OptionError] = OptionError
) -> bool:
    """Option ``name`` (``opts`` as ``lower_keys`` made them) as true or false."""
    value = opts.get(name.lower(), str(default)).strip().lower()
    if value not in ("true", "false"):
        raise error(f"option {name} is true or false, not {value!r}")
    return value == "true"


def number(
    opts: dict[str, str],
    name: str,
    default: float,
    least: float,
    *,
    error: type[OptionError] = OptionError,
) -> float:
    """Option ``name`` as a finite number of at least ``least``."""
    text = opts.get(name.lower())
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise error(f"option {name} is a number, not {text!r}") from None
    if not value >= least or math.isinf(value):
        raise error(f"option {name} must be at least {least:g}, got {text!r}")
    return value


def template_fields(template: str) -> list[str]:
    """The column names a topic template such as ``prices.{symbol}`` fills in."""
    fields: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise OptionError(f"option topic: {template!r} is not a template: {exc}") from None
    for _literal, field, spec, conversion in parsed:
        if field is None:
            continue
        if not field or spec or conversion or not field.isidentifier():
            raise OptionError(
                f"option topic: {{{field}}} in {template!r} must name a column, like {{symbol}}"
            )
        fields.append(field)
    return fields


@dataclass(frozen=True)
class SinkOptions:
    """What ``df.write.format("rubris")`` was told (docs/spark.md lists each option)."""

    url: str
    token: str | None
    mode: str
    topic: str
    topic_fields: tuple[str, ...]
    value: str | None
    columns: tuple[str, ...] | None
    id_column: str | None
    key_column: str | None
    """Publish: the column whose value is each row's key in a keyed topic (a live table)."""
    op_column: str | None
    """With ``key_column``: the column saying what the row does to its key (``ROW_OPS``)."""
    track: bool
    announce: str | None
    batch_size: int
    batch_bytes: int
    retry_for: float
    timeout: float
    float_columns: tuple[str, ...]
    """Top-level float and double columns in the payload: NaN and infinity are refused there,
    as JSON has no way to carry them."""
    names: tuple[str, ...]
    """The DataFrame's columns, in order: rows are read by position, which is cheaper."""
    stamp_columns: tuple[str, ...]
    """Top-level timestamp columns: a ``Row`` holds them as naive local time, written in UTC."""
    flat: bool
    """No column holds rows (structs, or arrays and maps of them): a row's payload is a plain
    ``dict(zip(names, row))``, without ``asDict``'s recursive walk."""

    @classmethod
    def parse(cls, options: Mapping[str, str], schema: StructType) -> SinkOptions:
        opts = lower_keys(options)
        url = opts.get("url", "").strip()
        if not url.startswith(("http://", "https://")):
            raise OptionError(
                "option url is required: the rubris mount URL, like http://127.0.0.1:8000/rubris"
            )
        mode = opts.get("mode", "publish").strip().lower()
        if mode not in MODES:
            raise OptionError(f"option mode is publish or enqueue, not {mode!r}")
        topic = opts.get("topic", "")
        if not topic:
            raise OptionError("option topic is required: a topic name or a template")
        names = list(schema.fieldNames())

        def column(name: str, what: str) -> str:
            if name not in names:
                raise OptionError(f"{what}: no column {name!r} (the columns: {', '.join(names)})")
            return name

        fields = tuple(column(f, f"option topic {topic!r}") for f in template_fields(topic))
        value = opts.get("value")
        columns_text = opts.get("columns")
        if value is not None and columns_text is not None:
            raise OptionError("options value and columns exclude each other")
        columns = None
        if value is not None:
            value = column(value.strip(), "option value")
        elif columns_text is not None:
            columns = tuple(column(c.strip(), "option columns") for c in columns_text.split(","))
        id_column = opts.get("idcolumn")
        if id_column is not None:
            if mode != "enqueue":
                raise OptionError("option idColumn is for mode enqueue (publish has no ids)")
            id_column = column(id_column.strip(), "option idColumn")
        key_column, op_column = _keyed(opts, mode, schema, column)
        track = flag(opts, "track", False)
        if track and mode != "enqueue":
            raise OptionError(
                "option track needs mode enqueue: a batch completes when consumers ACK its items"
            )
        announce = opts.get("announce") or None
        if announce is not None and not track:
            raise OptionError("option announce names where a tracked batch is announced: set track")
        if value is not None:
            payload = [value]
        elif columns is not None:
            payload = list(columns)
        else:  # the whole row, less what says what to do with it
            payload = [n for n in names if n != op_column]
        floats = tuple(
            f.name
            for f in schema.fields
            if f.name in payload and isinstance(f.dataType, (FloatType, DoubleType))
        )
        return cls(
            url=url.rstrip("/"),
            token=opts.get("token") or None,
            mode=mode,
            topic=topic,
            topic_fields=fields,
            value=value,
            columns=columns,
            id_column=id_column,
            key_column=key_column,
            op_column=op_column,
            track=track,
            announce=announce,
            batch_size=int(number(opts, "batchSize", 1000, 1)),
            batch_bytes=int(number(opts, "batchBytes", 1 << 20, 1024)),
            retry_for=number(opts, "retryFor", 30.0, 0),
            timeout=number(opts, "timeout", 30.0, 0.1),
            float_columns=floats,
            names=tuple(names),
            stamp_columns=tuple(
                f.name for f in schema.fields if isinstance(f.dataType, TimestampType)
            ),
            flat=not any(_holds_rows(f.dataType) for f in schema.fields),
        )


def _keyed(
    opts: dict[str, str], mode: str, schema: StructType, column: Callable[[str, str], str]
) -> tuple[str | None, str | None]:
    """Options keyColumn and opColumn: which column keys each row, which says its op."""
    key = opts.get("keycolumn")
    op = opts.get("opcolumn")
    if key is None:
        if op is not None:
            raise OptionError("option opColumn needs keyColumn: ops change the entries of keys")
        return None, None
    if mode != "publish":
        raise OptionError("option keyColumn is for mode publish: it writes keyed topics")
    key = column(key.strip(), "option keyColumn")
    kind = schema[key].dataType
    if not isinstance(kind, _KEY_TYPES):
        raise OptionError(
            f"option keyColumn: column {key!r} is {kind.simpleString()}; a key is a string "
            "(or an integer, written in decimal)"
        )
    if op is not None:
        op = column(op.strip(), "option opColumn")
        kind = schema[op].dataType
        if not isinstance(kind, _TEXT):
            raise OptionError(
                f"option opColumn: column {op!r} is {kind.simpleString()}; it must be a string "
                f"column ({', '.join(ROW_OPS)})"
            )
        if op == key:
            raise OptionError("options keyColumn and opColumn name the same column")
    return key, op


def _holds_rows(kind: DataType) -> bool:
    if isinstance(kind, StructType):
        return True
    if isinstance(kind, ArrayType):
        return _holds_rows(kind.elementType)
    if isinstance(kind, MapType):
        return _holds_rows(kind.keyType) or _holds_rows(kind.valueType)
    return False
