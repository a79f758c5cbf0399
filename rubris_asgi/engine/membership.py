"""The seam between the engine and the other nodes: what each hands the other, typed.

A node alone needs none of this: the engine numbers its own publishes. When several nodes share
their topics, a broker (``rubris_asgi.cluster``) is started with the engine seen as
:class:`EngineEvents` (what a broker may do to it: put a numbered message in place, restart a
topic, and read what it must follow), and hands back a :class:`Membership`: the relay every
shared publish goes through, the mark of this node's session ids, and where queue items live.
The engine holds the membership from :meth:`Engine.join` to :meth:`Engine.leave`; nothing else
of the engine is written from outside.

Keyed topics cross the seam as :class:`Change` (one set, merge, delete or replace prepared here:
encoded, diffed and compressed once) on the way out, through the membership's ``tables`` relay,
and as :data:`Heard` (one change the broker numbered) on the way back, through
:meth:`EngineEvents.apply_entries`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol

from ..config import Config
from .keyed.presence import PresenceBook
from .keyed.topic import KeyedTopic
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


Rebase = Callable[[bytes | None], tuple[bytes, bool, tuple[bytes, bool] | None]]
"""A merge made again on the value the broker holds for its key (None: none, or deleted): its
SET payload, whether that is deflated, and its PATCH payload (None: not worth one)."""


@dataclass(slots=True)
class Change:
    """One change of a keyed topic, prepared on the node that makes it (encoded, its PATCH
    diffed under the 50 % rule, deflated), for a broker to decide and number where every node's
    changes meet. What depends on the table as it is there (a set of the value held changes
    nothing, a delete of a key not held, ``max_keys``, whether the PATCH still applies, the
    base of a merge) is the broker's to decide: this node's copy may be behind."""

    op: str
    """``"S"`` set, ``"M"`` merge (a patch: only on the value of ``prev``), ``"D"`` delete,
    ``"R"`` replace (``table``)."""
    key: str = ""
    data: bytes = b""
    """The SET payload: the entry's whole new value (deflated when ``compressed``)."""
    compressed: bool = False
    patch: tuple[bytes, bool] | None = None
    """The PATCH payload from the value of ``prev`` (deflated?), where one pays."""
    prev: int = 0
    """The seq of the key's change this node held when it made this one (0: none): what the
    PATCH applies to, and what a merge was made on."""
    epoch: int = 0
    """The topic's epoch this node held: a ``prev`` of another numbering means nothing."""
    rebase: Rebase | None = None
    """A merge's: make it again on the value the broker holds (``prev`` was not it)."""
    table: list[Change] = field(default_factory=list)
    """A replace's: a set (op ``"S"``) for every key of the new table."""

    @property
    def size(self) -> int:
        """The bytes it holds while it waits to be numbered."""
        patch = self.patch
        own = len(self.key) + len(self.data) + (0 if patch is None else len(patch[0]))
        return own + sum(c.size for c in self.table)


class TableRelay(Protocol):
    """``tables(topic, change)``: take a change of a keyed topic to be decided and numbered by
    the broker (never waits). It comes back through :meth:`EngineEvents.apply_entries` on every
    node that follows the topic, this one included."""

    def __call__(self, t: KeyedTopic, change: Change) -> None: ...


Heard = tuple[int, str, int, bytes | None, bool, tuple[bytes, bool] | None]
"""A change of a keyed topic numbered by the broker: (seq, key, the seq of the key's change
before it there, the SET payload (None: deleted), deflated?, the PATCH payload from that
change, if one was made)."""


class EngineEvents(Protocol):
    """What a broker may do to the engine (the engine is one), and read of it."""

    @property
    def config(self) -> Config:
        """The engine's settings (keyed topics' ``max_keys`` and tombstones, the pool's size)."""

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

    def apply_entries(
        self, t: KeyedTopic, head: int, changes: Sequence[Heard], forgotten: int | None = None
    ) -> None:
        """Store ``changes`` of ``t`` the broker numbered (in seq order, each after ``t.seq``
        but the first of a whole table), then take ``head`` for the topic's head (its latest
        change may be a delete it forgot). ``forgotten`` given: the broker no longer knows
        every delete after ``t.seq`` (it forgot tombstones up to ``forgotten``), and
        ``changes`` are its whole table, to replace this one's; subscribers get RESET."""

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
    tables: TableRelay | None = None
    """Where every change of a keyed topic goes to be numbered (None: numbered here)."""
