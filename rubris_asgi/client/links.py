"""The carrier of one connection, as the supervisor sees it; the endpoints of a mount URL.

The two carriers live in modules of their own, :mod:`.websocket` and :mod:`.longpoll`, each
importing its library (``websockets``, ``httpx``) at its top: the supervisor imports the one a
connection uses when it opens it, so ``import rubris_asgi.client`` loads neither (about 40 and
200 ms of imports that a process which never connects, or never long-polls, does not pay).
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from ..protocol import Welcome


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
