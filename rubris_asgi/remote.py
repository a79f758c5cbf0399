"""``Rubris.send_to``: a private message to a session named by its id, on whichever node it
lives.

Alone, it is ``send`` with a lookup. With several nodes, a session id names its node: a send
to a session of another node is encoded here (by the channel's codec), handed to that node
through Redis (``Broker.ask``) and queued there with ``send``, so back-pressure holds: the
call returns when the message is in the session's queue, waiting while the queue is full (at
most ``SEND_TIMEOUT``, then ``QueueFull``). The other node's refusal comes back as the same
exception: ``SessionClosed``, ``QueueFull``, ``ProtocolError``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from .brokers import Broker
from .brokers.base import Head, NodeGone
from .channels import Registry
from .engine import Engine
from .errors import ErrorCode, ProtocolError, QueueFull, RubrisError, SessionClosed
from .protocol import Mode
from .session import Session
from .topics import encode_payload

SEND = "send"
SEND_TIMEOUT = 30.0
"""Seconds a send to another node's session may wait for room in its queue."""

_ERRORS: dict[str, type[RubrisError]] = {
    "SessionClosed": SessionClosed,
    "QueueFull": QueueFull,
}

Send = Callable[[Session, str, Any], Awaitable[int]]


class RemoteSends:
    """Sends by session id, both ends: asking the session's node, and answering other nodes."""

    def __init__(self, engine: Engine, registry: Registry, broker: Broker, send: Send) -> None:
        self.engine = engine
        self.registry = registry
        self.broker = broker
        self._send = send

    def serve(self) -> None:
        self.broker.on(SEND, self._answer)

    async def send_to(self, session_id: str, name: str, value: Any) -> int:
        s = self.engine.sessions.get(session_id)
        if s is not None:
            return await self._send(s, name, value)
        home = self.broker.home_of(session_id)
        if not home:
            raise SessionClosed(f"no session {session_id[:24]!r} (ended, or never was)")
        found = self.registry.match(name)
        if found is None or found[0].mode != Mode.PRIVATE:
            raise ProtocolError(f"no private channel matches {name!r}", ErrorCode.UNKNOWN)
        payload = encode_payload(value, found[0].codec)  # bytes pass through on the other node
        head = {"sid": session_id, "name": name}
        try:
            reply, _ = await self.broker.ask(home, SEND, head, payload, SEND_TIMEOUT)
        except NodeGone:
            raise SessionClosed(f"session {session_id[:24]!r}: its node is gone") from None
        except asyncio.TimeoutError:
            raise QueueFull(f"{name}: still full after {SEND_TIMEOUT:.0f} s") from None
        failed = reply.get("failed")
        if failed is not None:
            message = str(reply.get("message", ""))
            error = _ERRORS.get(failed)
            if error is not None:
                raise error(message)
            raise ProtocolError(message, ErrorCode(int(reply.get("code", ErrorCode.PROTOCOL))))
        return int(reply["seq"])

    async def _answer(self, head: Head, body: bytes) -> tuple[Head, bytes]:
        s = self.engine.sessions.get(str(head.get("sid")))
        try:
            if s is None:
                raise SessionClosed(f"no session {str(head.get('sid'))[:24]!r} on this node")
            seq = await self._send(s, str(head.get("name")), body)
        except ProtocolError as exc:
            return {"failed": "ProtocolError", "code": int(exc.code), "message": str(exc)}, b""
        except RubrisError as exc:
            return {"failed": type(exc).__name__, "message": str(exc)}, b""
        return {"seq": seq}, b""
