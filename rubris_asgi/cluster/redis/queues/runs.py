"""The forms of work-queue items in Redis, on the node's side (the scripts' side is lua.py):
an item's *record*, a *run* of records (one list element, one custody piece), a piece's name
and number, and the *marks* that end its items. lua.py's docstring lays each out."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterator

import orjson

from ....engine.queues import QueueItem

NO_META = b"[null,null]"
"""The record's ``[id, batch_item]`` of an item with neither (most items)."""
FRESH = (b"0:0::0:" + NO_META + b"\n", b"0:0::1:" + NO_META + b"\n")
"""The head of a new item's record without an id or batch item, its payload plain or deflated:
most records, made and read without formatting or parsing."""
FRESH_LEN = len(FRESH[0])
FLAG_AT = 5
"""Where the flag (``1``: deflated) is in a record that starts with ``FRESH``."""
DEFLATED = ord("1")

HEAD = struct.Struct(">HI6sI")
"""A run's head (lua.py): its count, its base and its origin, here the mark of the node
that made it and the run's number there."""
NO_ORIGIN = bytes(10)
PLACE_BITS = 12
"""Bits of an item's place in its piece, in the codes of ``RedisQueues._where`` (a take moves
at most ``TAKE_MAX`` items, so a piece holds at most that many)."""
PLACE_MASK = (1 << PLACE_BITS) - 1
PIECE_BITS = 12
"""Bits of a piece's number in its take."""


def encode_item(item: QueueItem) -> bytes:
    """The record of ``item`` in Redis (lua.py: counts first). A new item has no key
    (the empty one): only an item given back needs one, to be found again (``withdraw``)."""
    if item.id is None and item.batch_item is None:
        if not (item.failures or item.attempt or item.key):
            return FRESH[item.compressed] + item.payload
        meta = NO_META
    else:
        meta = orjson.dumps([item.id, item.batch_item])
    return b"%d:%d:%s:%d:%s\n%s" % (
        item.failures,
        item.attempt,
        (item.key or "").encode(),
        item.compressed,
        meta,
        item.payload,
    )


def decode_item(record: bytes, now: float) -> QueueItem:
    """The item of a ``record`` taken at ``now`` (one per item taken: the plain case, no id,
    no batch item, no delivery yet, costs no JSON parse and no int())."""
    failures, attempt, key, flag, rest = record.split(b":", 4)
    if rest.startswith(NO_META):
        item = QueueItem(rest[len(NO_META) + 1 :], flag == b"1", None, now)
    else:
        meta, _, payload = rest.partition(b"\n")
        item_id, batch_item = orjson.loads(meta)
        item = QueueItem(payload, flag == b"1", item_id, now, batch_item)
    if failures != b"0":
        item.failures = int(failures)
    if attempt != b"0":
        item.attempt = int(attempt)
    if key:
        item.key = key.decode()
    return item


def run_of(records: list[bytes], origin: bytes = NO_ORIGIN, ends: list[int] | None = None) -> bytes:
    """The run (lua.py) of ``records``, in order: one list element for them all
    (``ends``: their ends, when the caller has them)."""
    n = len(records)
    if ends is None:
        ends = list(itertools.accumulate(map(len, records)))
    return struct.pack(f">HI10s{n}I", n, 0, origin, *ends) + b"".join(records)


def records_of(run: bytes) -> Iterator[bytes]:
    """The records of a ``run``, in order."""
    count, base, _, _ = HEAD.unpack_from(run)
    data = HEAD.size + 4 * count - base
    start = base
    for end in struct.unpack_from(f">{count}I", run, HEAD.size):
        yield run[data + start : data + end]
        start = end


def piece_name(code: int) -> str:
    """The field of piece ``code`` (its take's number, then its number in the take)."""
    return f"{code >> PIECE_BITS}.{code & ((1 << PIECE_BITS) - 1)}"


def piece_code(name: str) -> int:
    take, _, j = name.partition(".")
    return int(take) << PIECE_BITS | int(j)


def marks_of(places: list[int]) -> bytes:
    """The marks (lua.py, without their head) that set the items at ``places`` (from 1)
    of a piece."""
    bits = bytearray((max(places) + 7) // 8)
    for at in places:
        bits[(at - 1) >> 3] |= 1 << ((at - 1) & 7)
    return bytes(bits)
