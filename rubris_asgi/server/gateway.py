"""What both transports share, handed to them by the app: the ``Gateway``.

A transport needs the engine, the configuration and the dispatcher; who the user is and whether
the page's origin may connect; and the HELLO that opens or resumes a session. The app builds one
``Gateway`` and gives it to each transport, so transports never import the app (the app imports
them) and a new transport needs nothing more than this narrow surface.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import HTTPConnection

from ..cluster.base import Broker
from ..cluster.nodes import NodeLink
from ..config import Config
from ..engine.engine import Engine
from ..engine.session import Session
from ..errors import ErrorCode, ProtocolError, Reject
from ..protocol import VERSION, Hello, Message, Welcome, decode_frame, encode
from .dispatch import Dispatcher

log = logging.getLogger("rubris_asgi")

Authenticate = Callable[[HTTPConnection], Any]

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


class Gateway:
    """Sessions in and out of the engine, for any transport."""

    def __init__(
        self,
        engine: Engine,
        dispatcher: Dispatcher,
        config: Config,
        *,
        broker: Broker,
        nodes: NodeLink,
        authenticate: Authenticate | None = None,
        allowed_origins: Iterable[str] = (),
    ) -> None:
        self.engine = engine
        self.dispatcher = dispatcher
        self.config = config
        self.broker = broker
        """Where shared topics are numbered (alone: here)."""
        self.nodes = nodes
        """Requests to the node that holds a session (alone: nobody to ask)."""
        self._authenticate = authenticate
        self.allowed_origins = frozenset(allowed_origins)
        self._refused_origins: set[str] = set()

    # who may connect

    async def authenticate(self, conn: HTTPConnection) -> Any:
        """The user of ``conn``: the application's hook, else Starlette's ``scope["user"]``.

        A ``Reject`` from the hook becomes ``ProtocolError`` code 4 (not authorised).
        """
        if self._authenticate is not None:
            try:
                user = self._authenticate(conn)
                if inspect.isawaitable(user):
                    user = await user
            except Reject as r:
                raise ProtocolError(r.reason, ErrorCode.NOT_AUTHORISED) from None
            return user
        return conn.scope.get("user")

    @staticmethod
    def user_key(user: Any) -> Any:
        """A stable identity for comparing users across resumes and polls."""
        if user is None or not getattr(user, "is_authenticated", True):
            return None
        if isinstance(user, (str, int, bytes, tuple)):
            return user
        for attr in ("identity", "username", "id", "display_name"):
            with contextlib.suppress(Exception):
                value = getattr(user, attr)
                if isinstance(value, (str, int)):
                    return (type(user).__name__, value)
        return ("object", id(user))

    @classmethod
    def owner_tag(cls, user: Any) -> str:
        """The user as another node compares it with a session's owner (``repr`` of its key:
        a user known only by ``id()`` never matches on another node)."""
        return repr(cls.user_key(user))

    def origin_allowed(self, origin: str | None, host: str | None = None) -> bool:
        if origin is None or "*" in self.allowed_origins or origin in self.allowed_origins:
            return True  # no Origin: not a browser, so not a cross-site hijack
        return host is not None and urlsplit(origin).netloc == host

    def origin_refused(self, origin: str, host: str | None) -> str:
        """Why ``origin`` is refused, naming it and the setting that would allow it; logged once
        per origin (a bounded set), as a page that retries would repeat it every second."""
        reason = (
            f"origin {origin!r} is not allowed (host {host!r}): add it to "
            "Rubris(allowed_origins=[...]), or serve the page from the same host and port"
        )
        if origin not in self._refused_origins and len(self._refused_origins) < 100:
            self._refused_origins.add(origin)
            log.warning("rubris: refused a connection: %s", reason)
        return reason

    # the first frame

    def decode_client_frame(self, data: bytes) -> list[Message]:
        """Decode one client frame under the inbound size limit."""
        limit = self.config.limits.max_inbound_frame
        if len(data) > limit:
            raise ProtocolError(
                f"frame of {len(data)} bytes is over the limit of {limit}", ErrorCode.TOO_LARGE
            )
        return decode_frame(data)

    def open_or_resume(
        self, msgs: list[Message], user: Any, address: str = ""
    ) -> tuple[Session, bool]:
        """Settle the HELLO that starts ``msgs``: the session it resumes, or a new one
        (``address``: the client's, what anonymous sessions are capped by).

        A resumed session leaves the connection that carried it before (its sink is told it
        was superseded), so the caller can attach it to the new one.
        """
        hello = _hello(msgs)
        engine = self.engine
        key = self.user_key(user)
        if hello.resume:
            s = engine.find_resumable(hello.resume, key)
            if s is not None:
                self._take(s)
                return s, True
        return engine.open_session(user, key, address), False

    def resume(self, msgs: list[Message], owner_tag: str) -> Session | None:
        """The session the HELLO of ``msgs`` resumes, taken from its connection, for a request
        another node forwarded (``owner_tag``: its user as ``repr(user_key(user))``)."""
        hello = _hello(msgs)
        s = self.engine.find_resumable(hello.resume, owner_tag=owner_tag) if hello.resume else None
        if s is not None:
            self._take(s)
        return s

    def _take(self, s: Session) -> None:
        """A resumed session leaves the connection it had, if any."""
        engine = self.engine
        old = s.sink
        if old is not None:
            old.superseded()
            engine.detach(s)
        else:  # back now: the timeout counts again until it is attached
            s.detached_at = engine.clock()
        engine.telemetry.sessions_resumed += 1

    def welcome(self, s: Session, resumed: bool) -> bytes:
        return encode(
            Welcome(
                s.id,
                s.resume_token,
                int(self.config.timing.heartbeat * 1000),
                self.config.limits.max_inbound_frame,
                resumed,
            )
        )


def _hello(msgs: list[Message]) -> Hello:
    """The HELLO that must start a first frame, of a version this server speaks."""
    if not msgs or not isinstance(msgs[0], Hello):
        got = type(msgs[0]).__name__.upper() if msgs else "nothing"
        raise ProtocolError(f"the first message must be HELLO, got {got}", ErrorCode.PROTOCOL)
    hello = msgs[0]
    if hello.version != VERSION:
        raise ProtocolError(
            f"protocol version {hello.version} is not supported (this server speaks {VERSION})",
            ErrorCode.UNSUPPORTED_VERSION,
        )
    return hello


def client_address(conn: HTTPConnection) -> str:
    """The client's address as the server gives it (behind a proxy, the forwarded one when
    the server trusts the proxy: uvicorn's ``forwarded_allow_ips``)."""
    client = conn.client
    return client.host if client is not None else ""


def resumed_id(msgs: list[Message]) -> str:
    """The session id a first frame's HELLO asks to resume ("" for none)."""
    hello = msgs[0] if msgs else None
    return hello.resume.partition(".")[0] if isinstance(hello, Hello) else ""
