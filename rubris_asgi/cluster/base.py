"""``Broker``: where a node's shared publishes are numbered, and how every node hears them.

A *node* is one started ``Rubris`` (a worker process). Alone, a node numbers its own topics:
that is the ``LocalBroker``, the default, which adds nothing to the path of a publish (the
engine stores the message in its topic at once, O(1)). Several nodes share a *distributed*
broker (``RedisBroker``): its start hands the engine a relay (``Membership``, engine/membership.py)
so every shared publish goes to it; it numbers
each message once for all nodes (same seq, same epoch everywhere), keeps the ring and the
snapshot where every node can read them, and hands each message back to every node that
*follows* its topic (has subscribers to it) through ``engine.apply``, in seq order.

The engine knows nothing of this but the relay and ``apply``; the dispatcher awaits
``follow(topic)`` before a subscriber reads a topic's state, and the HTTP API asks
``unavailable()`` before its intake takes messages it must then never lose (the intake keeps
them until the broker's relay has room: engine/intake.py, ``Backlogged``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..engine.keyed.topic import KeyedTopic
from ..engine.membership import Change, EngineEvents, Membership
from ..engine.topics import SharedTopic
from .nodes import (
    SESSION_MARK,
    Abandoned,
    Head,
    MaybeSent,
    NodeGone,
    NodeLink,
    NoReply,
    node_of,
)

__all__ = [  # the requests' names as they were, before the node link had a module of its own
    "SESSION_MARK",
    "Abandoned",
    "Broker",
    "BrokerStats",
    "Head",
    "LocalBroker",
    "MaybeSent",
    "NodeGone",
    "NodeLink",
    "NoReply",
    "node_of",
]

ENV = "RUBRIS_REDIS_URL"
"""The setting that makes every worker share its topics through that Redis."""
WORKERS_ENV = "RUBRIS_WORKERS"
"""Set by ``serve(workers=N)`` for its workers: a ``Rubris`` alone (no broker) refuses to start
under several, as each would serve its own topics and a publish would reach a part of them."""


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
    pending_peak: int = 0
    """The most publishes the outbox held at once since the start (never over its bound)."""
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
    forfeits: int = 0
    """Times this node found the others had taken it for dead (paused or cut off past
    ``node_timeout``): the queue items it held were theirs to give back, and its consumers'
    deliveries were revoked."""
    changes_pending: int = 0
    """Changes of keyed topics waiting to be numbered now (the table outbox)."""
    changes_refused: int = 0
    """Changes of keyed topics the broker did not make with nobody waiting for its answer
    (past ``max_keys``; a patch merged again too often): each logged."""
    tables_reset: int = 0
    """Keyed topics read again whole because the broker forgot deletes this node had not
    heard (their subscribers got RESET and the whole table)."""
    members_pending: int = 0
    """Presence counts of this node waiting to be written to the broker now."""


KINDS = ("work-queue topics", "keyed topics", "presence")
"""What an app's channels may ask of a broker besides shared topics (``Broker.lacks``)."""


class Broker:
    """The base class of brokers; also what a broker must do, method by method."""

    distributed: ClassVar[bool] = False
    """True when other nodes share the numbering (publishes go through the relay its ``start``
    hands the engine)."""

    def __init__(self) -> None:
        self.counters = BrokerStats()
        self.node = ""
        """This node's id among the others ("" alone); what its session ids start with."""
        self.nodes = NodeLink()
        """The requests between this node and the others (alone: nobody to ask)."""

    def holds(self, what: str) -> None:
        """Told before ``start`` that ``what`` (work-queue items) will be kept through this
        broker: one that could lose it refuses to start. Alone, nothing is kept elsewhere."""

    def lacks(self, needs: set[str]) -> set[str]:
        """Of ``needs`` (``KINDS``: what the app's channels ask of it), what this broker cannot
        keep for several nodes: the app refuses to start with them (``Rubris.start``) rather
        than keep them on each node alone. Every broker here keeps everything but the Redis
        Cluster one, which keeps shared topics and private messages so far."""
        return set()

    async def start(self, events: EngineEvents) -> Membership | None:
        """Connect (raise ``BrokerUnavailable`` if that fails) and start hearing; what the
        engine joins (``Engine.join``): the relay of its shared publishes, its session ids'
        mark, its queues' home. None alone: the engine numbers its own topics."""
        return None

    async def stop(self) -> None:
        """Send what waits (within a bound) and disconnect."""

    async def follow(self, topic: SharedTopic) -> None:
        """Make ``topic``'s state the broker's (epoch, seq, ring or snapshot) and keep it so
        while it has subscribers here. Raises ``BrokerUnavailable`` when that cannot be done."""

    def follows(self, name: str) -> bool:
        """Whether the topic ``name`` is followed for other nodes (the engine keeps it while
        it is). Alone: never."""
        return False

    def accepting(self, messages: int, nbytes: int) -> bool:
        """Whether ``messages`` publishes of ``nbytes`` would be taken now, all of them."""
        return True

    def unavailable(self, name: str | None = None) -> str | None:
        """Why the broker takes no publishes or items now (Redis unreachable, or refusing
        writes), or None when it does: what the HTTP API's 503 and a REJECTED 6 say. What
        the intake takes while it does is kept until the broker can take it. With ``name``,
        for that topic (a Redis Cluster's broker refuses only the topics of a master that
        is away)."""
        return None

    async def numbered(self, topic: SharedTopic, payload: bytes, compressed: bool) -> int:
        """Publish an encoded payload and wait until it is numbered; its seq. Raises
        ``BrokerUnavailable`` when it cannot be taken."""
        raise NotImplementedError

    async def numbered_change(self, topic: KeyedTopic, change: Change) -> int:
        """Take a change of a keyed topic (prepared by the engine: ``Engine.set_change`` and
        the others) and wait until it is decided and numbered; its seq (a set of the value
        held: the key's; a delete of a key not held: 0; a replace: the head after it). Raises
        ``TableFull`` past ``max_keys`` (nothing changed), ``BrokerUnavailable`` when it
        cannot be taken. Alone, the engine changes its tables itself."""
        raise NotImplementedError

    def sweep(self, now: float) -> None:
        """Periodic upkeep (every few seconds): stop following topics left without
        subscribers, keep the followed ones alive in the broker."""

    def stats(self) -> BrokerStats:
        return self.counters


class LocalBroker(Broker):
    """One node: the engine numbers its own topics. Nothing to connect, nothing to follow,
    and ``Rubris.publish_async`` publishes at once without asking it."""
