"""The WebSocket transport at ``{mount}/ws`` (protocol.md section 6).

One connection runs two loops: a reader that decodes client frames and hands them to the
dispatcher, and a writer that writes the frames the scheduler gives it. The scheduler never
awaits a socket: ``send_frame`` only parks the frame and wakes the writer, and the session stays
not-READY until the write completes, so a slow socket holds back its own session and nothing
else. A write that takes longer than ``blocked_after`` is a blocked write and earns the
progressive penalty (flow.py); one still stuck after ``max_blocked`` ends the session with
GOODBYE 7 (the housekeeping task in app.py watches for that).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from ..buffers import FrameBuffer
from ..errors import ErrorCode, ProtocolError
from ..flow import on_write_done
from ..protocol import SUBPROTOCOL, Goodbye, encode
from ..session import Session, SessionState
from .common import CLOSE_CODES, decode_client_frame, open_or_resume, welcome

if TYPE_CHECKING:
    from ..app import Rubris

log = logging.getLogger("rubris_asgi")


class WebSocketConnection:
    """One WebSocket bound to a session; the session's ``FrameSink`` while connected."""

    def __init__(self, rubris: Rubris, ws: WebSocket) -> None:
        self.rubris = rubris
        self.ws = ws
        self.session: Session | None = None
        self._frame: tuple[bytes, FrameBuffer] | None = None
        self._wake = asyncio.Event()
        self._close: tuple[bytes, int] | None = None
        self.writing_since = 0.0
        self.closed = False

    # FrameSink

    def send_frame(self, frame: bytes, lease: FrameBuffer) -> None:
        self._frame = (frame, lease)
        self._wake.set()

    # control

    def close(self, code: int, reason: str) -> None:
        """Send GOODBYE after the frame being written (if any), then close the socket."""
        if self._close is None:
            self._close = (encode(Goodbye(code, reason)), CLOSE_CODES.get(code, 1000))
            self._wake.set()

    async def run(self) -> None:
        rubris = self.rubris
        ws = self.ws
        if not rubris.origin_allowed(ws.headers.get("origin"), ws.headers.get("host")):
            await ws.close(1008, "origin not allowed")  # before accept: the handshake gets 403
            return
        try:
            user = await rubris.authenticate(ws)
        except ProtocolError as exc:
            await ws.close(CLOSE_CODES.get(exc.code, 1008), str(exc)[:120])
            return
        offered = ws.scope.get("subprotocols") or []
        await ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        try:
            await self._handshake(user)
        except (WebSocketDisconnect, asyncio.TimeoutError):
            return
        except ProtocolError as exc:
            await self._goodbye_now(exc.code, str(exc))
            return
        assert self.session is not None
        writer = asyncio.get_running_loop().create_task(self._writer())
        try:
            await self._reader()
        except ProtocolError as exc:
            self.close(exc.code, str(exc))
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(writer), 2.0)
        finally:
            self.closed = True
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await writer
            self._release()
            s = self.session
            if s.sink is self:
                if s.state is SessionState.CONNECTED:
                    rubris.engine.detach(s)
                else:
                    rubris.end_session(s)

    async def _handshake(self, user: Any) -> None:
        rubris = self.rubris
        timeout = rubris.config.timing.heartbeat * 2
        msg = await asyncio.wait_for(self.ws.receive(), timeout)
        msgs = decode_client_frame(rubris, self._frame_bytes(msg))
        s, resumed = open_or_resume(rubris, msgs, user)
        old = s.sink
        if isinstance(old, WebSocketConnection) and old is not self:
            old.superseded()
        self.session = s
        await self.ws.send_bytes(welcome(rubris, s, resumed))
        rubris.engine.attach(s, self)
        rubris.connections.add(self)
        await rubris.dispatcher.handle(s, msgs[1:])

    def superseded(self) -> None:
        """A newer connection resumed this session: this one stops carrying it."""
        self._release()
        self.closed = True
        self._wake.set()
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().create_task(self.ws.close(1000, "resumed elsewhere"))

    def _frame_bytes(self, msg: Any) -> bytes:
        if msg["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(msg.get("code", 1000))
        data = msg.get("bytes")
        if data is None:
            raise ProtocolError("text frames are not part of the protocol", ErrorCode.PROTOCOL)
        return bytes(data)

    async def _reader(self) -> None:
        rubris = self.rubris
        s = self.session
        assert s is not None
        timeout = rubris.config.timing.heartbeat * 2
        receive = self.ws.receive
        while not self.closed:
            try:
                msg = await asyncio.wait_for(receive(), timeout)
            except asyncio.TimeoutError:
                # silent for twice the heartbeat: the peer is gone; the session waits to resume
                await self._close_socket(1000, "heartbeat timeout")
                return
            if msg["type"] == "websocket.disconnect":
                return
            msgs = decode_client_frame(rubris, self._frame_bytes(msg))
            await rubris.dispatcher.handle(s, msgs)
            if s.state is SessionState.CLOSED:
                return

    async def _writer(self) -> None:
        s = self.session
        assert s is not None
        rubris = self.rubris
        engine = rubris.engine
        clock = engine.clock
        send = self.ws.send_bytes
        wake = self._wake
        while True:
            await wake.wait()
            wake.clear()
            item = self._frame
            if item is not None:
                self._frame = None
                frame, lease = item
                started = clock()
                self.writing_since = started
                await send(frame)
                self.writing_since = 0.0
                now = clock()
                pause = on_write_done(s, started, now, rubris.config.writer)
                if pause:
                    engine.scheduler.hold(s, now + pause)
                if self.closed:
                    engine.pool.release(lease)
                    return
                engine.frame_done(s, lease)
                if s.state is SessionState.CLOSING and not s.has_work():
                    # the GOODBYE queued by close_session has gone out
                    await self._close_socket(CLOSE_CODES.get(s.close_code, 1000), "goodbye")
                    return
            if self._close is not None:
                goodbye, code = self._close
                with contextlib.suppress(Exception):
                    await send(goodbye)
                await self._close_socket(code, "goodbye")
                return

    async def _goodbye_now(self, code: int, reason: str) -> None:
        with contextlib.suppress(Exception):
            await self.ws.send_bytes(encode(Goodbye(code, reason)))
        await self._close_socket(CLOSE_CODES.get(code, 1002), reason)

    async def _close_socket(self, code: int, reason: str) -> None:
        self.closed = True
        self.rubris.connections.discard(self)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(code, reason[:120]), 2.0)

    def _release(self) -> None:
        item, self._frame = self._frame, None
        if item is not None:
            self.rubris.engine.pool.release(item[1])

    async def abort(self, code: int, reason: str) -> None:
        """End a connection whose writes are stuck: no GOODBYE can get through a full socket."""
        self.closed = True
        self._wake.set()
        await self._close_socket(CLOSE_CODES.get(code, 1013), reason)


async def websocket_endpoint(rubris: Rubris, ws: WebSocket) -> None:
    conn = WebSocketConnection(rubris, ws)
    try:
        await conn.run()
    finally:
        rubris.connections.discard(conn)
