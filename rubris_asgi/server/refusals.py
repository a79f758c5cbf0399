"""Answers to a connection rubris does not serve, "not now" told apart from "never".

A client decides from the answer whether to try again, so the two must never look alike:

- **not now** (this node is starting, or stopping: protocol.md section 7): a WebSocket is
  accepted, then closed with 1012 (the node is restarting) or 1013 (try again later), and an
  HTTP request gets 503 with ``Retry-After``. Closing a WebSocket before accepting it would not
  do: every ASGI server turns that into HTTP 403 on the handshake, which a client rightly takes
  for a refusal for good and stops (a fleet of workers then loses capacity after a deploy).
- **never** (an origin or credentials refused): the handshake is answered with HTTP 403 and the
  reason as its body, where the server can send one (the ASGI ``websocket.http.response``
  extension: uvicorn, hypercorn); elsewhere the WebSocket is accepted and closed at once with
  1008 (or the code of the refusal) and the reason. A bare 403 or 404 is what a path with no
  rubris behind it gets, which is how clients tell "refused" from "no rubris endpoint here".
"""

from __future__ import annotations

from starlette.responses import PlainTextResponse
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from ..protocol import SUBPROTOCOL

RETRY_AFTER = 1
"""Seconds a 503 asks the client to wait (a node restarting is back within about that)."""
RESTARTING = 1012
TRY_AGAIN_LATER = 1013
_REASON_BYTES = 120  # a close frame's reason: 123 bytes at most (RFC 6455 section 5.5)


async def not_now(scope: Scope, receive: Receive, send: Send, reason: str, code: int) -> None:
    """Tell the client to come back: WebSocket ``code`` (1012 or 1013) after an accept, HTTP 503
    with ``Retry-After``; ``reason`` says why (the client logs it)."""
    if scope["type"] == "websocket":
        message = await receive()
        if message["type"] != "websocket.connect":
            return  # the client left already
        offered = scope.get("subprotocols") or []
        # a browser fails a handshake that does not select the subprotocol it asked for: the
        # close code would then never reach it
        await send(
            {
                "type": "websocket.accept",
                "subprotocol": SUBPROTOCOL if SUBPROTOCOL in offered else None,
            }
        )
        await send({"type": "websocket.close", "code": code, "reason": _clip(reason)})
        return
    response = PlainTextResponse(reason, status_code=503, headers={"Retry-After": str(RETRY_AFTER)})
    await response(scope, receive, send)


async def refuse(ws: WebSocket, status: int, close_code: int, reason: str) -> None:
    """Refuse a WebSocket for good: HTTP ``status`` with ``reason`` as the body where the server
    supports it; elsewhere (granian) accepted and closed at once with ``close_code`` and the
    reason, before any message is read or sent (a close before accept would be a bare 403,
    which clients take for a path with no rubris behind it)."""
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        await ws.send_denial_response(PlainTextResponse(reason, status_code=status))
        return
    offered = ws.scope.get("subprotocols") or []
    await ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    await ws.close(close_code, _clip(reason))


def _clip(reason: str) -> str:
    data = reason.encode()
    if len(data) <= _REASON_BYTES:
        return reason
    return data[: _REASON_BYTES - 3].decode(errors="ignore") + "..."
