"""The HTTP long-poll transport at ``{mount}/lp`` (protocol.md section 7).

A long-poll session is READY only while a GET is waiting. Frames are numbered per session; the
last frame is kept (with its buffer lease) until the next poll acknowledges it, so a response
lost on the way is sent again when the client polls with the old ``ack``. A newer poll ends an
older one still waiting (409).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from ..buffers import FrameBuffer
from ..errors import ErrorCode, ProtocolError
from ..session import Session, SessionState
from .common import decode_client_frame, open_or_resume, welcome

if TYPE_CHECKING:
    from ..app import Rubris

FRAME_HEADER = "Rubris-Frame"
_OCTETS = "application/octet-stream"


class LongPollSession:
    """The ``FrameSink`` of a long-poll session: at most one frame in flight, kept until acked."""

    def __init__(self, rubris: Rubris, session: Session) -> None:
        self.rubris = rubris
        self.session = session
        self.frame_no = 0
        self.last: bytes | None = None
        self.lease: FrameBuffer | None = None
        self.waiter: asyncio.Future[bool] | None = None
        self.last_seen = rubris.engine.clock()

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
            self.rubris.engine.pool.release(lease)

    def end(self) -> None:
        """The session ended: release what is held and end a waiting poll."""
        self.acknowledge()
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(False)


def _frame_response(frame: bytes, number: int) -> Response:
    return Response(frame, media_type=_OCTETS, headers={FRAME_HEADER: str(number)})


async def _read_body(rubris: Rubris, request: Request) -> bytes:
    limit = rubris.config.limits.max_inbound_frame
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ProtocolError(f"frame over the limit of {limit} bytes", ErrorCode.TOO_LARGE)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ProtocolError(f"frame over the limit of {limit} bytes", ErrorCode.TOO_LARGE)
    return bytes(body)


def _error(exc: ProtocolError) -> Response:
    status = {
        ErrorCode.TOO_LARGE: 413,
        ErrorCode.NOT_AUTHORISED: 403,
        ErrorCode.TOO_MANY: 503,
        ErrorCode.SESSION_EXPIRED: 404,
    }.get(exc.code, 400)
    return PlainTextResponse(f"{exc} (code {int(exc.code)})", status_code=status)


async def _owned(rubris: Rubris, request: Request) -> LongPollSession:
    """The long-poll session in the URL, if it belongs to the caller; else 404 for all cases."""
    user = await rubris.authenticate(request)
    lp = rubris.lp_sessions.get(request.path_params["session"])
    if lp is None or lp.session.owner != rubris.user_key(user):
        raise ProtocolError("unknown or ended session", ErrorCode.SESSION_EXPIRED)
    return lp


async def open_session(rubris: Rubris, request: Request) -> Response:
    """POST {mount}/lp: HELLO, answered with WELCOME."""
    if not rubris.origin_allowed(request.headers.get("origin"), request.headers.get("host")):
        return PlainTextResponse("origin not allowed", status_code=403)
    try:
        user = await rubris.authenticate(request)
        msgs = decode_client_frame(rubris, await _read_body(rubris, request))
        s, resumed = open_or_resume(rubris, msgs, user)
    except ProtocolError as exc:
        return _error(exc)
    rubris.take_over(s)
    lp = LongPollSession(rubris, s)
    rubris.lp_sessions[s.id] = lp
    rubris.engine.attach(s, lp, ready=False)
    try:
        await rubris.dispatcher.handle(s, msgs[1:])
    except ProtocolError as exc:
        return _error(exc)
    return Response(welcome(rubris, s, resumed), media_type=_OCTETS)


async def post_frame(rubris: Rubris, request: Request) -> Response:
    """POST {mount}/lp/{session}: a client frame."""
    try:
        lp = await _owned(rubris, request)
        msgs = decode_client_frame(rubris, await _read_body(rubris, request))
        await rubris.dispatcher.handle(lp.session, msgs)
    except ProtocolError as exc:
        return _error(exc)
    return Response(status_code=202)


async def poll(rubris: Rubris, request: Request) -> Response:
    """GET {mount}/lp/{session}?ack=n: wait for the next frame."""
    try:
        lp = await _owned(rubris, request)
        raw = request.query_params.get("ack", "0")
        if not raw.isdigit() or len(raw) > 20:
            raise ProtocolError(f"ack must be a frame number, got {raw[:24]!r}")
        ack = int(raw)
    except ProtocolError as exc:
        return _error(exc)
    s = lp.session
    engine = rubris.engine
    lp.last_seen = engine.clock()
    if lp.last is not None and ack == lp.frame_no - 1:
        return _frame_response(lp.last, lp.frame_no)  # the response was lost: send it again
    if ack != lp.frame_no:
        return PlainTextResponse(
            f"ack {ack} is not a frame of this session (last sent {lp.frame_no})", status_code=400
        )
    lp.acknowledge()
    old = lp.waiter
    if old is not None and not old.done():
        old.set_result(False)  # superseded: that poll answers 409
    waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    lp.waiter = waiter
    engine.set_ready(s)
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.shield(waiter), rubris.config.timing.poll_timeout)
    lp.last_seen = engine.clock()
    if lp.waiter is waiter:
        lp.waiter = None
    if lp.frame_no > ack and lp.last is not None:
        frame = _frame_response(lp.last, lp.frame_no)
        if s.state is SessionState.CLOSING and not s.has_work():
            # the GOODBYE is in this frame: nothing follows it (ending the session releases
            # the frame's lease, so the response is built first)
            rubris.end_session(s)
        return frame
    if waiter.done() and not waiter.result():
        if s.state is SessionState.CLOSED:
            return PlainTextResponse("session ended", status_code=404)
        return PlainTextResponse("superseded by a newer poll", status_code=409)
    if lp.waiter is None:
        s.ready = False  # nobody is waiting now: the scheduler must not pick this session
    return Response(status_code=204)
