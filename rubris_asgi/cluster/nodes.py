"""``NodeLink``: requests from one node to another, split out of the broker.

A node asks another (``ask``) to act on something only that node holds (a session, a
WebSocket it carries), and answers what others ask it (``on``). Which node holds a session is
written in the session's id (``home_of``). Alone, a node has nobody to ask: this base class is
that node; ``RedisNodeLink`` (cluster/redis/nodes.py) asks through Redis pub/sub. The broker
that shares the topics makes the link it needs (``Broker.nodes``), so both use one connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import BrokerUnavailable

Head = dict[str, Any]
"""The JSON head of a request between nodes."""
SESSION_MARK = "~"
"""Between the node's id and the rest of a session id, with a distributed broker: any node
knows from a session id where that session lives."""


class NodeGone(Exception):
    """The node asked is not listening: it has stopped, or died. Nobody received the request."""


class Abandoned(NodeGone):
    """This node stopped while waiting for a reply: the request was sent, and the other node
    may have acted on it."""


class NoReply(asyncio.TimeoutError):
    """The request was sent and no reply came within the timeout: the other node may have
    acted on it (the reply was lost, or is late). A ``TimeoutError``, never a sign that Redis
    is down."""


class MaybeSent(BrokerUnavailable):
    """Redis failed while the request was being written to it or read back: it may have
    reached the other node. (A failure before anything was written is a plain
    ``BrokerUnavailable``: nobody received the request.)"""


def node_of(session_id: str) -> str:
    """The node a session id names ("" when it names none: a node alone)."""
    node, mark, _ = session_id.partition(SESSION_MARK)
    return node if mark else ""


Handler = Callable[[Head, bytes], Awaitable[tuple[Head, bytes]]]
"""``handler(head, body) -> (head, body)``: how a node answers a request."""
Told = Callable[[str, bytes], None]
"""``told(node, body)``: a one-way message from ``node`` (``tell``), in the order it was told."""
Untold = Callable[[str, bool], None]
"""``untold(node, gone)``: what was told to ``node`` may not all have reached it: nobody
listens there (``gone``: the node has stopped or died), or Redis failed on the way. The
stream to that node is broken: whoever relies on its order starts over."""


class NodeLink:
    """One node's end of the requests between nodes; this base class: a node alone."""

    def __init__(self, node: str = "") -> None:
        self.node = node
        """This node's id among the others ("" alone); what its session ids start with."""

    def home_of(self, session_id: str) -> str:
        """The other node that holds the session ``session_id`` ("" for this node, or alone)."""
        node = node_of(session_id)
        return node if node != self.node else ""

    def on(self, op: str, handler: Handler) -> None:
        """Answer the requests ``op`` of other nodes with ``handler(head, body)``."""

    async def ask(
        self, node: str, op: str, head: Head, body: bytes, timeout: float
    ) -> tuple[Head, bytes]:
        """Ask another node (``on``'s handler there) and wait at most ``timeout`` seconds for
        its reply (the time to hand the request over comes on top, bounded by the
        connection's own timeout).

        What each failure says about the request, which matters to a caller whose request
        changes something there (``Rubris.send_to``): certainly not received by the other node:
        ``NodeGone`` (nobody listens for it), ``BrokerUnavailable`` but not ``MaybeSent``
        (Redis failed before the request was written); perhaps received and acted on:
        ``MaybeSent``, ``NoReply`` (no reply in time), ``Abandoned`` (this node stopped);
        ``RuntimeError``: the other node's handler failed."""
        raise NodeGone(f"no node {node}: this one is alone")

    def on_tell(self, op: str, told: Told, untold: Untold) -> None:
        """Hear the one-way messages ``op`` of other nodes with ``told``; learn of those told
        to another node that may be lost with ``untold``."""

    def tell(self, node: str, op: str, body: bytes) -> None:
        """Send ``body`` to ``node``'s ``told`` for ``op``, one way, without waiting.

        What one node tells another arrives in the order told, whole, at most once; what is
        told within one turn of the event loop goes out together. A message that may be lost
        (the node gone, Redis failing) is reported to ``untold`` rather than raised: the
        caller learns of it after the fact, like a socket's error. Alone: nobody to tell."""
        raise NodeGone(f"no node {node}: this one is alone")

    async def live(self) -> list[str]:
        """The nodes that beat recently, this one included. Alone: this one."""
        return [self.node]

    async def silent(self, node: str, seconds: float) -> bool:
        """Whether ``node`` has not beat for ``seconds`` (or never did, or left): a node that
        answers nothing for that long is dead to its sessions. Alone: never."""
        return False

    def close(self) -> None:
        """Fail what waits for a reply; stop answering."""
