"""Partitions: how rubris's keys and channels are spread over the masters of a Redis Cluster.

A cluster serves 16384 hash slots; a key's slot is the CRC16 of its hash tag (the part between
the first ``{`` and the next ``}``, when not empty) or of the whole key. rubris cuts the slot
space into ``count`` partitions (64 by default) of equal contiguous ranges, and names each by a
*tag* whose slot lies in the middle half of its range. Every key and channel of partition ``i``
starts with ``prefix(base, i)`` = ``base + "{" + tag + "}:"``, so all of them hash to that one
slot: a partition's state lives on one master, and one script (which may only touch keys of a
single slot) can change all of it. The Lua scripts take their key prefix as ``ARGV[1]``, so they
run unchanged on a partition's prefix.

Why the middle half: masters are given contiguous slot ranges (``redis-cli --cluster create``,
a resharding moving ranges), and the boundaries fall at multiples of 16384/masters. A tag in the
middle of its partition's range is on the side of a boundary that splits partitions evenly: 64
partitions over 2 masters go 32/32, over 3 masters 21/22/21, where a tag at the start of each
range would give one master more than its share whenever a boundary cuts a range.

A name (a topic, a queue, a table) belongs to ``partition_of(name)``: a stable hash (CRC-32 of
its UTF-8 bytes, the same in every process and every Python, which ``hash`` is not). Sans-IO:
nothing here talks to Redis.
"""

from __future__ import annotations

import binascii
import zlib
from functools import cache

SLOTS = 16384
"""Hash slots of a Redis Cluster."""
PARTITIONS = 64
"""Partitions by default: enough that 1 to 8 masters split evenly (no master more than one
partition above another; up to 16 masters, at most two), few enough that a script or a scan
over every partition stays short."""

MAX_PARTITIONS = SLOTS // 16
"""The most partitions: each range keeps 16 slots, whose middle half (8 slots) a tag is found
in within a few thousand tries; past it the search of the tags grows long, and so many
partitions would only multiply subscriptions and scripts."""


def key_slot(key: str | bytes) -> int:
    """The hash slot Redis computes for ``key`` (CLUSTER KEYSLOT): CRC16-XMODEM, which is
    ``binascii.crc_hqx`` from 0, of the hash tag or the whole key, modulo 16384. A ``{``
    without a ``}`` after it, or ``{}`` (an empty tag), makes the whole key count, as in
    Redis's ``keyHashSlot``."""
    data = key.encode() if isinstance(key, str) else key
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    return binascii.crc_hqx(data, 0) % SLOTS


def slot_range(i: int, count: int = PARTITIONS) -> range:
    """The slots partition ``i`` of ``count`` owns: ``[i*16384//count, (i+1)*16384//count)``."""
    _check(i, count)
    return range(i * SLOTS // count, (i + 1) * SLOTS // count)


def middle_half(i: int, count: int = PARTITIONS) -> range:
    """The middle half of partition ``i``'s slots, where its tag's slot lies."""
    r = slot_range(i, count)
    quarter = len(r) // 4
    return range(r.start + quarter, r.stop - quarter)


@cache  # one entry per partition count in use: a handful
def _tags(count: int) -> tuple[str, ...]:
    tags = []
    for i in range(count):
        middle = middle_half(i, count)
        k = 0
        while key_slot(f"rb.{i}.{k}") not in middle:  # ends: CRC16 spreads over every slot
            k += 1
        tags.append(f"rb.{i}.{k}")
    return tuple(tags)


def tag(i: int, count: int = PARTITIONS) -> str:
    """Partition ``i``'s hash tag: the first ``rb.{i}.{k}`` (k = 0, 1, ...) whose slot lies in
    the middle half of its range. Computed once per ``count`` (a few thousand CRCs)."""
    _check(i, count)
    return _tags(count)[i]


def slot_of_partition(i: int, count: int = PARTITIONS) -> int:
    """The one slot every key and channel of partition ``i`` hashes to."""
    return key_slot(tag(i, count))


def prefix(base: str, i: int, count: int = PARTITIONS) -> str:
    """What every key and channel of partition ``i`` starts with: ``base{tag}:``, e.g.
    ``rubris:{rb.5.2}:``. ``base`` must hold no ``{``: Redis hashes the first braces only."""
    if "{" in base:
        raise ValueError(f"the base {base!r} holds a '{{': the partition's tag would not count")
    return f"{base}{{{tag(i, count)}}}:"


def partition_of(name: str, count: int = PARTITIONS) -> int:
    """The partition ``name`` (a topic, a queue, a table) belongs to: CRC-32 of its UTF-8
    bytes modulo ``count``, stable across processes, hosts and Python versions."""
    if count < 1:
        raise ValueError("a partition count is at least 1")
    return zlib.crc32(name.encode()) % count


def _check(i: int, count: int) -> None:
    if not 1 <= count <= MAX_PARTITIONS:
        raise ValueError(f"a partition count is between 1 and {MAX_PARTITIONS}, not {count}")
    if not 0 <= i < count:
        raise ValueError(f"no partition {i} of {count}")
