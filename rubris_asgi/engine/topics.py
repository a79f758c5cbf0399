"""Topic handles: where published messages wait for the scheduler.

A *shared* topic (snapshot or ring) holds fully encoded PUSH messages. Its number is the same for
every subscriber, so the bytes of one PUSH are identical for all of them: a publish encodes and
compresses once, and a delivery is an append of those bytes to a frame. A *subscription* (``Sub``)
is the per-session state: how far that session has read.

A *private* topic belongs to one session and is lossless: ``PrivateSub`` keeps the messages not
yet sent and those sent but not yet covered by the client's cumulative ACK, bounded together by
the channel's capacity, so a resumed session can be sent again what was in flight.

The per-delivery logic lives in ``frames.py`` (the frame builder, inlined there for speed); this
module holds the state and the operations outside the hot loop.
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Callable
from typing import Any

import orjson

from ..protocol import Codec, Mode, push_message

SNAPSHOT = int(Mode.SNAPSHOT)
RING = int(Mode.RING)
PRIVATE = int(Mode.PRIVATE)
KEYED = int(Mode.KEYED)
RATED = 0x41
"""Not a wire mode: a snapshot subscription with a ``max_rate`` (``RatedSub``), a branch of the
frame builder of its own so that plain snapshots pay nothing for it."""


def new_epoch() -> int:
    """A fresh epoch: random, so numbering from a restarted server is never mistaken."""
    return secrets.randbits(48) or 1


def trimmed(payload: bytes) -> bytes:
    """``payload`` in a bytes object of its own size, for what is kept beyond the call that
    encoded it (a waiting queue item, a keyed topic's value, the intake's entries). orjson's
    ``dumps`` (3.12 on) answers in the 4 KiB buffer it wrote into: a 30-byte item kept that way
    holds 4 KiB, measured (tracemalloc: 4,217 bytes an item of ``{"job": i, "symbol": s}``).
    One copy of the item's own size, about 0.2 us for a small one."""
    return bytes(memoryview(payload))


def encode_payload(value: Any, codec: int) -> bytes:
    """The payload bytes of ``value`` for a topic's codec.

    ``bytes`` pass as they are (raw data, or JSON the application encoded itself); ``str`` on a
    text topic is UTF-8; anything else is JSON through orjson.
    """
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if codec == Codec.TEXT and isinstance(value, str):
        return value.encode()
    if codec == Codec.BYTES:
        raise TypeError(f"a bytes topic takes bytes, got {type(value).__name__}")
    return orjson.dumps(value)


class SharedTopic:
    """A topic every subscribed session reads from; ``publish`` is O(1) whatever the subscribers."""

    __slots__ = (
        "name",
        "number",
        "mode",
        "codec",
        "epoch",
        "seq",
        "subs",
        "dirty",
        "msg",
        "ring",
        "cap",
        "stamp",
        "stamps",
        "compress_at",
        "keep",
        "app",
        "pattern",
        "_on_dirty",
    )

    def __init__(
        self,
        name: str,
        number: int,
        mode: int,
        *,
        epoch: int,
        codec: int = Codec.JSON,
        ring: int = 64,
        compress_at: int | None = None,
        on_dirty: Callable[[SharedTopic], None],
    ) -> None:
        if mode not in (SNAPSHOT, RING, KEYED):
            raise ValueError(f"a shared topic is a snapshot, a ring or keyed, got mode {mode}")
        if ring < 1:
            raise ValueError(f"ring size must be >= 1, got {ring}")
        self.name = name
        self.number = number
        self.mode = mode
        self.codec = codec
        self.epoch = epoch
        self.seq = 0
        # dict as an ordered set: O(1) unsubscribe, cheap iteration in the fan-out
        self.subs: dict[Sub, None] = {}
        self.dirty = False
        self.msg = b""
        self.cap = ring if mode == RING else 1
        self.ring: list[bytes] = [b""] * self.cap
        # publish times (the engine's clock) of ``msg`` and of each ring slot: what the cycle's
        # publish-to-frame samples read (telemetry.py); a list, as an array of doubles costs
        # publish three times as much to store into
        self.stamp = 0.0
        self.stamps: list[float] = [0.0] * self.cap
        self.compress_at = compress_at
        self.keep: float | None = None
        """Seconds this topic outlives its last publish with no subscriber, once the
        application published to it (None: for ever); see ``Engine.retire``."""
        self.app = False
        """The application published to it (``Rubris.publish``, the HTTP API), not only
        clients: then ``keep`` applies, else the shorter window of what clients made."""
        self.pattern = ""
        """The channel it belongs to (what ``max_topics`` of a channel counts)."""
        self._on_dirty = on_dirty

    def publish(self, payload: bytes, compressed: bool, stamp: float) -> int:
        """Store one encoded payload as the next message, published at ``stamp`` (the engine's
        clock); returns its seq.

        Repeated publishes between two cycles mark the topic dirty once (coalescing): the
        fan-out to subscribers happens in the cycle, never here.
        """
        seq = self.seq + 1
        msg = push_message(self.number, seq, payload, compressed)
        self.seq = seq
        self.msg = msg
        self.stamp = stamp
        if self.mode == RING:
            slot = seq % self.cap
            self.ring[slot] = msg
            self.stamps[slot] = stamp
        if not self.dirty and self.subs:
            self.dirty = True
            self._on_dirty(self)
        return seq

    def reset(self, epoch: int) -> None:
        """Number afresh under ``epoch``: nothing held (its subscribers are gone first)."""
        self.epoch = epoch
        self.seq = 0
        self.msg = b""
        self.ring = [b""] * self.cap
        self.stamps = [0.0] * self.cap

    @property
    def oldest(self) -> int:
        """The oldest seq a ring still holds (head + 1 when empty)."""
        return max(1, self.seq - self.cap + 1)

    def __repr__(self) -> str:
        return f"<SharedTopic {self.name!r} #{self.number} mode={self.mode} seq={self.seq}>"


class Sub:
    """One session's subscription to a topic.

    ``cursor`` means, for a snapshot, the last seq delivered; for a ring, the next seq to deliver.
    """

    # one more slot here costs the fan-out ~10 % (measured with bench/engine.py): keep it lean
    __slots__ = ("session", "topic", "number", "mode", "cursor", "__weakref__")

    def __init__(self, session: object, topic: SharedTopic | None, number: int, mode: int) -> None:
        self.session = session
        self.topic = topic
        self.number = number
        self.mode = mode
        self.cursor = 0

    def has_more(self) -> bool:
        t = self.topic
        if t is None:
            return False
        if self.mode == SNAPSHOT:
            return t.seq != self.cursor
        return self.cursor <= t.seq


class RatedSub(Sub):
    """A snapshot subscription with a ``max_rate``: after its first value, frames carrying this
    topic at least ``every`` seconds apart, each with the latest value (protocol.md 5b)."""

    __slots__ = ("every", "due", "waiting")

    def __init__(self, session: object, topic: SharedTopic, every: float) -> None:
        super().__init__(session, topic, topic.number, RATED)
        self.every = every
        self.due = 0.0
        """Not before this (the engine's clock) may its next frame carry this topic."""
        self.waiting = False
        """A timer of the scheduler's will put it back in its session's pending set."""

    def has_more(self) -> bool:
        t = self.topic
        return t is not None and t.seq != self.cursor


class PrivateSub(Sub):
    """A session's own lossless topic: a bounded queue with retention until ACK.

    Capacity counts unsent *and* unacknowledged messages: a client that never ACKs fills the
    queue and the publisher is pushed back, instead of the server holding an unbounded backlog.
    """

    __slots__ = (
        "name",
        "epoch",
        "seq",
        "capacity",
        "batch",
        "codec",
        "compress_at",
        "unsent",
        "unacked",
        "waiters",
    )

    def __init__(
        self,
        session: object,
        name: str,
        number: int,
        *,
        epoch: int,
        capacity: int,
        batch: int = 1,
        codec: int = Codec.JSON,
        compress_at: int | None = None,
    ) -> None:
        super().__init__(session, None, number, PRIVATE)
        if capacity < 1 or batch < 1:
            raise ValueError("private queue capacity and batch must be >= 1")
        self.name = name
        self.epoch = epoch
        self.seq = 0
        self.capacity = capacity
        self.batch = batch
        self.codec = codec
        self.compress_at = compress_at
        self.unsent: deque[tuple[int, bytes]] = deque()
        self.unacked: deque[tuple[int, bytes]] = deque()
        # called (and forgotten) when space frees: how ``send()`` waits without this module
        # knowing about asyncio
        self.waiters: deque[Callable[[], None]] = deque()

    def __len__(self) -> int:
        return len(self.unsent) + len(self.unacked)

    def full(self) -> bool:
        return len(self.unsent) + len(self.unacked) >= self.capacity

    def put(self, payload: bytes, compressed: bool) -> int:
        """Append one message (the caller checked ``full()``); returns its seq."""
        seq = self.seq + 1
        self.seq = seq
        self.unsent.append((seq, push_message(self.number, seq, payload, compressed)))
        return seq

    def ack(self, upto: int) -> int:
        """Forget delivered messages with seq <= upto; returns how many were released.

        An ACK beyond what was delivered only covers what was delivered: the client cannot
        acknowledge what it never received.
        """
        released = 0
        unacked = self.unacked
        while unacked and unacked[0][0] <= upto:
            unacked.popleft()
            released += 1
        if released:
            self.wake_waiters()
        return released

    def rewind(self) -> None:
        """Make everything sent but unacknowledged unsent again (a resumed connection)."""
        if self.unacked:
            self.unsent.extendleft(reversed(self.unacked))
            self.unacked.clear()

    def wake_waiters(self) -> None:
        free = self.capacity - len(self)
        while self.waiters and free > 0:
            self.waiters.popleft()()
            free -= 1

    def has_more(self) -> bool:
        return bool(self.unsent)

    def __repr__(self) -> str:
        return (
            f"<PrivateSub {self.name!r} #{self.number} unsent={len(self.unsent)} "
            f"unacked={len(self.unacked)}/{self.capacity}>"
        )
