"""A row to one NDJSON entry of the HTTP API: ``RowEncoder.line``.

The topic is the ``topic`` option, its ``{column}`` fields filled from the row. The payload is
the row as a JSON object (nested rows as objects, dates as ISO 8601, timestamps in UTC,
decimals as numbers), the ``columns`` option's subset of it, or the ``value`` column alone: a
binary value goes as ``data_b64`` (for bytes topics), anything else as ``data``. In enqueue
mode each entry carries an ``id``: ``idColumn``'s value, or ``{write}:{partition}:{index}``.

With ``keyColumn`` the entry changes one entry of a keyed topic (a live table, protocol.md 5b):
``"key"`` is the column's value (an integer in decimal), and ``opColumn``'s value says what the
row does: set the key to the payload (null, the default), patch it with the payload (an RFC
7386 merge: a null column removes that member), or delete it (no payload).

A row that cannot be sent raises ``SinkError`` naming the partition and the row's index in it:
a template column that is null, a float that is NaN or infinite, a value JSON cannot carry, a
key that is null or empty, an op that is not one.
"""

from __future__ import annotations

import base64
import datetime
import math
from decimal import Decimal
from typing import Any

import orjson
from pyspark.sql.types import Row

from ..errors import RubrisError
from .options import ROW_OPS, SinkOptions


class RowError(RubrisError):
    """A row the sink cannot send (its partition and index are in the message)."""


def utc(stamp: datetime.datetime) -> datetime.datetime:
    """A timestamp in UTC: a naive one is local time (how a PySpark ``Row`` holds it)."""
    return stamp.astimezone(datetime.timezone.utc)


_OPTIONS = orjson.OPT_UTC_Z  # "2026-11-23T14:00:00Z"


def _default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, Row):
        return value.asDict(recursive=True)
    raise TypeError(f"{type(value).__name__} has no JSON form")


class RowEncoder:
    """Entries for one partition's rows."""

    def __init__(self, opts: SinkOptions, key: str, partition: int, *, plain: bool = False) -> None:
        """``plain``: rows are tuples of plain values (``arrow_rows``), not PySpark ``Row``s."""
        self.opts = opts
        self.plain = plain
        self.key = key
        self.partition = partition
        self.enqueue = opts.mode == "enqueue"
        self.template = bool(opts.topic_fields)
        at = {name: i for i, name in enumerate(opts.names)}
        self.floats = [(name, at[name]) for name in opts.float_columns]
        self.fields = [(name, at[name]) for name in opts.topic_fields]
        self.value = at[opts.value] if opts.value is not None else None
        self.columns = [(c, at[c]) for c in opts.columns] if opts.columns is not None else None
        if opts.op_column is not None and opts.columns is None and opts.value is None:
            # the whole row is the payload, less the column that says what to do with it
            self.columns = [(c, i) for c, i in at.items() if c != opts.op_column]
        self.id_at = at[opts.id_column] if opts.id_column is not None else None
        self.key_at = at[opts.key_column] if opts.key_column is not None else None
        self.op_at = at[opts.op_column] if opts.op_column is not None else None
        # a Row's timestamps are naive local time; arrow_rows made them UTC already
        self.stamps = [] if plain else [at[name] for name in opts.stamp_columns]

    def line(self, index: int, row: Row | tuple[Any, ...]) -> bytes:
        opts = self.opts
        if self.stamps:
            values = list(row)
            for i in self.stamps:
                if values[i] is not None:
                    values[i] = utc(values[i])
            row = tuple(values) if opts.flat else Row(**dict(zip(opts.names, values, strict=True)))
        try:
            entry: dict[str, Any] = {"topic": self._topic(row) if self.template else opts.topic}
            if self.key_at is not None and self._keyed(entry, row) == "delete":
                return orjson.dumps(entry)  # a delete carries no data
            for name, i in self.floats:
                v = row[i]
                if v is not None and not math.isfinite(v):
                    raise RowError(f"column {name!r} is {v}, which JSON cannot carry")
            if self.value is not None:
                v = row[self.value]
                if isinstance(v, (bytes, bytearray)):
                    entry["data_b64"] = base64.b64encode(v).decode()
                else:
                    entry["data"] = v
            elif self.columns is not None:
                entry["data"] = {c: row[i] for c, i in self.columns}
            elif self.plain or opts.flat:
                entry["data"] = dict(zip(opts.names, row, strict=True))
            else:
                assert isinstance(row, Row)
                entry["data"] = row.asDict(recursive=True)
            if self.enqueue:
                if self.id_at is not None:
                    item_id = row[self.id_at]
                    if item_id is None:
                        raise RowError(f"the id column {opts.id_column!r} is null")
                    entry["id"] = str(item_id)
                else:
                    entry["id"] = f"{self.key}:{self.partition}:{index}"
            return orjson.dumps(entry, default=_default, option=_OPTIONS)
        except RowError as exc:
            raise RowError(f"partition {self.partition}, row {index}: {exc}") from None
        except TypeError as exc:  # orjson: a value it cannot write (binary, ...)
            raise RowError(
                f"partition {self.partition}, row {index}: a value JSON cannot carry: {exc}"
            ) from None

    def _keyed(self, entry: dict[str, Any], row: Row | tuple[Any, ...]) -> str:
        """Put the row's key and op into ``entry`` (set, the default, is left out); the op."""
        assert self.key_at is not None
        key = row[self.key_at]
        if key is None:
            raise RowError(f"the key column {self.opts.key_column!r} is null")
        key = key if isinstance(key, str) else str(key)  # an integer column: decimal
        if not key:
            raise RowError(f"the key column {self.opts.key_column!r} is empty")
        entry["key"] = key
        op = "set"
        if self.op_at is not None:
            said = row[self.op_at]
            if said is not None:
                op = said.strip().lower()
                if op not in ROW_OPS:
                    raise RowError(
                        f"the op column {self.opts.op_column!r} is {said!r}: "
                        f"{', '.join(ROW_OPS)} (or null: set)"
                    )
        if op != "set":
            entry["op"] = op
        return op

    def _topic(self, row: Row | tuple[Any, ...]) -> str:
        values = {}
        for field, i in self.fields:
            v = row[i]
            if v is None:
                raise RowError(f"the topic template's column {field!r} is null")
            values[field] = v
        return self.opts.topic.format_map(values)
