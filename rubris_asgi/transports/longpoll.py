"""The HTTP long-poll transport at ``{mount}/lp`` (protocol.md section 7).

A long-poll session is READY only while a GET is waiting. Frames are numbered per session; the
last frame is kept (with its buffer lease) until the next poll acknowledges it, so a response
lost on the way is sent again when the client polls with the old ``ack``. A newer poll ends an
older one still waiting (409).
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from ..buffers import FrameBuffer
from ..errors import ErrorCode, ProtocolError
from ..session import Session, SessionState
from .gateway import Gateway

FRAME_HEADER = "Rubris-Frame"
_OCTETS = "application/octet-stream"


class LongPollTransport:
    """The endpoints under ``{mount}/lp`` and the table of long-poll sessions they serve."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.sessions: dict[str, LongPollSession] = {}

    def session_ended(self, s: Session) -> None:
        """The engine ended ``s``: drop its entry, release its frame, end a waiting poll."""
        lp = self.sessions.pop(s.id, None)
        if lp is not None:
            lp.end()

    def expire(self, now: float) -> None:
        """End the sessions nobody has polled for ``session_timeout``."""
        timeout = self.gateway.config.timing.session_timeout
        for lp in list(self.sessions.values()):
            if not lp.polling() and now - lp.last_seen > timeout:
                self.gateway.engine.end_session(lp.session)

    # the endpoints

    def _error(self, exc: ProtocolError) -> Response:
        """The HTTP answer to bad input, counted by its protocol code."""
        self.gateway.engine.telemetry.error("http", exc.code)
        return _error_response(exc)

    async def open_session(self, request: Request) -> Response:
        """POST {mount}/lp: HELLO, answered with WELCOME."""
        gateway = self.gateway
        if not gateway.origin_allowed(request.headers.get("origin"), request.headers.get("host")):
            return PlainTextResponse("origin not allowed", status_code=403)
        try:
            user = await gateway.authenticate(request)
            msgs = gateway.decode_client_frame(await self._read_body(request))
            s, resumed = gateway.open_or_resume(msgs, user)
        except ProtocolError as exc:
            return self._error(exc)
        s.transport = "longpoll"
        lp = LongPollSession(self, s)
        self.sessions[s.id] = lp
        gateway.engine.attach(s, lp, ready=False)
        try:
            await gateway.dispatcher.handle(s, msgs[1:])
        except ProtocolError as exc:
            return self._error(exc)
        return Response(gateway.welcome(s, resumed), media_type=_OCTETS)

    async def post_frame(self, request: Request) -> Response:
        """POST {mount}/lp/{session}: a client frame."""
        gateway = self.gateway
        try:
            lp = await self._owned(request)
            msgs = gateway.decode_client_frame(await self._read_body(request))
            await gateway.dispatcher.handle(lp.session, msgs)
        except ProtocolError as exc:
            return self._error(exc)
        return Response(status_code=202)

    async def poll(self, request: Request) -> Response:
        """GET {mount}/lp/{session}?ack=n: wait for the next frame."""
        try:
            lp = await self._owned(request)
            raw = request.query_params.get("ack", "0")
            if not raw.isdigit() or len(raw) > 20:
                raise ProtocolError(f"ack must be a frame number, got {raw[:24]!r}")
            ack = int(raw)
        except ProtocolError as exc:
            return self._error(exc)
        s = lp.session
        engine = self.gateway.engine
        lp.last_seen = engine.clock()
        if lp.last is not None and ack == lp.frame_no - 1:
            return _frame_response(lp.last, lp.frame_no)  # the response was lost: send it again
        if ack != lp.frame_no:
            return PlainTextResponse(
                f"ack {ack} is not a frame of this session (last sent {lp.frame_no})",
                status_code=400,
            )
        lp.acknowledge()
        old = lp.waiter
        if old is not None and not old.done():
            old.set_result(False)  # superseded: that poll answers 409
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        lp.waiter = waiter
        engine.set_ready(s)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(waiter), self.gateway.config.timing.poll_timeout)
        lp.last_seen = engine.clock()
        if lp.waiter is waiter:
            lp.waiter = None
        if lp.frame_no > ack and lp.last is not None:
            frame = _frame_response(lp.last, lp.frame_no)
            if s.state is SessionState.CLOSING and not s.has_work():
                # the GOODBYE is in this frame: nothing follows it (ending the session releases
                # the frame's lease, so the response is built first)
                engine.end_session(s)
            return frame
        if waiter.done() and not waiter.result():
            if s.state is SessionState.CLOSED or self.sessions.get(s.id) is not lp:
                # ended, or this long-poll session was let go of while the engine's session
                # waits for a resume: the client resumes with HELLO, it must not give up (409)
                return PlainTextResponse("session ended", status_code=404)
            return PlainTextResponse("superseded by a newer poll", status_code=409)
        if lp.waiter is None:
            s.ready = False  # nobody is waiting now: the scheduler must not pick this session
        return Response(status_code=204)

    async def _read_body(self, request: Request) -> bytes:
        limit = self.gateway.config.limits.max_inbound_frame
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ProtocolError(f"frame over the limit of {limit} bytes", ErrorCode.TOO_LARGE)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise ProtocolError(f"frame over the limit of {limit} bytes", ErrorCode.TOO_LARGE)
        return bytes(body)

    async def _owned(self, request: Request) -> LongPollSession:
        """The long-poll session in the URL, if it belongs to the caller; else 404 for all
        cases."""
        gateway = self.gateway
        user = await gateway.authenticate(request)
        lp = self.sessions.get(request.path_params["session"])
        if lp is None or lp.session.owner != gateway.user_key(user):
            raise ProtocolError("unknown or ended session", ErrorCode.SESSION_EXPIRED)
        return lp


class LongPollSession:
    """The ``FrameSink`` of a long-poll session: at most one frame in flight, kept until acked."""

    def __init__(self, transport: LongPollTransport, session: Session) -> None:
        self.transport = transport
        self.session = session
        self.frame_no = 0
        self.last: bytes | None = None
        self.lease: FrameBuffer | None = None
        self.waiter: asyncio.Future[bool] | None = None
        self.last_seen = transport.gateway.engine.clock()

    def send_frame(self, frame: bytes, lease: FrameBuffer) -> None:
        self.frame_no += 1
        self.last = frame
        self.lease = lease
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(True)

    def acknowledge(self) -> None:
        """The client has the last frame: free its lease."""
        lease, self.lease = self.lease, None
        self.last = None
        if lease is not None:
            self.transport.gateway.engine.pool.release(lease)

    def superseded(self) -> None:
        """A newer connection (another poll session or a WebSocket) resumed the session."""
        self.end()
        self.transport.sessions.pop(self.session.id, None)

    def polling(self) -> bool:
        """Whether a poll is waiting for a frame now."""
        return self.waiter is not None and not self.waiter.done()

    def answering(self) -> bool:
        """Whether a frame has been handed to a waiting poll that has not answered yet."""
        w = self.waiter
        return w is not None and w.done() and self.last is not None

    def takes_goodbye(self, now: float) -> bool:
        """Whether a GOODBYE queued now would reach the client: it is polling, or polled
        within the last second and is about to poll again."""
        return self.polling() or now - self.last_seen < 1.0

    def end(self) -> None:
        """The session ended: release what is held and end a waiting poll."""
        self.acknowledge()
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(False)


def _frame_response(frame: bytes, number: int) -> Response:
    return Response(frame, media_type=_OCTETS, headers={FRAME_HEADER: str(number)})


def _error_response(exc: ProtocolError) -> Response:
    status = {
        ErrorCode.TOO_LARGE: 413,
        ErrorCode.NOT_AUTHORISED: 403,
        ErrorCode.TOO_MANY: 503,
        ErrorCode.SESSION_EXPIRED: 404,
    }.get(exc.code, 400)
    return PlainTextResponse(f"{exc} (code {int(exc.code)})", status_code=status)
