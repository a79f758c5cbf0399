"""Pieces both transports share: HELLO handling and the GOODBYE/close-code table."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ErrorCode, ProtocolError
from ..protocol import VERSION, Hello, Message, Welcome, decode_frame, encode
from ..session import Session

if TYPE_CHECKING:
    from ..app import Rubris

# protocol.md section 6: the WebSocket close code that follows each GOODBYE code
CLOSE_CODES: dict[int, int] = {
    ErrorCode.PROTOCOL: 1002,
    ErrorCode.UNSUPPORTED_VERSION: 1002,
    ErrorCode.UNKNOWN: 1002,
    ErrorCode.NOT_AUTHORISED: 1008,
    ErrorCode.TOO_LARGE: 1009,
    ErrorCode.TOO_MANY: 1013,
    ErrorCode.SLOW_CONSUMER: 1013,
    ErrorCode.SESSION_EXPIRED: 1000,
    ErrorCode.SHUTTING_DOWN: 1000,
    ErrorCode.REJECTED: 1008,
}


def decode_client_frame(rubris: Rubris, data: bytes) -> list[Message]:
    """Decode one client frame under the inbound size limit."""
    if len(data) > rubris.config.limits.max_inbound_frame:
        raise ProtocolError(
            f"frame of {len(data)} bytes is over the limit of "
            f"{rubris.config.limits.max_inbound_frame}",
            ErrorCode.TOO_LARGE,
        )
    return decode_frame(data)


def open_or_resume(rubris: Rubris, msgs: list[Message], user: Any) -> tuple[Session, bool]:
    """Settle the HELLO that starts ``msgs``: the session it resumes, or a new one."""
    if not msgs or not isinstance(msgs[0], Hello):
        got = type(msgs[0]).__name__.upper() if msgs else "nothing"
        raise ProtocolError(f"the first message must be HELLO, got {got}", ErrorCode.PROTOCOL)
    hello = msgs[0]
    if hello.version != VERSION:
        raise ProtocolError(
            f"protocol version {hello.version} is not supported (this server speaks {VERSION})",
            ErrorCode.UNSUPPORTED_VERSION,
        )
    engine = rubris.engine
    key = rubris.user_key(user)
    if hello.resume:
        s = engine.find_resumable(hello.resume, key)
        if s is not None:
            return s, True
    return engine.open_session(user, key), False


def welcome(rubris: Rubris, s: Session, resumed: bool) -> bytes:
    return encode(
        Welcome(
            s.id,
            s.resume_token,
            int(rubris.config.timing.heartbeat * 1000),
            rubris.config.limits.max_inbound_frame,
            resumed,
        )
    )
