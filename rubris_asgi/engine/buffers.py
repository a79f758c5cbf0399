"""Bounded outbound frame buffers: the writer pool of source document 001, in CPython terms.

What the original does
    Rubris (Java) writes every outbound frame into a buffer taken from a pool of pre-allocated
    blocks (default 256 KiB), a smaller pool of large blocks (block size x 4) for a frame whose
    *first* message does not fit a block, and, beyond that, freshly allocated buffers growing x2
    from the large size up to a maximum (block size x 16). A message larger than the maximum is
    refused. A message that does not fit after others waits for the next frame, so many small
    messages never cause a bigger buffer and a big one never holds small ones back.

What we keep, and why memory is not recycled
    In CPython there is no cheap way to write into reused memory and hand it to the transport:
    an ASGI server's ``send`` wants a ``bytes`` object, so a frame must become one new ``bytes``
    in any case. Building it as a list of already-encoded messages joined once with
    ``b"".join`` copies each byte exactly once; slice-assigning the messages into a reused
    ``bytearray`` and then copying that out costs an extra copy plus per-message slicing
    overhead (measured on the development machine at about 1.8x the cost per message). Pooling
    the memory itself would therefore be slower than not pooling it.

    What the pool still gives us is the *bound*. A :class:`WriterPool` hands out leases on
    capacity rather than memory: a frame's first message fixes its capacity (its size class) and
    needs a lease of that class free (:meth:`WriterPool.room`). A frame the transport writes at
    once, whole, is done with and takes none; one that must wait (the socket is full, or the
    server writes on its own threads, or a long-poll keeps it for the next poll) takes the lease
    and holds it until it is written. Sessions handed the same bytes while a write of them is
    under way share its lease, one holder each (a shared frame is one object in memory, however
    many sockets it goes to). The number of leases of each class is fixed, so the bytes of
    outbound frames in flight never exceed::

        blocks * block_size + large_blocks * large_size + unpooled * max_size

    A slow client whose write has not completed keeps its lease, exactly as a blocked write keeps
    its buffer in the original. When a class has no lease free, :meth:`WriterPool.acquire`
    returns ``None`` and the scheduler leaves that session pending for a later cycle instead of
    allocating more; the back-pressure lands on the sessions that need the scarce class.

    The size classes keep their meaning for fairness and for operations: block-sized frames are the
    normal case, large frames should be occasional and unpooled ones rare (the source document
    warns that more than the very occasional direct allocation means the block size is wrong);
    :class:`PoolStats` counts each path so that this can be watched.

The pool is used from the event loop only and takes no locks.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from rubris_asgi.errors import MessageTooLarge

from ..config import PoolConfig

__all__ = ["FrameBuffer", "PoolConfig", "PoolStats", "SizeClass", "WriterPool"]


class SizeClass(Enum):
    """Which lease a frame holds; decided by the frame's first message."""

    BLOCK = "block"
    LARGE = "large"
    UNPOOLED = "unpooled"


class FrameBuffer:
    """The lease of one outbound frame: ``capacity`` bytes of its size class, held until the
    frame is written.

    The frame itself is the builder's ``bytes`` (joined once; see the module docstring for why
    that beats copying into a reused buffer). A frame handed to several sessions as the same
    bytes (a shared frame, engine/frames.py) has one lease and one *holder* per session whose
    write is under way; the lease returns to the pool when its last holder releases it.
    """

    __slots__ = ("size_class", "capacity", "size", "holders", "released")

    def __init__(self, size_class: SizeClass, capacity: int) -> None:
        self.size_class = size_class
        self.capacity = capacity
        self.size = 0
        self.holders = 1
        """Writes of this frame not yet ended: each releases once."""
        self.released = False

    def fits(self, n: int) -> bool:
        """Whether a message of ``n`` bytes still fits in this frame."""
        return self.size + n <= self.capacity

    def __repr__(self) -> str:
        return (
            f"FrameBuffer({self.size_class.name}, {self.size}/{self.capacity} bytes, "
            f"{self.holders} holders{', released' if self.released else ''})"
        )


@dataclass(slots=True)
class PoolStats:
    """Counters of a :class:`WriterPool`.

    ``block``, ``large`` and ``unpooled`` count frames started in each size class since start
    (a frame written at once takes no lease, but its class tells the block size's fit all the
    same); ``shared`` counts frames that joined the lease of the same bytes still being written
    to another session (no lease taken); ``refused`` counts messages refused as larger than the
    maximum; ``exhausted`` counts acquisitions refused because their class had no lease free.
    ``in_use_*`` are the leases held now, ``peak_*`` the most held at once.
    """

    block: int = 0
    large: int = 0
    unpooled: int = 0
    shared: int = 0
    refused: int = 0
    exhausted: int = 0
    in_use_block: int = 0
    in_use_large: int = 0
    in_use_unpooled: int = 0
    peak_block: int = 0
    peak_large: int = 0


class WriterPool:
    """Hands out bounded leases of frame capacity by size class."""

    __slots__ = ("config", "stats", "_block_size", "_large_size", "_max_size")

    def __init__(self, config: PoolConfig | None = None) -> None:
        self.config = config if config is not None else PoolConfig()
        self.stats = PoolStats()
        # Cached: acquire runs once per session per cycle and properties are not free.
        self._block_size = self.config.block_size
        self._large_size = self.config.large_size
        self._max_size = self.config.max_size

    def check_size(self, n: int) -> None:
        """Raise :class:`MessageTooLarge` if a message of ``n`` bytes can never be sent.

        Publishing calls this first so that an oversized message is refused to its publisher
        before it reaches any session (it is never half-sent).
        """
        if n > self._max_size:
            self.stats.refused += 1
            raise MessageTooLarge(
                f"message of {n} bytes exceeds the maximum of {self._max_size} bytes "
                f"(block_size {self._block_size} x max_scale {self.config.max_scale})"
            )

    def acquire(self, first: int) -> FrameBuffer | None:
        """Start a frame whose first message is ``first`` bytes long.

        Returns ``None`` when the needed class has no lease free: the caller keeps the session
        pending and tries again in a later cycle.
        """
        if first < 0:
            raise ValueError(f"message size must be >= 0, got {first}")
        return self.take(first) if self.room(first) else None

    def room(self, first: int) -> int:
        """How many bytes a frame whose first message is ``first`` bytes long may hold, if its
        class has a lease free (a block's size; a larger first message goes alone); 0 when it
        has none (counted in ``exhausted``). The frame builder asks this at a frame's first
        message, which then always goes into the frame: a frame started in the class, counted
        here. The lease is taken with :meth:`take` once the frame is built, if the transport
        cannot write it at once: nothing else takes a lease in between (one event loop), so
        the lease is there."""
        stats = self.stats
        config = self.config
        if first <= self._block_size:
            if stats.in_use_block < config.blocks:
                stats.block += 1
                return self._block_size
        elif first <= self._large_size:
            if stats.in_use_large < config.large_blocks:
                stats.large += 1
                return first
        else:
            self.check_size(first)
            if stats.in_use_unpooled < config.unpooled:
                stats.unpooled += 1
                return first
        stats.exhausted += 1
        return 0

    def take(self, first: int) -> FrameBuffer:
        """The lease of a frame whose first message is ``first`` bytes long, when :meth:`room`
        has said there is one (not checked again: the hot path)."""
        stats = self.stats
        if first <= self._block_size:
            stats.in_use_block += 1
            if stats.in_use_block > stats.peak_block:
                stats.peak_block = stats.in_use_block
            return FrameBuffer(SizeClass.BLOCK, self._block_size)
        if first <= self._large_size:
            stats.in_use_large += 1
            if stats.in_use_large > stats.peak_large:
                stats.peak_large = stats.in_use_large
            return FrameBuffer(SizeClass.LARGE, self._large_size)
        # The original grows x2 from the large size; capping at the maximum keeps the bound
        # exact when max_scale is not large_scale times a power of two.
        capacity = self._large_size * 2
        while capacity < first:
            capacity *= 2
        capacity = min(capacity, self._max_size)
        stats.in_use_unpooled += 1
        return FrameBuffer(SizeClass.UNPOOLED, capacity)

    def share(self, buf: FrameBuffer) -> None:
        """One more session's write of the frame ``buf`` is the lease of (the same bytes, while
        an earlier write of them is under way): it returns when the last of them is released."""
        buf.holders += 1
        self.stats.shared += 1

    def release(self, buf: FrameBuffer) -> None:
        """A write of the frame ``buf`` has ended (each holder releases once); the lease returns
        when no write of it is under way. Releasing a returned lease does nothing."""
        if buf.released:
            return
        buf.holders -= 1
        if buf.holders > 0:
            return
        buf.released = True
        stats = self.stats
        size_class = buf.size_class
        if size_class is SizeClass.BLOCK:
            stats.in_use_block -= 1
        elif size_class is SizeClass.LARGE:
            stats.in_use_large -= 1
        else:
            stats.in_use_unpooled -= 1

    def __repr__(self) -> str:
        s = self.stats
        c = self.config
        return (
            f"WriterPool(block {s.in_use_block}/{c.blocks}, large {s.in_use_large}/"
            f"{c.large_blocks}, unpooled {s.in_use_unpooled}/{c.unpooled})"
        )
