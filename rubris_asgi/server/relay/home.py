"""The home's end of a carried WebSocket: ``RemoteSink``, the session's ``FrameSink`` while
another node (the entry) holds its client's connection.

A frame is told to the entry (a FRAME record) as the cycle builds it, while fewer than
``FRAMES_IN_FLIGHT`` are unwritten there: ``write_now`` takes it and the session is ready
again at once, as a local socket that takes a frame whole. With the window full, the frame
and its lease wait here (``send_frame``) until an ACK opens the window: a *blocked write*, with
the local rules (the slow-client pause when it ends, GOODBYE 7 past ``max_blocked``, seen
by the housekeeping as for a local socket: ``Relays.close_blocked``).

The client's frames (IN records) are handled in order, one at a time, as a local connection's
reader does (its input budget too), each confirmed by an INACK once handled and its direct
answers told (so the entry may answer a PING alone: entry.py).

The entry's node gone, or the stream to it broken (a stretch of records lost: ``lost``), the
session waits for a resume, as when a local socket dies. Records never reach a sink that
is no longer its session's: a resume elsewhere (``superseded``), the session's end, or a
lost stream takes it out of ``Relays.homes`` and ``Relays.sinks`` first.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Coroutine
from typing import Any, Protocol

from ...engine.buffers import FrameBuffer
from ...engine.flow import on_write_done
from ...engine.session import Session, SessionState
from ...errors import ErrorCode, ProtocolError
from ...protocol import Goodbye, encode
from ..gateway import CLOSE_CODES, Gateway
from .records import FRAME, FRAMES_IN_FLIGHT, INACK, INS_IN_FLIGHT, Sequence, Window, record


class Homes(Protocol):
    """What a ``RemoteSink`` needs of the node's relays (``Relays``, which holds the sinks: a
    protocol, not an import, so neither module imports the other)."""

    gateway: Gateway
    blocked: dict[RemoteSink, None]

    def tell(self, node: str, data: bytes) -> None: ...

    def tell_close(self, node: str, conn: int, code: int, reason: str, last: bytes) -> None: ...

    def forget(self, sink: RemoteSink) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...


class RemoteSink:
    """The home's ``FrameSink`` for a session carried by another node."""

    __slots__ = (
        "relays",
        "session",
        "via",
        "conn",
        "closed",
        "writing_since",
        "window",
        "held",
        "ins",
        "inbox",
        "_handling",
        "unconfirmed",
    )

    def __init__(self, relays: Homes, session: Session, via: str, conn: int) -> None:
        self.relays = relays
        self.session = session
        self.via = via
        """The entry node."""
        self.conn = conn
        """The entry's number for the connection."""
        self.closed = False
        self.writing_since = 0.0
        """When the frame held back by a full window began to wait (0.0: none waits)."""
        self.window = Window(FRAMES_IN_FLIGHT)
        self.held: tuple[bytes, FrameBuffer] | None = None
        """The frame a full window holds back, and its lease."""
        self.ins = Sequence()
        self.inbox: deque[tuple[int, bytes]] = deque()
        """Client frames (number, bytes) not yet handled, in order."""
        self._handling = False
        self.unconfirmed = 0
        """The last client frame handled whose answers are not all told yet (0: none)."""

    # FrameSink: called from inside the scheduler's cycle, so it must never raise or await

    def write_now(self, frame: bytes) -> bool:
        if self.closed or not self.window.room:
            return False
        self._tell_frame(frame)
        return True

    def send_frame(self, frame: bytes, lease: FrameBuffer) -> None:
        engine = self.relays.gateway.engine
        if self.closed:
            engine.pool.release(lease)
            return
        if self.window.room:  # a frame write_now was not offered (never so today)
            self._tell_frame(frame)
            engine.frame_done(self.session, lease)
            return
        # the window is full: the client has not written what it was sent. Held as a local
        # socket holds a frame it cannot take, until an ACK or max_blocked
        engine.telemetry.blocked_writes += 1
        self.held = (frame, lease)
        self.writing_since = engine.clock()
        self.relays.blocked[self] = None  # the housekeeping's look past max_blocked

    def _tell_frame(self, frame: bytes) -> None:
        n = self.window.send()
        self.relays.tell(self.via, record(FRAME, self.conn, n, frame))
        s = self.session
        if self.unconfirmed and not s.direct:
            self._confirm(self.unconfirmed)
        if s.state is SessionState.CLOSING and not s.has_work():
            # the GOODBYE queued by close_session is on its way: nothing follows it. Ended
            # after the cycle that built it (which may be running now) is done with it
            self._close(CLOSE_CODES.get(s.close_code, 1000), "goodbye")
            asyncio.get_running_loop().call_soon(self.relays.gateway.engine.end_session, s)

    # what the entry tells

    def acked(self, n: int) -> None:
        """The entry wrote the frames up to ``n``."""
        try:
            moved = self.window.ack(n)
        except ValueError:  # the entry confirms what was never sent: a broken stream
            self.lost()
            return
        if not moved or self.held is None:
            return
        frame, lease = self.held
        self.held = None
        self.relays.blocked.pop(self, None)
        engine = self.relays.gateway.engine
        started, self.writing_since = self.writing_since, 0.0
        s = self.session
        now = engine.clock()
        writer = self.relays.gateway.config.writer
        pause = on_write_done(s, started, now, writer)
        if now - started >= writer.blocked_after:
            engine.telemetry.failed_sends += 1
        if pause:
            engine.telemetry.penalty_seconds += pause
            engine.scheduler.hold(s, now + pause)
        self._tell_frame(frame)
        if s.sink is self:
            engine.frame_done(s, lease)
        else:  # ended as its last frame went (a GOODBYE)
            engine.pool.release(lease)

    def client_frame(self, n: int, frame: bytes) -> None:
        """Client frame ``n``: handled after those before it."""
        if not self.ins.take(n) or len(self.inbox) >= INS_IN_FLIGHT:
            self.lost()  # a gap (a stretch of the stream lost) or an entry past its window
            return
        self.inbox.append((n, frame))
        if not self._handling:
            self._handling = True
            self.relays.spawn(self._handle())

    async def _handle(self) -> None:
        gateway = self.relays.gateway
        dispatcher = gateway.dispatcher
        s = self.session
        try:
            while self.inbox and not self.closed and s.sink is self:
                n, frame = self.inbox.popleft()
                dispatcher.spend(s, len(frame))
                try:
                    await dispatcher.handle(s, gateway.decode_client_frame(frame))
                except ProtocolError as exc:  # bad input: GOODBYE, then the entry closes
                    gateway.engine.close_session(s, exc.code, str(exc))
                    return
                if s.state is SessionState.CLOSED:
                    return
                await dispatcher.pay(s)  # over its input budget: the entry waits for this
                if self.closed:
                    return
                if s.direct or self.held is not None:
                    self.unconfirmed = n  # confirmed once its answers are told (below)
                else:
                    self._confirm(n)
        finally:
            self._handling = False

    def _confirm(self, n: int) -> None:
        """INACK ``n``: told only once every direct answer to the frames up to ``n`` is told
        before it, so that the entry, which then holds everything the home answered, may
        answer a PING itself without a PONG overtaking a REJECTED (protocol.md section 4)."""
        self.unconfirmed = 0
        self.relays.tell(self.via, record(INACK, self.conn, n))

    # endings

    def lost(self, tell: bool = True) -> None:
        """The client's connection ended, or the stream to its entry broke: the session
        waits for a resume (the entry closes the connection if it still has it; not told
        with ``tell`` False: nobody listens there)."""
        if self.closed:
            return
        self._close(
            1013, "try again: the session's server lost track of this connection", tell=tell
        )
        s = self.session
        if s.sink is self and s.state is SessionState.CONNECTED:
            self.relays.gateway.engine.detach(s)

    def superseded(self) -> None:
        """A newer connection resumed the session: the entry closes this one."""
        self._close(1000, "resumed elsewhere")

    def ended(self) -> None:
        """The session ended here (not by a GOODBYE it sent: that closes on its own)."""
        self._close(1000, "session ended")

    def blocked_too_long(self) -> None:
        """A frame held back for ``max_blocked``: the client is too slow (GOODBYE 7)."""
        if self.closed or self.held is None:
            return
        engine = self.relays.gateway.engine
        engine.telemetry.closed_blocked += 1
        code = ErrorCode.SLOW_CONSUMER
        self._close(CLOSE_CODES[code], "slow consumer", encode(Goodbye(code, "slow consumer")))
        engine.end_session(self.session)

    def _close(self, code: int, reason: str, last: bytes = b"", tell: bool = True) -> None:
        """Stop carrying: tell the entry to close after what it was sent; let go of the rest."""
        if self.closed:
            return
        self.closed = True
        self.relays.blocked.pop(self, None)
        self.inbox.clear()
        if self.held is not None:
            self.relays.gateway.engine.pool.release(self.held[1])
            self.held = None
            self.writing_since = 0.0
        self.relays.forget(self)
        if tell:
            self.relays.tell_close(self.via, self.conn, code, reason, last)
