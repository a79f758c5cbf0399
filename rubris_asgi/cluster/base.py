"""``Broker``: where a node's shared publishes are numbered, and how every node hears them.

A *node* is one started ``Rubris`` (a worker process). Alone, a node numbers its own topics:
that is the ``LocalBroker``, the default, which adds nothing to the path of a publish (the
engine stores the message in its topic at once, O(1)). Several nodes share a *distributed*
broker (``RedisBroker``): it sets ``engine.relay`` so every shared publish goes to it, numbers
each message once for all nodes (same seq, same epoch everywhere), keeps the ring and the
snapshot where every node can read them, and hands each message back to every node that
*follows* its topic (has subscribers to it) through ``engine.apply``, in seq order.

The engine knows nothing of this but the relay and ``apply``; the dispatcher awaits
``follow(topic)`` before a subscriber reads a topic's state, and the HTTP API asks
``accepting()`` before its intake takes messages it must then never lose.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from ..engine.engine import Engine
from ..engine.topics import SharedTopic
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


@dataclass
class BrokerStats:
    """Counters of a broker (``Rubris.stats().broker``)."""

    up: bool = True
    """Whether publishes are taken now."""
    relayed: int = 0
    """Publishes handed to the broker to be numbered."""
    numbered: int = 0
    """Of those, numbered by it (a first value refused because the topic had one is not)."""
    refused: int = 0
    """Publishes refused with ``BrokerUnavailable`` (unreachable, or the outbox full)."""
    pending: int = 0
    """Publishes waiting to be numbered now (the outbox)."""
    received: int = 0
    """Messages heard from the broker and stored in a followed topic."""
    fetched: int = 0
    """Messages read from the broker's history to fill a hole (a reconnect, a follow)."""
    restarted: int = 0
    """Followed topics whose numbering the broker restarted (it lost them)."""
    following: int = 0
    """Topics this node follows now."""
    outages: int = 0
    """Times the connection to the broker was lost."""
    items_pending: int = 0
    """New queue items waiting to be sent to the broker now."""
    items_taken: int = 0
    """Queue items taken from the broker for this node's consumers."""
    items_reclaimed: int = 0
    """Queue items of dead nodes this node gave back to their queues."""


class Broker:
    """The base class of brokers; also what a broker must do, method by method."""

    distributed: ClassVar[bool] = False
    """True when other nodes share the numbering (publishes go through ``engine.relay``)."""

    def __init__(self) -> None:
        self.counters = BrokerStats()
        self.node = ""
        """This node's id among the others ("" alone); what its session ids start with."""

    def batch_store(self) -> Any:
        """The ``BatchStore`` the nodes sharing this broker share (``Rubris(batches=True)``
        with a distributed broker); alone, None: the embedded SQLite default."""
        return None

    def holds(self, what: str) -> None:
        """Told before ``start`` that ``what`` (work-queue items) will be kept through this
        broker: one that could lose it refuses to start. Alone, nothing is kept elsewhere."""

    def home_of(self, session_id: str) -> str:
        """The other node that holds the session ``session_id`` ("" for this node, or alone)."""
        if not self.distributed:
            return ""
        node = node_of(session_id)
        return node if node != self.node else ""

    def on(self, op: str, handler: Callable[[Head, bytes], Awaitable[tuple[Head, bytes]]]) -> None:
        """Answer the requests ``op`` of other nodes with ``handler(head, body)``."""

    async def ask(
        self, node: str, op: str, head: Head, body: bytes, timeout: float
    ) -> tuple[Head, bytes]:
        """Ask another node (``on``'s handler there) and wait at most ``timeout`` seconds for
        its reply (the time to hand the request to Redis comes on top, bounded by the
        connection's own timeout).

        What each failure says about the request, which matters to a caller whose request
        changes something there (``Rubris.send_to``): certainly not received by the other node:
        ``NodeGone`` (nobody listens for it), ``BrokerUnavailable`` but not ``MaybeSent``
        (Redis failed before the request was written); perhaps received and acted on:
        ``MaybeSent``, ``NoReply`` (no reply in time), ``Abandoned`` (this node stopped);
        ``RuntimeError``: the other node's handler failed."""
        raise NodeGone(f"no node {node}: this one is alone")

    async def start(self, engine: Engine) -> None:
        """Connect (raise ``BrokerUnavailable`` if that fails) and start hearing."""

    async def stop(self) -> None:
        """Send what waits (within a bound) and disconnect."""

    async def follow(self, topic: SharedTopic) -> None:
        """Make ``topic``'s state the broker's (epoch, seq, ring or snapshot) and keep it so
        while it has subscribers here. Raises ``BrokerUnavailable`` when that cannot be done."""

    def accepting(self, messages: int, nbytes: int) -> bool:
        """Whether ``messages`` publishes of ``nbytes`` would be taken now, all of them."""
        return True

    async def numbered(self, topic: SharedTopic, payload: bytes, compressed: bool) -> int:
        """Publish an encoded payload and wait until it is numbered; its seq. Raises
        ``BrokerUnavailable`` when it cannot be taken."""
        raise NotImplementedError

    def sweep(self, now: float) -> None:
        """Periodic upkeep (every few seconds): stop following topics left without
        subscribers, keep the followed ones alive in the broker."""

    def stats(self) -> BrokerStats:
        return self.counters


class LocalBroker(Broker):
    """One node: the engine numbers its own topics. Nothing to connect, nothing to follow,
    and ``Rubris.publish_async`` publishes at once without asking it."""
