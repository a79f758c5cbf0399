"""The intake: publishes from outside the process, bounded, drained by the cycle.

Messages that arrive from other programs (the HTTP API, a client's PUBLISH) do not go straight
into their topics: they wait here, per topic in arrival order, and each scheduler cycle moves
them on. A ring topic with subscribers takes **one message a cycle**, which is exactly what its
subscribers can take (a cycle gives each of them at most one message of the topic), so a
publisher faster than the subscribers fills the intake instead of lapping every subscriber's
ring; one without subscribers takes everything waiting (there is nobody to lap). A snapshot
topic takes everything waiting at once and keeps the last value (snapshots conflate anyway).

The intake is bounded twice, by messages (``Limits.intake_messages``) and by payload bytes
(``Limits.intake_bytes``); its **fill** is the larger of the two ratios, 0-100 %. A request is
taken whole or not at all (:meth:`Intake.room`), so whatever was accepted is never dropped: it
reaches its topic in order. The fill is the flow-control signal of the source document on
backpressure: the HTTP API reports it on every answer, and sessions that published in the last
second get FLOW(fill) when it crosses 50, 75, 87 or 100 % upward and once more when it falls
back below 50 % (protocol.md section 8).

In-process ``Rubris.publish`` does not come through here: it stays O(1) and immediate. Nor does
a client's PUBLISH to a queue topic: the item goes straight into its queue, whose producers are
told the queue's fill by the same rule and levels (``flow_level``, ``RECENT``;
queues/producers.py).
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, replace

from .topics import SNAPSHOT, SharedTopic

log = logging.getLogger("rubris_asgi")

FLOW_LEVELS = (100, 87, 75, 50)
"""Fill levels whose upward crossing sends FLOW to recent publishers (protocol.md section 8)."""
RECENT = 1.0
"""A session that published within this many seconds is told about the fill."""


def flow_level(fill: int) -> int:
    """The highest FLOW level at or below ``fill`` (0 below 50 %)."""
    for level in FLOW_LEVELS:
        if fill >= level:
            return level
    return 0


class FlowWatch:
    """Who published lately, and the FLOW level they were last told (protocol.md section 8).

    ``check(fill)`` calls ``flow(fill, publishers)`` with the publishers of the last
    ``RECENT`` seconds when the fill crosses a level upward or falls back below 50 %, and
    returns how many were told. The intake keeps one; so does each queue that clients PUBLISH
    items to (queues/producers.py). Bounded: publishers older than ``RECENT`` are forgotten
    whenever a FLOW goes out, so it holds the sessions that published lately.

    >>> told = []
    >>> w = FlowWatch(lambda fill, ps: told.append((fill, ps)), clock=lambda: 0.0)
    >>> w.published("s1"); w.check(60), w.check(70), w.check(20)
    (1, 0, 1)
    >>> told
    [(60, ['s1']), (20, ['s1'])]
    """

    __slots__ = ("level", "recent", "_flow", "_clock")

    def __init__(
        self, flow: Callable[[int, list[Hashable]], None], clock: Callable[[], float]
    ) -> None:
        self.level = 0
        """The FLOW level the publishers were last told (0: below 50 %)."""
        self.recent: dict[Hashable, float] = {}
        """Publishers and when each last published."""
        self._flow = flow
        self._clock = clock

    def published(self, publisher: Hashable, now: float | None = None) -> None:
        self.recent[publisher] = self._clock() if now is None else now

    def check(self, fill: int) -> int:
        """Tell the recent publishers ``fill`` if it crossed a level (O(1) when it did not)."""
        level = flow_level(fill)
        old = self.level
        if level == old:
            return 0
        self.level = level
        if level < old and level:
            return 0  # falling, still above 50 %: nothing to say yet
        now = self._clock()
        recent = self.recent
        for key in [k for k, at in recent.items() if now - at > RECENT]:
            del recent[key]  # keeps the table as small as the set of active publishers
        if recent:
            self._flow(fill, list(recent))
        return len(recent)


class Backlogged(Exception):
    """Raised by a relay for a ``TAKEN`` message it has no room for now: its outbox holds as
    much as outside publishers may fill (the rest is kept for the application's own
    publishes). Nothing is refused: the intake keeps the message, first in its topic's line,
    and moves it on after the broker's ``EngineEvents.room_made`` (membership.py). So what
    outside publishers send waits in the intake, which is bounded and refuses whole requests
    (429), never in an outbox past its bound."""


@dataclass
class IntakeStats:
    """Counters of the intake (``Rubris.stats().intake``)."""

    accepted: int = 0
    """Messages taken in."""
    refused: int = 0
    """Messages refused because the whole request did not fit."""
    published: int = 0
    """Messages moved on into their topics (snapshot values conflated away are not counted)."""
    conflated: int = 0
    """Snapshot values replaced by a later one before they reached their topic."""
    flows: int = 0
    """FLOW messages sent to publishing sessions."""
    pending: int = 0
    """Messages waiting now."""
    fill: int = 0
    """Fill now, 0-100 %."""


class Intake:
    """Per-topic FIFO queues of encoded payloads, bounded by count and bytes.

    Args:
        max_messages / max_bytes: the bounds.
        publish: ``f(topic, payload, stamp)``, called by :meth:`drain` (the engine's publish;
            ``stamp`` is when the message arrived here, for publish-to-frame).
        wake: called when messages arrive, so an idle scheduler runs a cycle.
        flow: ``f(fill, publishers)``, called when the fill crosses a FLOW level.
        clock: a monotonic clock (for "published in the last second").
    """

    def __init__(
        self,
        max_messages: int,
        max_bytes: int,
        *,
        publish: Callable[[SharedTopic, bytes, float], object],
        wake: Callable[[], None],
        flow: Callable[[int, list[Hashable]], None],
        clock: Callable[[], float],
    ) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._publish = publish
        self._wake = wake
        self._clock = clock
        self.queues: dict[SharedTopic, deque[tuple[bytes, float]]] = {}
        """Per topic: (payload, arrival time), in arrival order."""
        self.count = 0
        self.bytes = 0
        self.blocked = False
        """The relay had no room for the message first in line (``Backlogged``): the cycles
        leave the intake alone until :meth:`unblock`."""
        self._watch = FlowWatch(flow, clock)
        self.stats = IntakeStats()

    @property
    def fill(self) -> int:
        """How full the intake is, 0-100 %: the larger of its count and byte ratios."""
        by_count = self.count * 100 // self.max_messages
        by_bytes = self.bytes * 100 // self.max_bytes
        return min(100, max(by_count, by_bytes))

    def room(self, messages: int, nbytes: int) -> bool:
        """Whether ``messages`` messages of ``nbytes`` payload bytes fit now, all of them."""
        return self.count + messages <= self.max_messages and self.bytes + nbytes <= self.max_bytes

    def put_all(
        self, entries: Iterable[tuple[SharedTopic, bytes]], publisher: Hashable | None = None
    ) -> None:
        """Take ``entries`` in order. The caller has checked :meth:`room` for all of them."""
        queues = self.queues
        n = 0
        size = 0
        now = self._clock()
        for topic, payload in entries:
            q = queues.get(topic)
            if q is None:
                q = queues[topic] = deque()
            q.append((payload, now))
            n += 1
            size += len(payload)
        self.count += n
        self.bytes += size
        self.stats.accepted += n
        if publisher is not None:
            self._watch.published(publisher, now)
        if n:
            self._check_flow()
            self._wake()

    def refused(self, messages: int) -> None:
        self.stats.refused += messages

    def drain(self) -> None:
        """Move messages on into their topics: one per ring topic that has subscribers, all of
        one that has none, the last value of a snapshot topic.

        Called by the scheduler at the start of each cycle, so what is published here is
        delivered in the same cycle. A distributed broker's relay with no room for more
        (``Backlogged``) stops the drain: the message stays first in its topic's line, the
        topics served go to the back of the order (the next drain starts with the others),
        and the intake waits (``blocked``) until :meth:`unblock`.
        """
        publish = self._publish
        emptied: list[SharedTopic] = []
        served: list[SharedTopic] = []
        moved = 0
        conflated = 0
        size = 0
        for topic, q in self.queues.items():
            if topic.mode == SNAPSHOT and len(q) > 1:
                conflated += len(q) - 1
                for p, _ in itertools.islice(q, len(q) - 1):
                    size += len(p)
                last = q.pop()
                q.clear()
                q.append(last)
            take = len(q) if topic.mode == SNAPSHOT or not topic.subs else 1
            # (a ring without subscribers takes everything now: nobody to lap)
            for _ in range(take):
                payload, stamp = q[0]
                try:
                    publish(topic, payload, stamp)
                except Backlogged:
                    self.blocked = True
                    break
                except Exception:  # checked at the door; a failure must not stop the cycle
                    log.exception("intake: publishing to %s failed", topic.name)
                q.popleft()
                moved += 1
                size += len(payload)
            if not q:
                emptied.append(topic)
            if self.blocked:
                break
            served.append(topic)
        for topic in emptied:
            del self.queues[topic]
        if self.blocked:
            queues = self.queues
            for topic in served:  # to the back: the others go first next time
                if topic in queues:
                    queues[topic] = queues.pop(topic)
        self.count -= moved + conflated
        self.bytes -= size
        self.stats.published += moved
        self.stats.conflated += conflated
        self._check_flow()

    def unblock(self) -> None:
        """The relay has room again: drain at the next cycle."""
        if self.blocked:
            self.blocked = False
            if self.count:
                self._wake()

    def _check_flow(self) -> None:
        self.stats.flows += self._watch.check(self.fill)

    def snapshot(self) -> IntakeStats:
        """A copy of the counters with ``pending`` and ``fill`` as they are now."""
        return replace(self.stats, pending=self.count, fill=self.fill)
