"""The carrier of one connection, as the supervisor sees it; the endpoints of a mount URL.

The two carriers live in modules of their own, :mod:`.websocket` and :mod:`.longpoll`, each
importing its library (``websockets``, ``httpx``) at its top: the supervisor imports the one a
connection uses when it opens it, so ``import rubris_asgi.client`` loads neither (about 40 and
200 ms of imports that a process which never connects, or never long-polls, does not pay).
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from ..protocol import Welcome
from .errors import _Lost


class _NotNow(_Lost):
    """The server said "not now" (WebSocket close 1012 or 1013, HTTP 503): it is starting or
    stopping, and the client tries again, not before ``retry_after`` seconds when it said."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class _Link:
    """One connection attempt's carrier: WebSocket or long-poll."""

    async def open(self, hello: bytes) -> bytes:
        """Send HELLO; return the first server frame (it starts with WELCOME)."""
        raise NotImplementedError

    def bind(self, welcome: Welcome) -> None:
        """The session is known (long-poll URLs need its id)."""

    async def recv(self) -> bytes:
        raise NotImplementedError

    async def send(self, frame: bytes) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        """Release the connection; never raises."""


def _endpoints(url: str) -> tuple[str, str]:
    """``(ws_url, lp_url)`` of a mount URL given as http(s):// or ws(s)://."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("http", "ws"):
        http_scheme, ws_scheme = "http", "ws"
    elif scheme in ("https", "wss"):
        http_scheme, ws_scheme = "https", "wss"
    else:
        raise ValueError(f"url: expected http://, https://, ws:// or wss://, got {url!r}")
    path = parts.path.rstrip("/")
    ws_url = urlunsplit((ws_scheme, parts.netloc, path + "/ws", parts.query, ""))
    lp_url = urlunsplit((http_scheme, parts.netloc, path + "/lp", "", ""))
    return ws_url, lp_url


def _no_endpoint(url: str, status: int) -> str:
    """Why a bare 403, 404 or 405 means a wrong URL: it is what a path with no rubris behind it
    gets (Starlette's answer to an unrouted WebSocket is 403); rubris's own refusals give their
    reason (server/refusals.py)."""
    path = urlsplit(url).path
    hint = "is the mount path right?"
    if path.endswith(("/ws/ws", "/lp/ws", "/ws/lp", "/lp/lp")):
        hint = "give the client the mount URL (http://host:port/rubris), not its /ws or /lp"
    return f"no rubris endpoint at {url} (HTTP {status} with no reason): {hint}"
