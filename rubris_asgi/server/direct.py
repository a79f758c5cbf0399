"""Prepared WebSocket frames written straight to the connection's socket, where the server is known.

A server sends its WebSocket frames unmasked (RFC 6455 section 5.1), so the bytes of one
message on the wire are the same for every client: the two to ten bytes of the frame's
header, then the payload. Through ASGI every ``websocket.send`` makes the server frame the
payload again (under uvicorn: an ``asyncio.Event`` wait, a ``websockets`` ``Frame`` built,
checked and serialised, a list joined), about a third of what a frame costs the server beside the
kernel's send. That is the "encode once per broadcast" of the batching source document, lost at
the last step; Go servers keep it with a prepared message (gorilla/websocket's
``PreparedMessage``).

:class:`DirectSocket` keeps it where the server is one we know: uvicorn's ``websockets-sansio``
protocol (uvicorn's default WebSocket implementation), found from the ASGI ``receive`` callable,
which is the protocol's bound method. A frame is written with ``transport.write`` exactly when
the server's own ``send`` would write it at once: the handshake done, no close sent or
received, the connection's state OPEN, no WebSocket extension negotiated (permessage-deflate
would want the payload compressed: rubris compresses per message itself, see protocol.md
section 4), and the transport not paused by its high-water mark. Otherwise, and for every
other server, the frame goes through the ASGI ``send`` as before, which then waits for the
socket and makes the write a *blocked write* as ever: nothing of the slow-client rules changes.
The server's keep-alive pings and its close frame go through its own protocol, on the same
transport, in order with these frames (one event loop: nothing interleaves inside a write).

``WriterConfig.direct_writes`` (default True) turns it off.
"""

from __future__ import annotations

import sys
from typing import Any

BINARY_FIN = 0x82
"""FIN set, opcode 2 (binary): a whole binary message in one frame."""

_SANSIO = "uvicorn.protocols.websockets.websockets_sansio_impl"
_READ = ("conn", "transport", "writable", "close_sent", "disconnected", "handshake_complete")
"""The protocol attributes :class:`DirectSocket` reads (uvicorn 0.54), checked per connection."""


def binary_frame(payload: bytes) -> bytes:
    """The unmasked WebSocket frame of one whole binary message (RFC 6455 section 5.2)."""
    n = len(payload)
    if n < 126:
        return bytes((BINARY_FIN, n)) + payload
    if n < 65536:
        return bytes((BINARY_FIN, 126)) + n.to_bytes(2, "big") + payload
    return bytes((BINARY_FIN, 127)) + n.to_bytes(8, "big") + payload


class DirectSocket:
    """A uvicorn ``websockets-sansio`` connection, written to without its ``send``."""

    __slots__ = ("proto", "conn", "transport", "writable", "open_state")

    def __init__(self, proto: Any, open_state: Any) -> None:
        self.proto = proto
        self.conn = proto.conn
        self.transport = proto.transport
        self.writable = proto.writable
        self.open_state = open_state

    def write(self, frame: bytes) -> bool:
        """Write ``frame`` (already a WebSocket frame) now, if the server's ``send`` would write
        it at once; False: it was not written, go through the ASGI ``send``."""
        p = self.proto
        if (
            p.close_sent
            or p.disconnected
            or self.conn.state is not self.open_state
            or not self.writable.is_set()
        ):
            return False
        self.transport.write(frame)
        return True


def direct_socket(receive: Any) -> DirectSocket | None:
    """The :class:`DirectSocket` behind an ASGI ``receive`` once the connection is accepted,
    or None where the server is not one we know or the connection negotiated an extension (its
    frames are then the server's). Lets go of the handshake that uvicorn would keep."""
    module = sys.modules.get(_SANSIO)
    proto = getattr(receive, "__self__", None)
    if module is None or proto is None or type(proto) is not module.WebSocketsSansIOProtocol:
        return None
    if not all(hasattr(proto, name) for name in _READ):  # another uvicorn: ASGI it is
        return None
    conn = proto.conn
    state = getattr(conn, "state", None)  # websockets' State.OPEN once accepted
    if getattr(conn, "extensions", True) or getattr(state, "name", None) != "OPEN":
        return None
    if hasattr(proto, "request") and hasattr(proto, "response"):
        # uvicorn keeps the handshake's request and response (their headers: about 4 KB) for
        # the connection's life, and reads them only until the accept is sent
        proto.request = proto.response = None
    return DirectSocket(proto, state)
