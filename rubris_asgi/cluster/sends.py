"""``Rubris.send_to``: a private message to a session named by its id, on whichever node it
lives, with an outcome the sender can act on.

Alone, it is ``send`` with a lookup and a bound on the wait. With several nodes, a session id
names its node (its *home*): a send to a session of another node is encoded here (by the
channel's codec), handed to the home through Redis (``NodeLink.ask``) and queued there, so
back-pressure holds: the call returns when the message is in the session's queue, waiting
while the queue is full (at most ``SEND_TIMEOUT``, then ``QueueFull``).

**Outcomes.** The call returns the message's seq: it is queued. Or it raises, and the error
says whether the message may have been queued:

- *not queued*, certainly: ``SessionClosed`` (no such session, or its node is gone),
  ``QueueFull`` (the home gave up waiting for room), ``ProtocolError``, ``MessageTooLarge``,
  ``BrokerUnavailable`` (Redis failed before the request was written to it: nobody got it);
- *perhaps queued*: ``DeliveryUnknown``: the request was written to Redis and its answer did
  not come (Redis stalled or lost the connection after the request, the home stalled, this
  node stopped while waiting).

**The race between the two ends.** The home waits for room at most ``wait`` seconds (carried
in the request), then answers ``QueueFull`` and never queues the message afterwards; the
asking node waits for the answer ``wait + REPLY_GRACE``, starting once Redis has passed the
request on (so after the home started waiting). A refusal therefore reaches the asker before
its own timeout unless the answer was really lost or held up for ``REPLY_GRACE``: only then
is the outcome unknown.

**Idempotency keys.** ``send_to(..., key=k)``: the home remembers, per session, the keys of
messages it queued, with their seq, for ``KEY_WINDOW`` seconds (from the first send) and at
most ``KEYS_PER_SESSION`` keys (the oldest forgotten first); the memory goes with the session.
A send with a key it remembers for the same channel queues nothing and returns the first
send's seq; while that first send still waits for room, the repeat waits for its outcome. A
send that was refused leaves no key behind, so a retry after a refusal tries again. This is
what makes a retry after ``DeliveryUnknown`` safe; it holds for a session on this node too.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from ..engine.channels import Registry
from ..engine.engine import Engine
from ..engine.session import Session
from ..engine.topics import encode_payload
from ..errors import (
    DeliveryUnknown,
    ErrorCode,
    MessageTooLarge,
    ProtocolError,
    QueueFull,
    RubrisError,
    SessionClosed,
)
from ..protocol import Mode
from .nodes import Abandoned, Head, MaybeSent, NodeGone, NodeLink, NoReply

SEND = "send"
SEND_TIMEOUT = 30.0
"""Seconds a send may wait for room in the session's queue (then ``QueueFull``)."""
REPLY_GRACE = 5.0
"""Seconds the asking node waits for the home's answer beyond ``SEND_TIMEOUT`` (then
``DeliveryUnknown``): the answer's trip back through Redis, with room for a stall."""
KEY_WINDOW = 300.0
"""Seconds a session's home remembers an idempotency key, from the first send with it."""
KEYS_PER_SESSION = 1024
"""Idempotency keys remembered per session at most (about 200 bytes each)."""
MAX_KEY = 200
"""Characters an idempotency key may have at most."""

_ERRORS: dict[str, type[RubrisError]] = {
    "SessionClosed": SessionClosed,
    "QueueFull": QueueFull,
    "MessageTooLarge": MessageTooLarge,
}

Send = Callable[[Session, str, Any], Awaitable[int]]
_Keys = OrderedDict[tuple[str, str], tuple[float, asyncio.Future[int]]]
"""A session's remembered keys: (channel, key) -> (when first sent, the outcome), oldest
first."""


class RemoteSends:
    """Sends by session id, both ends: asking the session's node, and answering other nodes."""

    def __init__(self, engine: Engine, registry: Registry, nodes: NodeLink, send: Send) -> None:
        self.engine = engine
        self.registry = registry
        self.nodes = nodes
        self._send = send
        self._keys: weakref.WeakKeyDictionary[Session, _Keys] = weakref.WeakKeyDictionary()

    def serve(self) -> None:
        self.nodes.on(SEND, self._answer)

    async def send_to(self, session_id: str, name: str, value: Any, key: str | None = None) -> int:
        if key is not None and (not isinstance(key, str) or not 0 < len(key) <= MAX_KEY):
            raise ValueError(f"an idempotency key is a str of 1 to {MAX_KEY} characters")
        s = self.engine.sessions.get(session_id)
        if s is not None:
            return await self._queue_once(s, name, value, key, SEND_TIMEOUT)
        home = self.nodes.home_of(session_id)
        if not home:
            raise SessionClosed(f"no session {session_id[:24]!r} (ended, or never was)")
        found = self.registry.match(name)
        if found is None or found[0].mode != Mode.PRIVATE:
            raise ProtocolError(f"no private channel matches {name!r}", ErrorCode.UNKNOWN)
        payload = encode_payload(value, found[0].codec)  # bytes pass through on the other node
        head: Head = {"sid": session_id, "name": name, "wait": SEND_TIMEOUT}
        if key is not None:
            head["key"] = key
        maybe = f"send to {session_id[:24]!r}: may have been delivered"
        try:
            reply, _ = await self.nodes.ask(home, SEND, head, payload, SEND_TIMEOUT + REPLY_GRACE)
        except Abandoned:  # before NodeGone, its base: the request went out
            raise DeliveryUnknown(f"{maybe} (this node stopped waiting)") from None
        except NodeGone:  # nobody received the request
            raise SessionClosed(f"session {session_id[:24]!r}: its node is gone") from None
        except MaybeSent as exc:  # before BrokerUnavailable (its base), which is a refusal
            raise DeliveryUnknown(f"{maybe} (Redis failed after the request: {exc})") from exc
        except NoReply as exc:
            raise DeliveryUnknown(f"{maybe} (no answer: {exc})") from None
        except RuntimeError as exc:  # the home failed unexpectedly: it may have got that far
            raise DeliveryUnknown(f"{maybe} ({exc})") from exc
        failed = reply.get("failed")
        if failed is not None:
            message = str(reply.get("message", ""))
            error = _ERRORS.get(failed)
            if error is not None:
                raise error(message)
            raise ProtocolError(message, ErrorCode(int(reply.get("code", ErrorCode.PROTOCOL))))
        return int(reply["seq"])

    async def _answer(self, head: Head, body: bytes) -> tuple[Head, bytes]:
        sid = str(head.get("sid"))
        s = self.engine.sessions.get(sid)
        key = head.get("key")
        try:
            if s is None:
                raise SessionClosed(f"no session {sid[:24]!r} on this node")
            wait = float(head.get("wait", SEND_TIMEOUT))
            name = str(head.get("name"))
            seq = await self._queue_once(s, name, body, key if isinstance(key, str) else None, wait)
        except ProtocolError as exc:
            return {"failed": "ProtocolError", "code": int(exc.code), "message": str(exc)}, b""
        except RubrisError as exc:
            return {"failed": type(exc).__name__, "message": str(exc)}, b""
        return {"seq": seq}, b""

    async def _queue_once(
        self, s: Session, name: str, value: Any, key: str | None, wait: float
    ) -> int:
        """Queue ``value`` unless ``key`` says it was queued already (then its seq)."""
        if key is None:
            return await self._queue(s, name, value, wait)
        loop = asyncio.get_running_loop()
        seen = self._keys.get(s)
        if seen is None:
            seen = self._keys[s] = OrderedDict()
        k = (name, key)
        while True:
            now = loop.time()
            entry = seen.get(k)
            if entry is None or now - entry[0] >= KEY_WINDOW:
                break
            try:  # queued: its seq at once; still waiting for room: the same outcome
                return await asyncio.shield(entry[1])
            except asyncio.CancelledError:
                if not entry[1].cancelled():
                    raise  # this call was cancelled
                # the first send's caller gave up before it was queued: this one tries
        seen.pop(k, None)
        while seen and (
            len(seen) >= KEYS_PER_SESSION or now - next(iter(seen.values()))[0] >= KEY_WINDOW
        ):
            seen.popitem(last=False)
        outcome: asyncio.Future[int] = loop.create_future()
        mine = (now, outcome)
        seen[k] = mine
        try:
            seq = await self._queue(s, name, value, wait)
        except BaseException as exc:
            if seen.get(k) is mine:  # not queued: a retry must try again
                del seen[k]
            if isinstance(exc, Exception):
                outcome.set_exception(exc)
                outcome.exception()  # retrieved: nobody may be waiting for it
            else:
                outcome.cancel()
            raise
        outcome.set_result(seq)
        return seq

    async def _queue(self, s: Session, name: str, value: Any, wait: float) -> int:
        """``send``, waiting for room at most ``wait`` seconds (then ``QueueFull``, and the
        message is not queued: ``send`` is cancelled while it waits, never after it queued)."""
        try:
            return await asyncio.wait_for(self._send(s, name, value), wait)
        except asyncio.TimeoutError:
            q = s.private(name)
            if q is not None:  # a wake-up this waiter got as it timed out goes to the next one
                q.wake_waiters()
            raise QueueFull(f"{name}: still full after {wait:g} s") from None
