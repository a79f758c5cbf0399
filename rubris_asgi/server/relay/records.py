"""The records two nodes exchange about a carried WebSocket, and the windows that bound them.

Sans-IO: bytes in, bytes out, numbers checked. Each side of a carried connection tells the
other records (``NodeLink.tell``: one way, in order, at most once, a lost stretch reported to
the teller), many connections' records in one message. A record is a 13-byte head, ``kind:u8
conn:u32 n:u32 len:u32``, then ``len`` bytes:

==========  ===========  =================================================================
kind        direction    meaning
==========  ===========  =================================================================
FRAME       home->entry  frame ``n`` of the connection (numbered from 1) for its client
CLOSE       home->entry  close with WebSocket code ``n`` once the frames before are written;
                         the body: ``reason_len:u8 reason`` then a last frame (GOODBYE) or
                         nothing
INACK       home->entry  the client frames up to ``n`` are handled: more may come
IN          entry->home  client frame ``n`` (numbered from 1)
ACK         entry->home  the frames up to ``n`` are written to the client's socket
READY       entry->home  the WELCOME is written: frames may follow
GONE        entry->home  the client's connection ended (after the IN records before it)
KEEP        either way   nothing (conn 0): this node lives and still carries connections
                         with the other (told when nothing else was for half a heartbeat)
==========  ===========  =================================================================

``conn`` is the entry's number for the connection (unique on the entry node); the home knows
a connection as (entry node, conn).

**Why numbers.** The stream between two nodes keeps order, but a stretch of it can be lost
(Redis failed during a flush): the teller hears of it and ends its side, and the other side
must never write frame n + 1 after losing frame n, nor handle a client's frame after losing
the one before. So FRAME and IN are numbered per connection and a gap ends the connection
(``Sequence``): the client resumes, which is exact whatever the lost frames held (a resumed
session restates what its client holds, protocol.md section 5), just as after a socket that
died with frames in it.

**Why windows.** The home hands the entry at most ``FRAMES_IN_FLIGHT`` frames not yet written
to the client (``Window``), then holds the session's next frame, as a local socket whose
buffer is full: a slow client slows its own session only, and the slow-client rules count
the wait as a blocked write. The entry hands the home at most ``INS_IN_FLIGHT`` client frames
not yet handled, then stops reading the socket (TCP holds the client back), as a local
connection does while its frame is handled. Both bound what a carried connection holds on
either node and in Redis.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

FRAME, CLOSE, INACK, IN, ACK, READY, GONE, KEEP = range(1, 9)
HEAD = struct.Struct("!BIII")
"""kind, conn, n, body length."""
FRAMES_IN_FLIGHT = 8
"""Frames a home sends a carried connection ahead of the client's socket. Eight frames of a
round trip through Redis (about a millisecond on one host) carry a session's rings at tens of
thousands of messages a second, and bound what a stalled client holds elsewhere to eight
frames (each at most the largest message, protocol.md section 5)."""
INS_IN_FLIGHT = 16
"""Client frames an entry hands the home ahead of their handling."""
CONNS = 1 << 32
"""Connection numbers are u32."""


def record(kind: int, conn: int, n: int, body: bytes | memoryview = b"") -> bytes:
    """One record: its head and ``body`` (copied: a frame's buffer is reused at once)."""
    return HEAD.pack(kind, conn, n, len(body)) + body


def close_record(conn: int, code: int, reason: str, last: bytes = b"") -> bytes:
    """CLOSE with WebSocket ``code``, ``reason`` (at most 120 bytes, as a close frame allows
    with room to spare) and a last frame to write before the close (or none)."""
    r = reason.encode()[:120]
    return record(CLOSE, conn, code, bytes((len(r),)) + r + last)


def close_body(body: bytes) -> tuple[str, bytes]:
    """A CLOSE's reason and last frame."""
    n = body[0] if body else 0
    return body[1 : 1 + n].decode(errors="replace"), body[1 + n :]


def records(data: bytes) -> Iterator[tuple[int, int, int, bytes]]:
    """Each record of ``data`` as (kind, conn, n, body). Raises ValueError on a cut record."""
    size = HEAD.size
    unpack = HEAD.unpack_from
    pos, end = 0, len(data)
    while pos < end:
        if pos + size > end:
            raise ValueError("a record's head is cut short")
        kind, conn, n, length = unpack(data, pos)
        pos += size
        if pos + length > end:
            raise ValueError("a record's body is cut short")
        yield kind, conn, n, data[pos : pos + length]
        pos += length


class Sequence:
    """What one side expects next of a numbered stream (FRAME or IN of one connection)."""

    __slots__ = ("next",)

    def __init__(self) -> None:
        self.next = 1

    def take(self, n: int) -> bool:
        """Whether ``n`` is the one expected (then the next is expected); False: a gap or a
        repeat, and the connection must end."""
        if n != self.next:
            return False
        self.next = n + 1
        return True


class Window:
    """What one side has sent of a numbered stream and the other has confirmed."""

    __slots__ = ("size", "sent", "acked")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("a window holds at least one")
        self.size = size
        self.sent = 0
        """The last number sent."""
        self.acked = 0
        """The last number confirmed (everything up to it)."""

    @property
    def room(self) -> bool:
        return self.sent - self.acked < self.size

    @property
    def outstanding(self) -> int:
        return self.sent - self.acked

    def send(self) -> int:
        """The next number, counted as sent. Raises when the window is full."""
        if not self.room:
            raise OverflowError("the window is full")
        self.sent += 1
        return self.sent

    def ack(self, n: int) -> bool:
        """Everything up to ``n`` is confirmed; whether that moved anything. Raises
        ValueError for a number never sent (the other side is broken)."""
        if n > self.sent:
            raise ValueError(f"confirmed {n}, only {self.sent} sent")
        if n <= self.acked:
            return False  # late or repeated: cumulative, nothing new
        self.acked = n
        return True
