"""A WebSocket that resumes a session of another node, relayed to it through Redis.

With several nodes, a client whose connection dropped may reconnect to any of them. When its
HELLO resumes a session that lives on another node (a session id names its node), the node it
reached (the *entry*) does not take the session over: it asks the session's node (the
*home*) to resume it there and then carries the frames both ways. The session stays whole
(subscriptions, ring cursors, private messages not yet acknowledged) and its frames take one
more hop each way (two Redis messages a frame). The next reconnection may go home directly.

On the home node the session's ``FrameSink`` is a ``RemoteSink``: one frame in flight at a
time, as a WebSocket, sent with ``ws.out`` and done when the entry has written it to the
socket, so a slow client holds back its session exactly as on its own node; a client that
blocks a write past ``WriterConfig.max_blocked`` is cut. On the entry node a ``Relay`` reads
the client's frames and hands each to the home with ``ws.in``, in order. Requests between the
two (``NodeLink.ask``):

- ``ws.open`` (entry to home): the HELLO frame; the answer is the WELCOME, or 404 when the home
  does not hold the session (the entry then opens a new one itself).
- ``ws.ready`` (entry to home): the WELCOME is written; frames may follow.
- ``ws.in`` (entry to home): a client frame.
- ``ws.gone`` (entry to home): the client's connection ended; the session waits for a resume.
- ``ws.out`` (home to entry): a frame to write, answered once written.
- ``ws.close`` (home to entry): close the connection (after GOODBYE, or the session resumed
  elsewhere).

If the home node dies, the entry's next request fails at once (``NodeGone``) and it closes the
connection (1012): the client reconnects and, its session gone with its node, starts a new one.
A home that does not answer and has not beat for longer than a session outlives its connection
(``Timing.session_timeout``) is gone too: a crashed host, whose subscriber connection Redis may
keep for minutes. A ``ws.open`` that fails for another reason (Redis unreachable, no free
connection to it, a home that beat lately and did not answer in time: stalled or paused) opens
nothing: the entry closes the connection with 1013 (try again later) and the client, keeping
its session, resumes at its next attempt (``HomeUnreachable``). A new session there would
abandon the one the home still holds, and with it the private messages it was sent meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Coroutine
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from ..cluster.nodes import Head, NodeGone, NodeLink, NoReply
from ..engine.buffers import FrameBuffer
from ..engine.session import Session, SessionState
from ..errors import BrokerUnavailable, ProtocolError
from .gateway import CLOSE_CODES, Gateway

log = logging.getLogger("rubris_asgi")

OPEN, READY, IN, GONE, OUT, CLOSE = (
    "ws.open",
    "ws.ready",
    "ws.in",
    "ws.gone",
    "ws.out",
    "ws.close",
)
ASK_TIMEOUT = 10.0
"""Seconds a request between the two nodes may take (a frame's write has its own bound)."""
FAILED = (NodeGone, BrokerUnavailable, asyncio.TimeoutError, RuntimeError)
"""What a request to the other node raises when it cannot be done."""


class HomeUnreachable(Exception):
    """The session's node could not be asked to resume it now, and may well hold it still:
    the connection is closed with 1013 so the client tries again, its session kept."""


class Relays:
    """One node's relayed WebSockets, both ends: those it carries for other nodes' sessions
    (``Relay``) and its sessions carried by other nodes (``RemoteSink``)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.entries: dict[str, Relay] = {}
        """Connections this node carries for another node, by connection id."""
        self.homes: dict[str, RemoteSink] = {}
        """Sessions of this node carried by another, by session id."""
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def nodes(self) -> NodeLink:
        return self.gateway.nodes

    def serve(self) -> None:
        """Answer the requests of the other nodes (both ends)."""
        b = self.nodes
        b.on(OPEN, self._open)
        b.on(READY, self._ready)
        b.on(IN, self._in)
        b.on(GONE, self._gone)
        b.on(OUT, self._out)
        b.on(CLOSE, self._close)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def ask(self, node: str, op: str, head: Head, body: bytes = b"") -> Head:
        reply, _ = await self.nodes.ask(node, op, head, body, ASK_TIMEOUT)
        return reply

    # the entry's side

    async def carry(self, ws: WebSocket, node: str, frame: bytes, owner_tag: str) -> bool:
        """Carry ``ws`` for the session its HELLO (``frame``) resumes on ``node``. False when
        that node does not hold it, or is gone (nothing was sent on ``ws``): the caller opens a
        session. Raises ``HomeUnreachable`` when it could not be asked (nothing sent either)."""
        conn = f"{self.nodes.node}:{next(self._ids)}"
        head = {"key": owner_tag, "via": self.nodes.node, "conn": conn}
        try:
            reply, welcome = await self.nodes.ask(node, OPEN, head, frame, ASK_TIMEOUT)
        except NodeGone:
            return False
        except NoReply as exc:
            # received and not answered: stalled, paused, or dead with its subscriber connection
            # not yet dropped by Redis (a crashed host: minutes, until TCP keepalive). Silent for
            # longer than a session outlives its connection, its sessions are gone either way
            if await self._silent(node):
                return False
            raise HomeUnreachable(f"the session's node did not answer: {exc}") from exc
        except FAILED as exc:
            raise HomeUnreachable(f"the session's node cannot be reached now: {exc}") from exc
        if reply.get("status") != 200:
            return False
        relay = Relay(self, ws, node, conn, str(reply["sid"]))
        self.entries[conn] = relay
        try:
            await relay.run(welcome)
        finally:
            self.entries.pop(conn, None)
        return True

    async def _silent(self, node: str) -> bool:
        try:
            return await self.nodes.silent(node, self.gateway.config.timing.session_timeout)
        except Exception:  # Redis away: nothing known; the client tries again
            return False

    async def _out(self, head: Head, body: bytes) -> tuple[Head, bytes]:
        relay = self.entries.get(str(head.get("conn")))
        if relay is None or relay.closed:
            return {"gone": 1}, b""
        try:
            await relay.ws.send_bytes(body)
        except Exception:  # the socket is gone: the reader sees it and says so
            return {"gone": 1}, b""
        return {}, b""

    async def _close(self, head: Head, body: bytes) -> tuple[Head, bytes]:
        relay = self.entries.get(str(head.get("conn")))
        if relay is not None:
            await relay.close(int(head.get("code", 1000)), str(head.get("reason", "")))
        return {}, b""

    async def close_entries(self, code: int, reason: str) -> None:
        """Close every connection carried for another node (this node shuts down: the clients
        reconnect elsewhere, their sessions untouched)."""
        for relay in list(self.entries.values()):
            await relay.close(code, reason)

    # the home's side

    async def _open(self, head: Head, body: bytes) -> tuple[Head, bytes]:
        gateway = self.gateway
        msgs = gateway.decode_client_frame(body)
        s = gateway.resume(msgs, str(head.get("key")))
        if s is None:
            return {"status": 404}, b""
        s.transport = "websocket"
        sink = RemoteSink(self, s, str(head["via"]), str(head["conn"]))
        self.homes[s.id] = sink
        gateway.engine.attach(s, sink, ready=False)  # until the WELCOME is written
        await gateway.dispatcher.handle_first(s, msgs[1:])
        return {"status": 200, "sid": s.id}, gateway.welcome(s, True)

    def _sink(self, head: Head) -> RemoteSink | None:
        sink = self.homes.get(str(head.get("sid")))
        if sink is None or sink.conn != head.get("conn") or sink.session.sink is not sink:
            return None
        return sink

    async def _ready(self, head: Head, body: bytes) -> tuple[Head, bytes]:
        sink = self._sink(head)
        if sink is None:
            return {"gone": 1}, b""
        self.gateway.engine.set_ready(sink.session)
        return {}, b""

    async def _in(self, head: Head, body: bytes) -> tuple[Head, bytes]:
        sink = self._sink(head)
        if sink is None:
            return {"gone": 1}, b""
        s = sink.session
        gateway = self.gateway
        try:
            await gateway.dispatcher.handle(s, gateway.decode_client_frame(body))
        except ProtocolError as exc:  # bad input: GOODBYE, then the entry closes
            gateway.engine.close_session(s, exc.code, str(exc))
        return {}, b""

    async def _gone(self, head: Head, body: bytes) -> tuple[Head, bytes]:
        sink = self._sink(head)
        if sink is not None:
            sink.lost()
        return {}, b""

    def session_ended(self, s: Session) -> None:
        sink = self.homes.pop(s.id, None)
        if sink is not None and not sink.closed:
            sink.closed = True
            self.spawn(sink.tell_close(1000, "session ended"))


class Relay:
    """The entry's end of a relayed connection: the client's socket and the home's session."""

    def __init__(self, relays: Relays, ws: WebSocket, node: str, conn: str, sid: str) -> None:
        self.relays = relays
        self.ws = ws
        self.node = node
        self.conn = conn
        self.sid = sid
        self.closed = False

    async def run(self, welcome: bytes) -> None:
        relays = self.relays
        head = {"sid": self.sid, "conn": self.conn}
        timeout = relays.gateway.config.timing.heartbeat * 2
        try:
            await self.ws.send_bytes(welcome)
            await relays.ask(self.node, READY, head)
            while not self.closed:
                msg = await asyncio.wait_for(self.ws.receive(), timeout)
                if msg["type"] == "websocket.disconnect":
                    break
                data = msg.get("bytes")
                if data is None:
                    data = b""  # a text frame: the home answers it with GOODBYE 1
                reply = await relays.ask(self.node, IN, head, bytes(data))
                if reply.get("gone"):
                    await self.close(1000, "session ended")
        except (WebSocketDisconnect, asyncio.TimeoutError):
            pass
        except FAILED as exc:  # the home is gone: the client reconnects and starts anew
            log.info("relay of %s ends: %s", self.sid[:12], exc)
            await self.close(1012, "its server is gone")
            return
        finally:
            self.closed = True
        with contextlib.suppress(*FAILED):
            await relays.ask(self.node, GONE, head)

    async def close(self, code: int, reason: str) -> None:
        self.closed = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(code, reason[:120]), 2.0)


class RemoteSink:
    """The home's ``FrameSink`` for a session carried by another node's ``Relay``."""

    def __init__(self, relays: Relays, session: Session, via: str, conn: str) -> None:
        self.relays = relays
        self.session = session
        self.via = via
        self.conn = conn
        self.closed = False
        self.writing_since = 0.0

    def write_now(self, frame: bytes) -> bool:
        return False  # through another node: always a write under way

    def send_frame(self, frame: bytes, lease: FrameBuffer) -> None:
        self.relays.spawn(self._write(frame, lease))

    async def _write(self, frame: bytes, lease: FrameBuffer) -> None:
        relays = self.relays
        engine = relays.gateway.engine
        s = self.session
        self.writing_since = engine.clock()
        limit = relays.gateway.config.writer.max_blocked
        gone = blocked = False
        try:
            reply, _ = await relays.nodes.ask(self.via, OUT, {"conn": self.conn}, frame, limit)
            gone = bool(reply.get("gone"))
        except asyncio.TimeoutError:
            blocked = True  # the client has not taken the frame for max_blocked
        except FAILED:
            gone = True
        finally:
            self.writing_since = 0.0
        if s.sink is not self:  # superseded or ended meanwhile
            engine.pool.release(lease)
            return
        if gone or blocked:
            engine.pool.release(lease)
            if gone:
                self.lost()
                return
            engine.telemetry.closed_blocked += 1
            self.closed = True
            relays.spawn(self.tell_close(1013, "slow consumer"))
            engine.end_session(s)
            return
        engine.frame_done(s, lease)
        if s.state is SessionState.CLOSING and not s.has_work():
            # the GOODBYE has gone out: nothing follows it
            self.closed = True
            relays.spawn(self.tell_close(CLOSE_CODES.get(s.close_code, 1000), "goodbye"))
            engine.end_session(s)

    def lost(self) -> None:
        """The client's connection ended: the session waits for a resume."""
        s = self.session
        if s.sink is self:
            self.closed = True
            self.relays.homes.pop(s.id, None)
            if s.state is SessionState.CONNECTED:
                self.relays.gateway.engine.detach(s)

    def superseded(self) -> None:
        """A newer connection resumed the session: the entry closes this one."""
        self.closed = True
        self.relays.homes.pop(self.session.id, None)
        self.relays.spawn(self.tell_close(1000, "resumed elsewhere"))

    async def tell_close(self, code: int, reason: str) -> None:
        with contextlib.suppress(*FAILED):
            await self.relays.ask(
                self.via, CLOSE, {"conn": self.conn, "code": code, "reason": reason}
            )
