"""Bitfields of pending items, in fixed chunks (the source document: ~1,000 bytes a blob).

Each batch numbers its items 0 … total-1 across its groups (an add of n items takes the next
n numbers); item ``b`` is bit ``b % CHUNK_BITS`` of chunk ``b // CHUNK_BITS``. A set bit is an
item still pending; an ack clears it, so a repeated ack finds it clear and changes nothing.
Bits are numbered from the most significant bit of byte 0, as Redis's SETBIT numbers them, so
a chunk is the same bytes in every store.

992 bytes (7,936 items) a chunk: small enough that a change rewrites little, and four chunks
with their row headers fill one 4 KiB SQLite page, so a bit costs barely more than a bit.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

CHUNK_BYTES = 992
CHUNK_BITS = CHUNK_BYTES * 8


def spans(start: int, count: int) -> Iterator[tuple[int, int, int]]:
    """The items ``start`` … ``start+count-1`` as ``(chunk, lo, hi)``: bits lo … hi-1."""
    end = start + count
    while start < end:
        k, lo = divmod(start, CHUNK_BITS)
        hi = min(CHUNK_BITS, lo + end - start)
        yield k, lo, hi
        start += hi - lo


def set_range(buf: bytearray, lo: int, hi: int) -> None:
    """Set bits ``lo`` … ``hi-1`` of ``buf``."""
    while lo < hi and lo & 7:  # the head, up to a byte boundary
        buf[lo >> 3] |= 0x80 >> (lo & 7)
        lo += 1
    whole = (hi - lo) >> 3
    if whole:
        buf[lo >> 3 : (lo >> 3) + whole] = b"\xff" * whole
        lo += whole << 3
    while lo < hi:  # the tail
        buf[lo >> 3] |= 0x80 >> (lo & 7)
        lo += 1


def clear_bits(buf: bytearray, offsets: Iterable[int]) -> int:
    """Clear the bits at ``offsets``; returns how many were set (the items newly ended)."""
    n = 0
    for b in offsets:
        i = b >> 3
        m = 0x80 >> (b & 7)
        v = buf[i]
        if v & m:
            buf[i] = v ^ m
            n += 1
    return n


def count(buf: bytes | bytearray) -> int:
    """Set bits in ``buf``: items still pending."""
    return int.from_bytes(buf, "big").bit_count()
