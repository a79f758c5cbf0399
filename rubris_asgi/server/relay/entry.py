"""The entry's end of a carried WebSocket: ``Relay``, the client's socket on this node for a
session that lives on another (its home).

Frames from the home (FRAME records) are written in their order, each once: straight to the
socket when it takes them at once (server/direct.py, as the cycle writes a local session's),
else by a writer task through the ASGI ``send``, which waits for the socket. Each written
frame is confirmed (ACK, those of one turn together): that is what opens the home's window.
A frame out of turn means a stretch of the stream was lost: the connection is closed with 1013
and the client resumes, which restates what it holds (records.py says why that is exact).

The client's frames go to the home as IN records, at most ``INS_IN_FLIGHT`` not yet handled
there; past that the socket is not read until the home catches up. A frame of PINGs alone is
answered here when the home has confirmed every frame before it and nothing waits to be
written: the home confirms a frame only after every direct answer to it was told (home.py), so
those answers are written before this PONG, in the order section 4 of protocol.md promises,
and the PING costs no trip through Redis. Otherwise it goes home like any frame.

A CLOSE from the home closes the connection after the frames before it (a GOODBYE last, when
it carries one), within ``CLOSE_WAIT`` seconds: a client that reads nothing is not waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Coroutine
from typing import Any, Protocol

from starlette.websockets import WebSocket, WebSocketDisconnect

from ...protocol import Ping, Pong, decode_frame, encode_frame
from ..direct import DirectSocket
from ..gateway import Gateway
from .records import GONE, IN, INS_IN_FLIGHT, READY, Sequence, Window, record

log = logging.getLogger("rubris_asgi")

CLOSE_WAIT = 2.0
"""Seconds a CLOSE waits for the frames before it to be written (then the connection is
closed without them: the client resumes and is sent them again, or told by a GAP)."""


class Entries(Protocol):
    """What a ``Relay`` needs of the node's relays (``Relays``, which holds the relays: a
    protocol, not an import, so neither module imports the other)."""

    gateway: Gateway
    ask_timeout: float

    def tell(self, node: str, data: bytes) -> None: ...

    def acked(self, relay: Relay, n: int) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...


class Closing:
    """A CLOSE in the write queue: its code, reason and last frame."""

    __slots__ = ("code", "reason", "last")

    def __init__(self, code: int, reason: str, last: bytes) -> None:
        self.code = code
        self.reason = reason
        self.last = last


class Relay:
    """One carried connection on the entry: the client's socket and what goes to and fro."""

    def __init__(
        self,
        relays: Entries,
        ws: WebSocket,
        direct: DirectSocket | None,
        node: str,
        conn: int,
        sid: str,
    ) -> None:
        self.relays = relays
        self.ws = ws
        self.direct = direct
        """The socket written to without the ASGI ``send``, where the server allows."""
        self.node = node
        """The session's home."""
        self.conn = conn
        self.sid = sid
        self.closed = False
        """No more reading, nor frames taken (a CLOSE may still be being written)."""
        self._closing: Closing | None = None
        self._failed = False
        self.frames = Sequence()
        self.ins = Window(INS_IN_FLIGHT)
        self._room = asyncio.Event()
        self.queue: deque[tuple[int, bytes] | Closing] = deque()
        """What waits for the writer task, in order: frames (number, bytes) and a CLOSE."""
        self._writer: asyncio.Task[None] | None = None

    @property
    def writer(self) -> asyncio.Task[None] | None:
        """The task writing what waits (a CLOSE among it), if one runs."""
        return self._writer

    # the client's side

    async def run(self, welcome: bytes) -> None:
        relays = self.relays
        timing = relays.gateway.config.timing
        silent = timing.heartbeat * 2
        try:
            await self.ws.send_bytes(welcome)
            relays.tell(self.node, record(READY, self.conn, 0))
            while not self.closed:
                msg = await asyncio.wait_for(self.ws.receive(), silent)
                if msg["type"] == "websocket.disconnect" or self.closed:
                    break
                data = msg.get("bytes")
                if data is None:
                    data = b""  # a text frame: the home answers it with GOODBYE 1
                while not self.ins.room and not self.closed:
                    # the home is behind on this client's frames: so is the read
                    self._room.clear()
                    await asyncio.wait_for(self._room.wait(), relays.ask_timeout)
                if self.closed:
                    break
                if not self._answered(data):
                    relays.tell(self.node, record(IN, self.conn, self.ins.send(), bytes(data)))
        except (WebSocketDisconnect, asyncio.TimeoutError):
            pass
        finally:
            self.closed = True
            relays.tell(self.node, record(GONE, self.conn, 0))
            writer = self._writer
            if writer is not None:  # a CLOSE under way finishes (bounded by CLOSE_WAIT)
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(writer), CLOSE_WAIT + 2.0)

    def _answered(self, data: bytes) -> bool:
        """Whether ``data`` was a frame of PINGs answered here (see the module's docstring)."""
        direct = self.direct
        if self.ins.outstanding or self.queue or self._writer is not None or direct is None:
            return False
        try:
            msgs = decode_frame(data)
        except Exception:  # bad input: the home says so, by the rules
            return False
        if not msgs or not all(type(m) is Ping for m in msgs):
            return False
        if not direct.write(encode_frame([Pong(m.token) for m in msgs if type(m) is Ping])):
            return False
        direct.outbox.flush()  # not inside a cycle, which would flush it at its end
        return True

    # what the home tells

    def frame(self, n: int, body: bytes) -> None:
        """Frame ``n`` for the client."""
        if self.closed:
            return
        if not self.frames.take(n):
            self.fail(1013, "try again: frames were lost between the servers")
            return
        if not self.queue and self._writer is None:
            direct = self.direct
            if direct is not None and direct.write(body):
                self.relays.acked(self, n)
                return
        self.queue.append((n, body))
        self._write()

    def handled(self, n: int) -> None:
        """The home handled the client's frames up to ``n``."""
        try:
            self.ins.ack(n)
        except ValueError:
            self.fail(1013, "try again: the session's server is out of step")
            return
        self._room.set()

    def close(self, code: int, reason: str, last: bytes = b"") -> None:
        """The home's CLOSE: after the frames before it, then ``last`` (a GOODBYE or none),
        within ``CLOSE_WAIT``."""
        if self._closing is not None:
            return
        self.closed = True
        self._room.set()
        self._closing = c = Closing(code, reason, last)
        self.queue.append(c)
        self._write()
        asyncio.get_running_loop().call_later(CLOSE_WAIT, self._force, c)

    def fail(self, code: int, reason: str) -> None:
        """End now, dropping what waits (the stream broke, or this node stops): the client
        resumes and is sent what it missed again."""
        if self._failed:
            return
        self._failed = True
        self.queue.clear()
        if self._writer is not None:
            self._writer.cancel()
            self._writer = None
        self._closing = None  # a CLOSE queued before is dropped with the frames
        self.close(code, reason)

    def _force(self, c: Closing) -> None:
        """A CLOSE not written within ``CLOSE_WAIT`` (a client that reads nothing): without
        the frames before it."""
        if self._closing is c and self.queue:
            self.fail(c.code, c.reason)

    # writing

    def _write(self) -> None:
        if self._writer is None:
            self._writer = self.relays.spawn(self._writing())

    async def _writing(self) -> None:
        ws = self.ws
        try:
            while self.queue:
                item = self.queue[0]
                if isinstance(item, Closing):
                    await self._close_socket(item)
                    return
                n, body = item
                await ws.send_bytes(body)
                self.queue.popleft()
                self.relays.acked(self, n)
        except Exception:  # the socket is gone: the reader sees it and tells the home
            self.closed = True
            self.queue.clear()
        finally:
            if self._writer is asyncio.current_task():
                self._writer = None

    async def _close_socket(self, c: Closing) -> None:
        self.queue.clear()  # the CLOSE itself: nothing is queued behind it
        with contextlib.suppress(Exception):
            if c.last:
                await asyncio.wait_for(self.ws.send_bytes(c.last), CLOSE_WAIT)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(c.code, c.reason[:120]), CLOSE_WAIT)
