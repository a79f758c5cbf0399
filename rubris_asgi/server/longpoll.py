"""The HTTP long-poll transport at ``{mount}/lp`` (protocol.md section 7).

A long-poll session is READY only while a GET is waiting. Frames are numbered per session; the
last frame is kept (with its buffer lease) until the next poll acknowledges it, so a response
lost on the way is sent again when the client polls with the old ``ack``. A newer poll ends an
older one still waiting (409).
"""

from __future__ import annotations

import asyncio
import contextlib
from asyncio import FIRST_COMPLETED
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import Receive

from ..cluster.base import Head, NodeGone
from ..engine.buffers import FrameBuffer
from ..engine.session import Session, SessionState
from ..errors import BrokerUnavailable, ErrorCode, ProtocolError
from ..protocol import Message
from .gateway import Gateway, client_address, resumed_id
from .hardening import BodyTimeout, BodyTooLarge, receive_body
from .quiet_log import QuietPolls

FRAME_HEADER = "Rubris-Frame"
_OCTETS = "application/octet-stream"
OPEN, POST, POLL = "lp.open", "lp.post", "lp.poll"
"""The requests a node forwards to the node of a long-poll session (``NodeLink.ask``)."""
FORWARD_TIMEOUT = 10.0
"""Seconds a forwarded HELLO or client frame may take on the session's node."""
FORWARD_SLACK = 5.0
"""Seconds a forwarded poll may take beyond the poll timeout (Redis, both ways)."""


class LongPollTransport:
    """The endpoints under ``{mount}/lp`` and the table of long-poll sessions they serve."""

    def __init__(self, gateway: Gateway, quiet: QuietPolls | None = None) -> None:
        self.gateway = gateway
        self.sessions: dict[str, LongPollSession] = {}
        self.quiet = quiet
        """The access-log filter that learns where this transport's routes are, if any."""

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
        return Answer.refusal(exc).response()

    async def open_session(self, request: Request) -> Response:
        """POST {mount}/lp: HELLO, answered with WELCOME."""
        if self.quiet is not None:
            self.quiet.learn(request.scope["path"])
        gateway = self.gateway
        origin, host = request.headers.get("origin"), request.headers.get("host")
        if origin is not None and not gateway.origin_allowed(origin, host):
            return PlainTextResponse(gateway.origin_refused(origin, host), status_code=403)
        try:
            user = await gateway.authenticate(request)
            body = await self._read_body(request)
            msgs = gateway.decode_client_frame(body)
            node = self._elsewhere(resumed_id(msgs))
            if node:  # it resumes a session of another node: that node answers
                answer = await self._forward(node, OPEN, {"key": Gateway.owner_tag(user)}, body)
                if answer.status != 404:
                    return answer.response()
            s, resumed = gateway.open_or_resume(msgs, user, client_address(request))
            gateway.dispatcher.spend(s, len(body))  # the first frame counts as any other
            return (await self._open(s, resumed, msgs)).response()
        except ProtocolError as exc:
            return self._error(exc)

    async def _open(self, s: Session, resumed: bool, msgs: list[Message]) -> Answer:
        gateway = self.gateway
        s.transport = "longpoll"
        lp = LongPollSession(self, s)
        self.sessions[s.id] = lp
        gateway.engine.attach(s, lp, ready=False)
        await gateway.dispatcher.handle_first(s, msgs[1:])
        return Answer(200, gateway.welcome(s, resumed))

    async def post_frame(self, request: Request) -> Response:
        """POST {mount}/lp/{session}: a client frame."""
        if self.quiet is not None:
            self.quiet.learn(request.scope["path"])
        try:
            user = await self.gateway.authenticate(request)
            sid = request.path_params["session"]
            body = await self._read_body(request)
            node = self._elsewhere(sid)
            if node:
                head = {"sid": sid, "key": Gateway.owner_tag(user)}
                return (await self._forward(node, POST, head, body)).response()
            return (await self._post(self._owned(sid, user), body)).response()
        except ProtocolError as exc:
            return self._error(exc)

    async def _post(self, lp: LongPollSession, body: bytes) -> Answer:
        gateway = self.gateway
        gateway.dispatcher.spend(lp.session, len(body))
        await gateway.dispatcher.handle(lp.session, gateway.decode_client_frame(body))
        await gateway.dispatcher.pay(lp.session)  # over its input budget: answered once paid
        return Answer(202)

    async def poll(self, request: Request) -> Response:
        """GET {mount}/lp/{session}?ack=n: wait for the next frame."""
        if self.quiet is not None:
            self.quiet.learn(request.scope["path"])
        try:
            user = await self.gateway.authenticate(request)
            sid = request.path_params["session"]
            ack = _ack(request.query_params.get("ack", "0"))
            node = self._elsewhere(sid)
            if node:
                head = {"sid": sid, "key": Gateway.owner_tag(user), "ack": ack}
                return (await self._forward(node, POLL, head, b"")).response()
            lp = self._owned(sid, user)
        except ProtocolError as exc:
            return self._error(exc)
        return (await self._poll(lp, ack, request.receive)).response()

    async def _poll(self, lp: LongPollSession, ack: int, receive: Receive | None = None) -> Answer:
        """Wait up to ``poll_timeout`` for ``lp``'s next frame; with the request's ``receive``,
        stop waiting as soon as the client goes away (a closed tab, a client that stopped):
        otherwise the poll held its task, and a server shutdown waited for it, the whole
        ``poll_timeout``. A frame handed to a poll whose client is gone is not lost: the next
        poll acks the frame before it, and gets it again."""
        s = lp.session
        engine = self.gateway.engine
        lp.last_seen = engine.clock()
        if lp.last is not None and ack == lp.frame_no - 1:
            return Answer(200, lp.last, lp.frame_no)  # the response was lost: send it again
        if ack != lp.frame_no:
            text = f"ack {ack} is not a frame of this session (last sent {lp.frame_no})"
            return Answer(400, text.encode())
        lp.acknowledge()
        old = lp.waiter
        if old is not None and not old.done():
            old.set_result(False)  # superseded: that poll answers 409
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        lp.waiter = waiter
        engine.set_ready(s)
        timeout = self.gateway.config.timing.poll_timeout
        if receive is None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(waiter), timeout)
        else:
            gone = asyncio.get_running_loop().create_task(_disconnected(receive))
            try:
                await asyncio.wait((waiter, gone), timeout=timeout, return_when=FIRST_COMPLETED)
            finally:
                gone.cancel()
            # a closed client says no more: shutdown need not wait for it to poll again
            lp.left = gone.done() and not gone.cancelled() and not waiter.done()
        lp.last_seen = engine.clock()
        if lp.waiter is waiter:
            lp.waiter = None
        if lp.frame_no > ack and lp.last is not None:
            frame = Answer(200, lp.last, lp.frame_no)
            if s.state is SessionState.CLOSING and not s.has_work():
                # the GOODBYE is in this frame: nothing follows it (ending the session releases
                # the frame's lease, so the answer is taken first)
                engine.end_session(s)
            return frame
        if waiter.done() and not waiter.result():
            if s.state is SessionState.CLOSED or self.sessions.get(s.id) is not lp:
                # ended, or this long-poll session was let go of while the engine's session
                # waits for a resume: the client resumes with HELLO, it must not give up (409)
                return Answer(404, b"session ended")
            return Answer(409, b"superseded by a newer poll")
        if lp.waiter is None:
            s.ready = False  # nobody is waiting now: the scheduler must not pick this session
        return Answer(204)

    # requests that reach this node for a session of another (no sticky routing needed)

    def _elsewhere(self, sid: str) -> str:
        """The node ``sid`` lives on when that is another one ("" for this one, or alone)."""
        return self.gateway.nodes.home_of(sid)

    async def _forward(self, node: str, op: str, head: Head, body: bytes) -> Answer:
        timing = self.gateway.config.timing
        timeout = timing.poll_timeout + FORWARD_SLACK if op == POLL else FORWARD_TIMEOUT
        try:
            reply, data = await self.gateway.nodes.ask(node, op, head, body, timeout)
        except NodeGone:
            return Answer(404, b"unknown or ended session: its server is gone")
        except (BrokerUnavailable, asyncio.TimeoutError, RuntimeError) as exc:
            return Answer(503, f"the session's server cannot be reached: {exc}".encode())
        return Answer(int(reply["status"]), data, int(reply.get("frame", 0)))

    def serve_forwarded(self) -> None:
        """Answer the long-poll requests other nodes forward to this one."""
        nodes = self.gateway.nodes
        nodes.on(OPEN, self._forwarded_open)
        nodes.on(POST, self._forwarded_post)
        nodes.on(POLL, self._forwarded_poll)

    async def _forwarded_open(self, head: Head, body: bytes) -> tuple[Head, bytes]:
        gateway = self.gateway
        try:
            msgs = gateway.decode_client_frame(body)
            s = gateway.resume(msgs, str(head.get("key")))
            if s is None:
                answer = Answer(404, b"no such session")
            else:
                answer = await self._open(s, True, msgs)
        except ProtocolError as exc:
            answer = Answer.refusal(exc)
        return answer.head(), answer.body

    async def _forwarded_post(self, head: Head, body: bytes) -> tuple[Head, bytes]:
        try:
            answer = await self._post(self._tagged(head), body)
        except ProtocolError as exc:
            answer = Answer.refusal(exc)
        return answer.head(), answer.body

    async def _forwarded_poll(self, head: Head, body: bytes) -> tuple[Head, bytes]:
        try:
            answer = await self._poll(self._tagged(head), int(head.get("ack", 0)))
        except ProtocolError as exc:
            answer = Answer.refusal(exc)
        return answer.head(), answer.body

    def _tagged(self, head: Head) -> LongPollSession:
        lp = self.sessions.get(str(head.get("sid")))
        if lp is None or repr(lp.session.owner) != head.get("key"):
            raise ProtocolError("unknown or ended session", ErrorCode.SESSION_EXPIRED)
        return lp

    async def _read_body(self, request: Request) -> bytes:
        """A POST's frame: 413 over ``max_inbound_frame``; ``BodyTimeout`` (408) when it has
        not all come within ``Timing.body_timeout``, so that a client dribbling its body
        cannot hold the request (hardening.py)."""
        config = self.gateway.config
        limit = config.limits.max_inbound_frame
        try:
            return await receive_body(request, limit, config.timing.body_timeout)
        except BodyTooLarge:
            raise ProtocolError(
                f"frame over the limit of {limit} bytes", ErrorCode.TOO_LARGE
            ) from None

    def _owned(self, sid: str, user: Any) -> LongPollSession:
        """The long-poll session ``sid``, if it belongs to ``user``; else 404 for all cases."""
        lp = self.sessions.get(sid)
        if lp is None or lp.session.owner != self.gateway.user_key(user):
            raise ProtocolError("unknown or ended session", ErrorCode.SESSION_EXPIRED)
        return lp


class LongPollSession:
    """The ``FrameSink`` of a long-poll session: at most one frame in flight, kept until acked."""

    writing_since = 0.0
    """Never writing: a frame waits here for the next poll, which takes it at once."""

    def __init__(self, transport: LongPollTransport, session: Session) -> None:
        self.transport = transport
        self.session = session
        self.frame_no = 0
        self.last: bytes | None = None
        self.lease: FrameBuffer | None = None
        self.waiter: asyncio.Future[bool] | None = None
        self.last_seen = transport.gateway.engine.clock()
        self.left = False
        """The client went away during its latest poll (it closed, or its connection broke)."""

    def write_now(self, frame: bytes) -> bool:
        return False  # a poll's frame is kept, and its lease, until the next poll acknowledges it

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
        within the last second and is about to poll again (unless it went away during that
        poll)."""
        return self.polling() or (not self.left and now - self.last_seen < 1.0)

    def end(self) -> None:
        """The session ended: release what is held and end a waiting poll."""
        self.acknowledge()
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(False)


class Answer:
    """What a long-poll request is answered, built here or on the session's node."""

    __slots__ = ("status", "body", "frame")

    def __init__(self, status: int, body: bytes = b"", frame: int = 0) -> None:
        self.status = status
        self.body = body
        self.frame = frame

    def response(self) -> Response:
        if self.status == 200 and self.frame:
            return Response(self.body, media_type=_OCTETS, headers={FRAME_HEADER: str(self.frame)})
        if self.status == 200:
            return Response(self.body, media_type=_OCTETS)
        if self.status in (202, 204):
            return Response(status_code=self.status)
        # a body too slow is not waited for: the connection closes (RFC 9110, 408)
        headers = {"Connection": "close"} if self.status == 408 else None
        return PlainTextResponse(self.body.decode(errors="replace"), self.status, headers)

    def head(self) -> Head:
        return {"status": self.status, "frame": self.frame}

    @classmethod
    def refusal(cls, exc: ProtocolError) -> Answer:
        """Bad input as HTTP: the status its protocol code maps to (a body too slow: 408),
        the reason as text."""
        status = exc.status if isinstance(exc, BodyTimeout) else _STATUS.get(exc.code, 400)
        return cls(status, f"{exc} (code {int(exc.code)})".encode())


def _ack(raw: str) -> int:
    if not raw.isdigit() or len(raw) > 20:
        raise ProtocolError(f"ack must be a frame number, got {raw[:24]!r}")
    return int(raw)


_STATUS = {
    ErrorCode.TOO_LARGE: 413,
    ErrorCode.NOT_AUTHORISED: 403,
    ErrorCode.TOO_MANY: 503,
    ErrorCode.SESSION_EXPIRED: 404,
}


async def _disconnected(receive: Receive) -> None:
    """Returns when the HTTP client of a poll has gone away (ASGI ``http.disconnect``); a GET's
    ``http.request`` (its empty body) comes first and is passed over."""
    while (await receive())["type"] != "http.disconnect":
        pass
