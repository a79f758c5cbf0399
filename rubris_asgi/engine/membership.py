"""The seam between the engine and the other nodes: what each hands the other, typed.

A node alone needs none of this: the engine numbers its own publishes. When several nodes share
their topics, a broker (``rubris_asgi.cluster``) is started with the engine seen as
:class:`EngineEvents` (what a broker may do to it: put a numbered message in place, restart a
topic, and read what it must follow), and hands back a :class:`Membership`: the relay every
shared publish goes through, the mark of this node's session ids, and where queue items live.
The engine holds the membership from :meth:`Engine.join` to :meth:`Engine.leave`; nothing else
of the engine is written from outside.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

from .keyed.presence import PresenceBook
from .queues import QueueHome, QueueItem, QueueTopic
from .topics import SharedTopic


class Relayed(IntEnum):
    """How a publish comes to the relay: what the broker may do with it."""

    PUBLISH = 0
    """A publish a broker may refuse (``BrokerUnavailable``)."""
    FIRST = 1
    """A first value: numbered only if the topic has no message yet; may be refused."""
    TAKEN = 2
    """A message the intake took earlier: promised, so never refused; but a relay whose
    outbox holds what outside publishers may fill raises ``Backlogged``, and the intake keeps
    it until :meth:`EngineEvents.room_made` (intake.py)."""
    IF_FOLLOWED = 3
    """Numbered only if some node follows (or followed) the topic: a change nobody may watch
    (``batch.{id}``) costs the broker no key; may be refused."""


class Relay(Protocol):
    """``relay(topic, payload, compressed, how)``: take a shared publish to be numbered by the
    broker; returns 0 (its seq is not known yet). The message comes back through
    :meth:`EngineEvents.apply` on every node that follows the topic, this one included."""

    def __call__(self, topic: SharedTopic, payload: bytes, compressed: bool, how: int) -> int: ...


class EngineEvents(Protocol):
    """What a broker may do to the engine (the engine is one), and read of it."""

    @property
    def topics(self) -> Mapping[str, SharedTopic]:
        """The shared topics, by name: the ones to follow and catch up."""

    @property
    def queues(self) -> Mapping[str, QueueTopic]:
        """The work-queue topics made so far, by name."""

    @property
    def clock(self) -> Callable[[], float]:
        """The engine's clock (seconds)."""

    def apply(self, t: SharedTopic, seq: int, data: bytes, compressed: bool) -> None:
        """Store a message the broker numbered ``seq``."""

    def restart_topic(self, t: SharedTopic, epoch: int) -> None:
        """The broker numbers ``t`` afresh as ``epoch``: forget what it held."""

    def forfeit(self, q: QueueTopic) -> list[QueueItem]:
        """This node was taken for dead by the others, who gave the items it held back: take
        back what its consumers hold of ``q`` (REVOKE), and return those items."""

    def room_made(self) -> None:
        """The relay, which raised ``Backlogged`` since, has room again: the intake moves on."""


@dataclass(frozen=True)
class Membership:
    """What a started distributed broker hands the engine (``Engine.join``)."""

    relay: Relay
    """Where every shared publish goes to be numbered."""
    session_prefix: str
    """What this node's session ids start with (its node id and a mark)."""
    queue_home: QueueHome | None = None
    """Where work-queue topics keep their waiting items (None: here)."""
    presence: PresenceBook | None = None
    """Where the members of watched topics are added up across nodes (None: here alone)."""
