"""The WebSocket transport at ``{mount}/ws`` (protocol.md section 6).

Writing without awaiting: the scheduler hands a frame to ``send_frame`` and moves on. The ASGI
``send`` coroutine is driven by hand: with room in the socket buffer the server writes at once and
the coroutine finishes on its first step, with no task, future or wake-up per frame (these add
up to most of the per-frame cost and feed the garbage collector). When the send suspends,
done-callbacks step it to its end as a Task would, without a task: under uvicorn or hypercorn
that happens when the socket is full, the *blocked write* of the large-messages source document;
under granian every write completes later, on its Rust threads. Until the write completes the
session is not READY, so a slow socket holds back its own session and nothing else. A write that
takes longer than ``blocked_after`` earns the progressive penalty (flow.py); one still stuck
after ``max_blocked`` ends the session with GOODBYE 7 (:meth:`WebSocketTransport.close_blocked`,
run by the app's housekeeping).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from asyncio import Future
from collections.abc import Coroutine
from types import CoroutineType
from typing import Any

from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from ..engine.buffers import FrameBuffer
from ..engine.flow import on_write_done
from ..engine.session import Session, SessionState
from ..errors import ErrorCode, ProtocolError
from ..protocol import SUBPROTOCOL, Goodbye, encode
from .direct import DirectSocket, Outbox, direct_socket
from .gateway import CLOSE_CODES, Gateway, client_address, resumed_id
from .refusals import refuse
from .relay import HomeUnreachable, Relays

log = logging.getLogger("rubris_asgi")


class WebSocketTransport:
    """The ASGI app behind ``{mount}/ws`` and the set of its live connections.

    Raw ASGI rather than a Starlette endpoint, so that frames can use the raw ``send``.
    """

    def __init__(self, gateway: Gateway, relays: Relays | None = None) -> None:
        self.gateway = gateway
        self.connections: set[WebSocketConnection] = set()
        self.relays = relays
        """With several nodes: connections that resume another node's session are carried
        to it."""
        self.silent_checked = 0.0
        """When :meth:`close_silent` last walked the connections."""
        self.direct = gateway.config.writer.direct_writes
        self.writing: dict[WebSocketConnection, None] = {}
        """The connections with a write under way, which :meth:`close_blocked` looks at (a walk
        of every connection four times a second was 4 % of a core at 10,000 connections)."""
        self.outbox = Outbox()
        """The cycle's direct writes, written together (server/direct.py): the scheduler's
        loop flushes it at each cycle's end."""

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Coroutine[Any, Any, None]:
        # not async: the connection's own coroutine is what the server awaits, one frame less
        # suspended under each connection
        return WebSocketConnection(self, scope, receive, send).run()

    async def close_blocked(self, now: float) -> None:
        """End the sessions whose frame has been stuck in the socket for ``max_blocked``."""
        limit = self.gateway.config.writer.max_blocked
        for conn in list(self.writing):
            since = conn.writing_since
            s = conn.session
            if since and now - since > limit and s is not None:
                log.info("session %s blocked for %.1fs: closing", s.id[:8], now - since)
                self.gateway.engine.telemetry.closed_blocked += 1
                await conn.abort(ErrorCode.SLOW_CONSUMER, "slow consumer", goodbye=True)
                self.gateway.engine.end_session(s)
        if self.relays is not None:  # and those carried by another node, and their links
            self.relays.upkeep(now)

    def close_silent(self, now: float) -> None:
        """Close the connections nothing was heard from for twice the heartbeat (the peer is
        gone); their sessions wait for a resume. A sweep, not a timeout per receive: a
        ``wait_for`` around each ``receive`` keeps a task, a future and a timer per idle
        connection (1.8 KB of its memory)."""
        heartbeat = self.gateway.config.timing.heartbeat
        if now < self.silent_checked + heartbeat / 4:
            return  # a walk of every connection: a few times a heartbeat is enough
        self.silent_checked = now
        limit = heartbeat * 2
        for conn in list(self.connections):
            if not conn.closed and now - conn.heard > limit:
                conn.fell_silent()

    async def reauthenticate(self) -> int:
        """Ask ``authenticate`` again about each connected session's user, with the request
        that opened its connection (``Timing.reauthenticate``): a ``Reject``, or another
        user than the session's, ends the session with GOODBYE 4. Returns how many ended.
        One connection after the other, so a slow hook is never called for thousands at
        once; a hook that fails otherwise (a bug) is logged and leaves the session be."""
        gateway = self.gateway
        ended = 0
        for conn in list(self.connections):
            s = conn.session
            if conn.closed or s is None or s.state is not SessionState.CONNECTED:
                continue
            try:
                user = await gateway.authenticate(conn.ws)
            except ProtocolError as exc:
                reason = str(exc)
            except Exception:
                log.exception("authenticate failed while checking session %s…", s.id[:8])
                continue
            else:
                if gateway.user_key(user) == s.owner:
                    continue
                reason = "no longer authenticated as this session's user"
            if s.state is SessionState.CONNECTED:
                gateway.engine.close_session(s, ErrorCode.NOT_AUTHORISED, reason)
                ended += 1
        return ended

    async def abort_all(self, code: int, reason: str) -> None:
        """GOODBYE ``code`` and close every connection, without waiting on their sockets."""
        for conn in list(self.connections):
            await conn.abort(code, reason, goodbye=True)


class WebSocketConnection:
    """One WebSocket bound to a session; the session's ``FrameSink`` while connected."""

    __slots__ = (
        "transport",
        "gateway",
        "ws",
        "_send",
        "session",
        "writing_since",
        "closed",
        "_tasks",
        "_w_send",
        "_w_coro",
        "_w_lease",
        "_w_pending",
        "_w_done",
        "_w_slice",
        "_resume_cb",
        "_receive",
        "_direct",
        "heard",
    )

    def __init__(
        self, transport: WebSocketTransport, scope: Scope, receive: Receive, send: Send
    ) -> None:
        self.transport = transport
        self.gateway = transport.gateway
        self.ws = WebSocket(scope, receive, send)
        self._send = send  # the raw ASGI send: frames skip Starlette's per-call state checks
        self._receive = receive  # the server's own, where it tells which server this is
        self._direct: DirectSocket | None = None
        """The socket written to without ``send`` (server/direct.py), once accepted."""
        self.heard = self.gateway.engine.clock()
        """When a frame last came from the client (the engine's clock); its start at first."""
        self.session: Session | None = None
        self.writing_since = 0.0
        """When the write under way began, if one did not finish at once; else 0."""
        self.closed = False
        self._tasks: set[asyncio.Task[None]] | None = None  # made by the first _spawn
        # the write under way, if it did not finish at once: the send being stepped (a
        # coroutine, or a future's __await__ iterator), its lease, what it waits on, and a
        # future for whoever awaits the end (made only when asked: ``writing``). Kept here,
        # not in per-write objects: under granian every write is under way for a while, a
        # thousand of them at once outlive young garbage collections and make old ones costly
        self._w_send: Any = None
        self._w_coro = False
        self._w_lease: FrameBuffer | None = None
        self._w_pending: Any = None
        self._w_done: Future[None] | None = None
        self._w_slice = -1
        """The scheduler's slice of an asynchronous write under way (else -1)."""
        self._resume_cb = self._resume_write  # one bound method for every callback

    # FrameSink: called from inside the scheduler's cycle, so it must never raise or await

    def write_now(self, frame: bytes) -> bool:
        """Under uvicorn, the frame's prepared bytes straight to the socket when its ``send``
        would write at once (server/direct.py); False elsewhere and otherwise."""
        direct = self._direct
        if direct is None or self.closed or not direct.write(frame):
            return False
        s = self.session
        if s is not None and s.state is SessionState.CLOSING:
            self._after_write(s)
        return True

    def send_frame(self, frame: bytes, lease: FrameBuffer) -> None:
        engine = self.gateway.engine
        s = self.session
        if self.closed or s is None:
            engine.pool.release(lease)
            return
        aw = self._send({"type": "websocket.send", "bytes": frame})
        coro = type(aw) is CoroutineType  # not isinstance: an ABC check per frame adds up
        # a coroutine steps with send(None); a server whose send is a future (granian), or
        # another awaitable, through its __await__ iterator
        it: Any = aw if coro else aw.__await__()
        try:
            pending = it.send(None) if coro else next(it)
        except StopIteration:
            engine.frame_done(s, lease)  # written at once: the common case
            self._after_write(s)
            return
        except Exception:  # the peer is gone; the reader sees the disconnect and detaches
            engine.pool.release(lease)
            self.closed = True
            return
        # not written yet: callbacks carry the send to its end, as a Task would, without one
        if isinstance(pending, asyncio.Future):
            # the server waits on its own loop: its socket buffer is full
            engine.telemetry.blocked_writes += 1
        else:  # the server's own threads write it (granian): one of the cycle's window
            self._w_slice = engine.scheduler.write_started()
        self.writing_since = engine.clock()
        self.transport.writing[self] = None
        self._w_send = it
        self._w_coro = coro
        self._w_lease = lease
        self._wait_on(pending)

    @property
    def writing(self) -> Future[None] | None:
        """None, or a future resolved when the write under way ends (made when asked)."""
        if self._w_lease is None:
            return None
        if self._w_done is None:
            self._w_done = asyncio.get_running_loop().create_future()
        return self._w_done

    def _wait_on(self, pending: Any) -> None:
        self._w_pending = pending
        if pending is None:  # a bare yield (asyncio.sleep(0)): step again soon
            asyncio.get_running_loop().call_soon(self._resume_cb, None)
        else:
            pending.add_done_callback(self._resume_cb)

    def _resume_write(self, fut: Any) -> None:
        if fut is not self._w_pending or self._w_lease is None:
            return  # a write given up (the connection ended)
        it = self._w_send
        try:
            pending = it.send(None) if self._w_coro else next(it)
        except StopIteration:
            self._write_ended(True)
        except Exception:
            self._write_ended(False)
        else:
            self._wait_on(pending)

    def _write_ended(self, ok: bool) -> None:
        """The write under way has ended: written, failed, or given up (``ok`` False)."""
        engine = self.gateway.engine
        lease = self._w_lease
        assert lease is not None
        started = self.writing_since
        self.writing_since = 0.0
        self.transport.writing.pop(self, None)
        self._w_send = self._w_pending = self._w_lease = None
        if self._w_slice >= 0:
            engine.scheduler.write_settled(self._w_slice)
            self._w_slice = -1
        done, self._w_done = self._w_done, None
        if done is not None and not done.done():
            done.set_result(None)
        if not ok:
            engine.pool.release(lease)
            self.closed = True
            return
        s = self.session
        assert s is not None
        now = engine.clock()
        writer = self.gateway.config.writer
        pause = on_write_done(s, started, now, writer)
        if now - started >= writer.blocked_after:
            engine.telemetry.failed_sends += 1
        if pause:
            engine.telemetry.penalty_seconds += pause
            engine.scheduler.hold(s, now + pause)
        if self.closed:
            engine.pool.release(lease)
            return
        engine.frame_done(s, lease)
        self._after_write(s)

    def _give_up_write(self) -> None:
        """Stop carrying the write under way (the connection is ending); its lease returns."""
        if self._w_lease is None:
            return
        send, coro = self._w_send, self._w_coro
        self._write_ended(False)
        if coro:
            with contextlib.suppress(Exception):
                send.close()  # the server's send coroutine ends where it waited

    def _after_write(self, s: Session) -> None:
        if s.state is SessionState.CLOSING and not s.has_work():
            # the GOODBYE queued by close_session has gone out: nothing follows it
            self.closed = True
            self._spawn(self._close_socket(CLOSE_CODES.get(s.close_code, 1000), "goodbye"))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        if self._tasks is None:
            self._tasks = set()
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # the connection's life

    async def run(self) -> None:
        gateway = self.gateway
        ws = self.ws
        origin, host = ws.headers.get("origin"), ws.headers.get("host")
        if origin is not None and not gateway.origin_allowed(origin, host):
            await refuse(ws, 403, 1008, gateway.origin_refused(origin, host))
            return
        try:
            user = await gateway.authenticate(ws)
        except ProtocolError as exc:
            status = 403 if exc.code == ErrorCode.NOT_AUTHORISED else 400
            await refuse(ws, status, CLOSE_CODES.get(exc.code, 1008), str(exc))
            return
        offered = ws.scope.get("subprotocols") or []
        await ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        if self.transport.direct:
            self._direct = direct_socket(self._receive, self.transport.outbox)
        refused = False
        try:
            s = await self._handshake(user)
            if s is not None:
                # the reader, here rather than in a coroutine of its own, and on the server's
                # receive rather than Starlette's: two frames fewer suspended under each
                # connection. A silent peer is closed by the sweep (close_silent).
                clock = gateway.engine.clock
                receive = self._receive
                handle = gateway.dispatcher.handle
                spend = gateway.dispatcher.spend
                pay = gateway.dispatcher.pay
                while not self.closed:
                    msg = await receive()
                    if msg["type"] == "websocket.disconnect" or self.closed:
                        break
                    self.heard = clock()
                    frame = self._frame_bytes(msg)
                    spend(s, len(frame))
                    await handle(s, gateway.decode_client_frame(frame))
                    if s.state is SessionState.CLOSED:
                        break
                    await pay(s)  # over its input budget: not read again until paid
        except (WebSocketDisconnect, asyncio.TimeoutError):
            pass
        except HomeUnreachable as exc:  # no session here: the client tries again, resuming
            await self._close_socket(1013, f"try again later: {exc}")
        except ProtocolError as exc:
            refused = True  # GOODBYE ends the session: it is not left waiting for a resume
            await self._goodbye(exc.code, str(exc))
        finally:
            self.closed = True
            self.transport.connections.discard(self)
            self._give_up_write()
            for task in list(self._tasks or ()):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            s = self.session
            if s is not None and s.sink is self:
                if s.state is SessionState.CONNECTED and not refused:
                    gateway.engine.detach(s)
                else:
                    gateway.engine.end_session(s)

    async def _handshake(self, user: Any) -> Session | None:
        """HELLO to WELCOME: the session; None when the connection was carried for another
        node's session (relay.py) and is over."""
        gateway = self.gateway
        msg = await asyncio.wait_for(self.ws.receive(), gateway.config.timing.heartbeat * 2)
        frame = self._frame_bytes(msg)
        msgs = gateway.decode_client_frame(frame)
        relays = self.transport.relays
        home = gateway.nodes.home_of(resumed_id(msgs))
        if home and relays is not None:
            if await relays.carry(self.ws, self._direct, home, frame, gateway.owner_tag(user)):
                return None
        s, resumed = gateway.open_or_resume(msgs, user, client_address(self.ws))
        s.transport = "websocket"
        self.session = s
        await self.ws.send_bytes(gateway.welcome(s, resumed))
        gateway.engine.attach(s, self)
        self.heard = gateway.engine.clock()
        self.transport.connections.add(self)
        gateway.dispatcher.spend(s, len(frame))  # the first frame counts as any other
        await gateway.dispatcher.handle_first(s, msgs[1:])
        return s

    def _frame_bytes(self, msg: Any) -> bytes:
        if msg["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(msg.get("code", 1000))
        data = msg.get("bytes")
        if data is None:
            raise ProtocolError("text frames are not part of the protocol", ErrorCode.PROTOCOL)
        return bytes(data)

    # closing

    def fell_silent(self) -> None:
        """Nothing heard for twice the heartbeat: close with 1000; the session waits for a
        resume (detached now: the server may report the disconnect only later)."""
        self.closed = True
        self._spawn(self._close_socket(1000, "heartbeat timeout"))
        s = self.session
        if s is not None and s.sink is self and s.state is SessionState.CONNECTED:
            self.gateway.engine.detach(s)

    def superseded(self) -> None:
        """A newer connection resumed this session: this one stops carrying it."""
        self.closed = True
        self._give_up_write()
        self._spawn(self._close_socket(1000, "resumed elsewhere"))

    async def _goodbye(self, code: int, reason: str) -> None:
        """GOODBYE and close, after the frame being written (bad input from this client)."""
        self.closed = True
        self.gateway.engine.telemetry.error("goodbye", code)
        writing = self.writing
        if writing is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(writing), 2.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.send_bytes(encode(Goodbye(code, reason))), 2.0)
        await self._close_socket(CLOSE_CODES.get(code, 1002), reason)

    async def _close_socket(self, code: int, reason: str) -> None:
        self.closed = True
        self.transport.connections.discard(self)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(code, reason[:120]), 2.0)

    async def abort(self, code: int, reason: str, *, goodbye: bool = False) -> None:
        """End the connection now, without waiting on a socket that may never drain.

        The frame being written is dropped (a blocked ASGI send has not written it yet). With
        ``goodbye``, GOODBYE ``code`` goes out before the close. Both are sent from a task and
        bounded by timeouts: they reach a client that starts reading again, and nobody (the
        housekeeping, a shutdown) waits on one that never does.
        """
        self.transport.connections.discard(self)
        if self.closed:
            return  # already closing: its GOODBYE, if any, is on its way
        self.closed = True
        self._give_up_write()
        if goodbye:
            self._spawn(self._goodbye(code, reason))
        else:
            self._spawn(self._close_socket(CLOSE_CODES.get(code, 1013), reason))
