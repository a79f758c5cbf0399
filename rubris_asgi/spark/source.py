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

The options and offsets are source_options.py's, the HTTP reads pages.py's, messages to rows
convert.py's; docs/spark.md ("Reading from rubris") lists every option.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from .convert import DEFAULT_SCHEMA, RowMaker, infer_schema, row_maker
from .options import flag, lower_keys
from .pages import HEAD_ONLY, Page, TopicClient, page_limit
from .source_options import DataLossError, Offset, Offsets, SourceOptionError, SourceOptions

log = logging.getLogger("rubris_asgi.spark")


# --------------------------------------------------------------------------- schema


def source_schema(options: Mapping[str, str]) -> StructType | str:
    """The schema without ``.schema(...)``: option ``schema`` (DDL), one inferred from what
    the topics hold now (``inferSchema=true``), or ``DEFAULT_SCHEMA``."""
    opts = lower_keys(options)
    ddl = opts.get("schema")
    infer = flag(opts, "inferSchema", False, error=SourceOptionError)
    if ddl is not None and infer:
        raise SourceOptionError("options schema and inferSchema exclude each other")
    if ddl is not None:
        return ddl
    if infer:
        return infer_schema(SourceOptions.parse(options))
    return DEFAULT_SCHEMA


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
        page = http.page(topic, after, epoch, page_limit(after, end))
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
            page = http.page(topic, after, epoch, page_limit(after, end))
            if page.epoch != epoch:
                if not page.snapshot:
                    lost(opts, _restarted(topic, epoch, page.epoch, end, after))
                return


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
    if "startingoffsets" not in lower_keys(options):
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
