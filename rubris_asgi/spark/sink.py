"""Writing to rubris from Spark: ``df.write`` and ``df.writeStream`` with ``format("rubris")``.

Each partition's task turns its rows into NDJSON entries (``rows.py``) and sends them to the
HTTP API (``/api/publish`` or ``/api/enqueue``) in requests of ``batchSize`` rows, paced by the
seed-002 rate controller: every answer carries the server's intake fill, and a task slows down
on a fill of 50 % or more and speeds up stepwise while it stays low (``RequestCore``, shared
with ``SyncPublisher``). 429s, 503s and lost connections are retried for ``retryFor`` seconds;
then, or at once for a refusal a retry would not change (400, 401, 403, 404, 409, 413), the
task fails with a ``SinkError`` naming its partition and the row at fault, and Spark fails the
job after its task retries: nothing is dropped quietly.

What a retried task or a replayed micro-batch does:

- ``enqueue``: every item carries an idempotency key, ``idColumn``'s value or one made from the
  write (a random id drawn once on the driver for ``df.write``; the query id and micro-batch id
  for ``writeStream``), the partition and the row's index in it. The server enqueues an id once
  within its dedup window (default 10 minutes, 1,000,000 ids), so a retry sends again and
  nothing is enqueued twice: exactly once into the queue, within that window.
- ``publish``: shared topics have no ids, so a retried task publishes its rows again: at least
  once (a snapshot topic ends at the same value; a ring topic shows the repeats).
- ``publish`` with ``keyColumn`` (a keyed topic, a live table): a retried task sets, patches
  and deletes again, in the same order, and every op is idempotent (a set of the value held and
  a delete of a key not held change nothing; a merge patch applied twice is applied once), so
  the table ends as the first attempt left it. Meanwhile a key may show an earlier value of the
  same partition's rows again, until the retry reaches that key's last row.

With ``track`` (enqueue only) a ``df.write`` opens one tracker batch on the driver, and each
micro-batch of a ``writeStream`` one batch named after the query and the micro-batch (so a
replay finds the same batch); tasks enqueue with ``?batch=``, which numbers the items the server
really enqueued (retries add nothing), and the driver's commit seals the batch: it completes
when consumers have ACKed (or dead-lettered) every item. The batch id is logged and, with
``announce``, published on that topic.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import Row, StructType

from ..client.publisher import PublishError, RequestCore
from ..errors import RubrisError
from .arrow_rows import arrow_rows
from .options import OptionError, SinkOptions
from .rows import RowEncoder, RowError

log = logging.getLogger("rubris_asgi.spark")

_QUERY_ID = "sql.streaming.queryId"
_BATCH_ID = "streaming.sql.batchId"
"""The local properties Structured Streaming sets on every task of a micro-batch."""


class SinkError(RubrisError):
    """A write that cannot go on: a row the sink cannot send, or a request the server refused
    (``status``) or never answered (``status`` 0). Says which partition and row."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one task sent, handed to the driver's commit."""

    partition: int
    rows: int
    duplicates: int
    requests: int
    retries: int
    enqueued: int
    """Items a tracked write added to its batch (the rest were duplicates)."""
    batch: str | None
    """The tracker batch of a tracked stream's micro-batch, computed by the task."""
    opened: bool = False
    """This task opened the tracker batch of its micro-batch (or found it open): the driver's
    commit need not open it again."""


def batch_writer(options: dict[str, str], schema: StructType, overwrite: bool) -> DataSourceWriter:
    opts = _parse(options, schema, overwrite)
    key = uuid.uuid4().hex[:16]  # one per write: its task retries share it, a new write does not
    batch = None
    if opts.track:
        with _client(opts) as http:
            batch = _open_batch(http, opts, None)
        log.info("rubris: write %s tracks batch %s", key, batch)
    return RubrisBatchWriter(opts, schema, key, batch)


def stream_writer(
    options: dict[str, str], schema: StructType, overwrite: bool
) -> DataSourceStreamWriter:
    return RubrisStreamWriter(_parse(options, schema, overwrite))


def _parse(options: dict[str, str], schema: StructType, overwrite: bool) -> SinkOptions:
    if overwrite:
        raise OptionError("rubris takes appends: a topic's messages cannot be overwritten")
    return SinkOptions.parse(options, schema)


class RubrisBatchWriter(DataSourceArrowWriter):
    """``df.write``: tasks send their partitions, the driver seals a tracked batch.

    Spark hands the tasks Arrow record batches (``arrow_rows.py``): half the CPU a row of the
    ``Row`` path costs, measured by bench/spark.py."""

    def __init__(self, opts: SinkOptions, schema: StructType, key: str, batch: str | None) -> None:
        self.opts = opts
        self.schema = schema
        self.key = key
        self.batch = batch

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        rows = arrow_rows(iterator, self.schema)
        return write_partition(self.opts, self.key, self.batch, rows, plain=True)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _finish(self.opts, self.batch, messages, f"write {self.key}", opened=True)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # the items already enqueued will be worked: seal, so the batch ends with them
        # instead of waiting open for the expiry
        log.warning(
            "rubris: write %s failed; sealing batch %s with what was enqueued", self.key, self.batch
        )
        _finish(self.opts, self.batch, messages, f"failed write {self.key}", opened=True)


class RubrisStreamWriter(DataSourceStreamWriter):
    """``df.writeStream``: each micro-batch written as a ``df.write`` would be, with ids made
    from the query and micro-batch ids so that a replay of the micro-batch is recognised."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Row]) -> SinkCommit:
        ctx = TaskContext.get()
        query = (ctx.getLocalProperty(_QUERY_ID) if ctx else None) or "noquery"
        micro = (ctx.getLocalProperty(_BATCH_ID) if ctx else None) or "0"
        key = f"{query}:{micro}"
        batch = stream_batch_id(query, micro) if self.opts.track else None
        return write_partition(self.opts, key, batch, iterator, open_batch=True)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        batch = next((m.batch for m in messages if isinstance(m, SinkCommit) and m.batch), None)
        opened = any(isinstance(m, SinkCommit) and m.opened for m in messages)
        _finish(self.opts, batch, messages, f"micro-batch {batchId}", opened=opened)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "rubris: micro-batch %s failed; it is written again when it is replayed", batchId
        )


def stream_batch_id(query: str, micro: str) -> str:
    """The tracker batch of a query's micro-batch: the same on a replay, unique per query."""
    return f"{query.replace('-', '')}-{micro}"


# the task side


def write_partition(
    opts: SinkOptions,
    key: str,
    batch: str | None,
    rows: Iterator[Row] | Iterator[tuple[Any, ...]],
    *,
    open_batch: bool = False,
    plain: bool = False,
) -> SinkCommit:
    """Send one partition's rows; raises ``SinkError`` naming the partition and row at fault.
    ``plain``: the rows are tuples of plain values (``arrow_rows``), not ``Row``s."""
    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    encoder = RowEncoder(opts, key, partition, plain=plain)
    path = "enqueue" if opts.mode == "enqueue" else "publish"
    core = RequestCore(
        opts.url, opts.token, opts.batch_size, opts.batch_bytes, opts.retry_for, None, path
    )
    params = {"batch": batch} if batch is not None else None
    done = SinkCommit(partition, 0, 0, 0, 0, 0, batch)
    first = 0  # the index of the first row in the batch being filled
    with _client(opts) as http:
        opened = not open_batch

        def send() -> None:
            nonlocal first, opened
            # only a task with rows opens the batch: each open of a batch already open is a
            # request for nothing (a 409), so a task with nothing to send leaves it to the
            # others, or to the driver's commit
            if params is not None and not opened and core.batch.lines:
                _open_batch(http, opts, batch)
                opened = done.opened = True
            while core.batch.lines:
                body, n = core.batch.take(core.request_size())
                try:
                    answer = core.post_blocking(http, body, n, params=params).json()
                except PublishError as exc:
                    where = f"rows {first}-{first + n - 1}"
                    if exc.index is not None:
                        where = f"row {first + exc.index}"
                    what = "the server refused them" if exc.status else "they were not sent"
                    message = f"partition {partition}, {where}: {what}: {exc}"
                    raise SinkError(message, exc.status) from None
                first += n
                done.requests += 1
                done.duplicates += answer.get("duplicates", 0)
                done.enqueued += answer.get("count") or 0

        for index, row in enumerate(rows):
            try:
                line = encoder.line(index, row)
            except RowError as exc:
                raise SinkError(str(exc)) from None
            core.batch.add(line, 0.0)
            done.rows += 1
            if core.full():
                send()
        send()
    done.retries = core.stats.retries
    return done


# the driver side


def _finish(
    opts: SinkOptions,
    batch: str | None,
    messages: list[WriterCommitMessage | None],
    what: str,
    *,
    opened: bool,
) -> None:
    """Log what the tasks sent; seal a tracked write's batch, opened first unless ``opened``
    (the driver of a ``df.write`` or a task of the micro-batch opened it: opening it again would
    be a request for nothing, a 409)."""
    commits = [m for m in messages if isinstance(m, SinkCommit)]
    rows = sum(m.rows for m in commits)
    log.info(
        "rubris: %s sent %d rows in %d requests (%d duplicates, %d retries)",
        what,
        rows,
        sum(m.requests for m in commits),
        sum(m.duplicates for m in commits),
        sum(m.retries for m in commits),
    )
    if batch is None:
        return
    log.info("rubris: %s added %d items to batch %s", what, sum(m.enqueued for m in commits), batch)
    with _client(opts) as http:
        if not opened:
            _open_batch(http, opts, batch)  # a micro-batch none of whose tasks had rows
        status = _call(http, opts, "POST", f"/api/batches/{batch}/seal", None)
        log.info("rubris: batch %s sealed: %s", batch, status)
        if opts.announce:
            _announce(http, opts, {"batch": batch, **status, "rows": rows})


def _open_batch(http: httpx.Client, opts: SinkOptions, batch: str | None) -> str:
    """Open ``batch`` (a new one of the server's when None); an existing one is fine."""
    body = None if batch is None else {"batch": batch}
    try:
        answer = _call(http, opts, "POST", "/api/batches", body)
    except SinkError as exc:
        if batch is not None and exc.status == 409:
            return batch  # another task (or the first attempt) opened it
        raise
    opened: str = answer["batch"]
    if opts.announce:
        _announce(http, opts, {"batch": opened, "state": "open"})
    return opened


def _announce(http: httpx.Client, opts: SinkOptions, what: dict[str, Any]) -> None:
    _call(http, opts, "POST", "/api/publish", {"topic": opts.announce, "data": what})


def _call(
    http: httpx.Client, opts: SinkOptions, method: str, path: str, body: Any
) -> dict[str, Any]:
    """One request of the batch API; ``SinkError`` with the server's reason unless 2xx."""
    headers = {"Authorization": f"Bearer {opts.token}"} if opts.token else {}
    content = orjson.dumps(body) if body is not None else None
    if content is not None:
        headers["Content-Type"] = "application/json"
    try:
        r = http.request(method, opts.url + path, content=content, headers=headers)
    except httpx.TransportError as exc:
        raise SinkError(f"{method} {opts.url}{path}: {type(exc).__name__}: {exc}") from None
    if r.status_code >= 300:
        try:
            reason = str(r.json().get("error"))
        except ValueError:
            reason = r.text[:200]
        raise SinkError(f"{method} {opts.url}{path}: HTTP {r.status_code}: {reason}", r.status_code)
    answer: dict[str, Any] = r.json()
    return answer


def _client(opts: SinkOptions) -> httpx.Client:
    # no TLS context for a plain http:// URL: loading the CA bundle costs each task ~30 ms
    return httpx.Client(timeout=opts.timeout, verify=opts.url.startswith("https://"))
