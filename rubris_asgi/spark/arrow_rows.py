"""Arrow record batches to plain rows, for the batch writer (``DataSourceArrowWriter``).

Spark hands a Python data source's writer Arrow record batches; building a PySpark ``Row`` for
each row and reading it back field by field cost more than encoding the row itself (bench/spark.py:
about 1.5 µs of a row's 6.8). Here each column becomes a Python list at once (``to_pylist``, in
C) and a row is a tuple of plain values: structs are dicts already, so the payload is
``dict(zip(names, row))`` whatever the nesting.

Two kinds of value come out of Arrow differently from a ``Row`` and are made the same here:
maps (Arrow gives ``[(key, value), ...]``, a payload wants an object) and timestamps (Arrow
gives them in the session's time zone, a ``Row`` as naive local time); a timestamp is written
in UTC (``...Z``) by both paths (``rows.utc``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from pyspark.sql.types import ArrayType, DataType, MapType, StructType, TimestampType

from .rows import utc

Fix = Callable[[Any], Any]


def fix_for(kind: DataType) -> Fix | None:
    """What turns Arrow's Python value of ``kind`` into the payload's (None: nothing to do)."""
    if isinstance(kind, TimestampType):
        return utc
    if isinstance(kind, MapType):
        k, v = fix_for(kind.keyType), fix_for(kind.valueType)
        return lambda m: None if m is None else {_apply(k, a): _apply(v, b) for a, b in m}
    if isinstance(kind, ArrayType):
        e = fix_for(kind.elementType)
        if e is None:
            return None
        return lambda xs: None if xs is None else [_apply(e, x) for x in xs]
    if isinstance(kind, StructType):
        fields = [(f.name, fix_for(f.dataType)) for f in kind.fields]
        fixed = [(name, f) for name, f in fields if f is not None]
        if not fixed:
            return None

        def struct(d: dict[str, Any] | None) -> dict[str, Any] | None:
            if d is None:
                return None
            for name, f in fixed:
                d[name] = f(d[name])
            return d

        return struct
    return None


def _apply(f: Fix | None, v: Any) -> Any:
    return v if f is None or v is None else f(v)


def arrow_rows(batches: Iterator[Any], schema: StructType) -> Iterator[tuple[Any, ...]]:
    """The rows of ``batches`` (pyarrow ``RecordBatch``es of ``schema``), as tuples."""
    fixes = [fix_for(f.dataType) for f in schema.fields]
    for batch in batches:
        columns: list[list[Any]] = []
        for column, f in zip(batch.columns, fixes, strict=True):
            values = column.to_pylist()
            if f is not None:
                values = [None if v is None else f(v) for v in values]
            columns.append(values)
        yield from zip(*columns, strict=True)
