"""How long topics live: how many a channel may have, and when one nobody needs is forgotten.

Topics are made by use: a publish, a SUBSCRIBE, a client's PUBLISH. Without an end, a handler
that accepts any name lets one client make the server keep topics (and their rings) for ever,
and a channel's flood refuse everyone else's new topics. So each channel has a bound
(``Channel.max_topics``), and a topic with no subscriber here is retired once nothing could
still need it:

- a shared topic that never held a message: ``EMPTY_GRACE`` after its last subscriber left
  (a moment for a publish still in the intake);
- one only clients made or fed (a SUBSCRIBE, a handler's first value, a client PUBLISH):
  ``session_timeout`` after its last publish or subscriber, the window in which a client that
  lost its session comes back and recovers;
- one the application publishes to (``SharedTopic.app``): its channel's ``keep`` after its
  last publish, for late joiners (None: for ever);
- a queue topic only clients made: once it has had no consumer for ``session_timeout``, holds
  no item, no producer waits for room and its last idempotency key is past the dedup window;
  those the application names (``QueueTopic.app``) are kept.

Only topics without subscribers are walked (``idle``, ``idle_queues``: kept up to date by the
engine as the last subscriber leaves), so a sweep costs nothing for the topics in use. A
shared topic a distributed broker still follows for other nodes is kept (``followed``).
"""

from __future__ import annotations

from collections.abc import Callable

from ..config import Config
from ..errors import ErrorCode, ProtocolError
from .channels import Channel
from .queues import QueueTopic
from .telemetry import Telemetry
from .topics import SharedTopic

EMPTY_GRACE = 5.0
"""Seconds a topic that never held a message is kept without subscribers."""


class Lifetimes:
    """The engine's topics, counted per channel, and the retirement of those nobody needs."""

    def __init__(
        self,
        config: Config,
        topics: dict[str, SharedTopic],
        queues: dict[str, QueueTopic],
        telemetry: Telemetry,
        clock: Callable[[], float],
    ) -> None:
        """``topics`` and ``queues``: the engine's own tables, which retirement removes from."""
        self.config = config
        self.topics = topics
        self.queues = queues
        self.telemetry = telemetry
        self.clock = clock
        self.idle: dict[SharedTopic, float] = {}
        """Shared topics without a subscriber here, since when."""
        self.idle_queues: dict[QueueTopic, float] = {}
        """Queue topics without a consumer, since when."""
        self.per_channel: dict[str, int] = {}
        """Topics alive per channel pattern (shared and queue)."""

    # made, left

    def admit(self, ch: Channel) -> None:
        """Refuse a new topic of ``ch`` past its ``max_topics`` (``ProtocolError`` 6)."""
        if self.per_channel.get(ch.pattern, 0) >= ch.max_topics:
            raise ProtocolError(
                f"too many topics of channel {ch.pattern} (limit {ch.max_topics})",
                ErrorCode.TOO_MANY,
            )

    def born(self, t: SharedTopic | QueueTopic, ch: Channel) -> None:
        """``t`` was made for ``ch`` (after ``admit``): counted, and idle until subscribed."""
        t.pattern = ch.pattern
        self.per_channel[ch.pattern] = self.per_channel.get(ch.pattern, 0) + 1
        if isinstance(t, SharedTopic):
            self.idle[t] = self.clock()
        else:
            self.idle_queues[t] = self.clock()

    def left(self, t: SharedTopic) -> None:
        """The last subscriber of ``t`` here left."""
        self.idle[t] = self.clock()

    def queue_left(self, q: QueueTopic) -> None:
        """The last consumer of ``q`` left."""
        self.idle_queues[q] = self.clock()

    def forget(self, t: SharedTopic) -> None:
        """Remove ``t`` now (it has no subscriber: the caller checked)."""
        del self.topics[t.name]
        self.idle.pop(t, None)
        self.telemetry.retired_seqs += t.seq  # its publishes still count (``published()``)
        self.telemetry.topics_retired += 1
        self._uncount(t.pattern)

    def _uncount(self, pattern: str) -> None:
        left = self.per_channel.get(pattern, 0) - 1
        if left > 0:
            self.per_channel[pattern] = left
        else:
            self.per_channel.pop(pattern, None)

    # retirement

    def retire(self, now: float, followed: Callable[[str], bool]) -> int:
        """Forget the topics nobody needs (the module's docstring); how many went."""
        return self._shared(now, followed) + self._queues(now)

    def _shared(self, now: float, followed: Callable[[str], bool]) -> int:
        window = self.config.timing.session_timeout
        done: list[SharedTopic] = []
        retired: list[SharedTopic] = []
        for t, since in self.idle.items():
            if t.subs or self.topics.get(t.name) is not t:
                done.append(t)  # subscribed again, or forgotten already: not idle now
                continue
            if t.seq == 0:
                keep: float | None = min(window, EMPTY_GRACE)
            else:
                keep = t.keep if t.app else window
            if keep is None or now - max(since, t.stamp) < keep or followed(t.name):
                continue
            retired.append(t)
        for t in done:
            del self.idle[t]
        for t in retired:
            self.forget(t)
        return len(retired)

    def _queues(self, now: float) -> int:
        window = self.config.timing.session_timeout
        idle = self.idle_queues
        done: list[QueueTopic] = []
        retired = 0
        for q, since in idle.items():
            if q.consumers or q.app or self.queues.get(q.name) is not q:
                done.append(q)  # consumed again, the application's, or forgotten already
                continue
            if now - since < window or q.home is not None or q.ready or q.waiters or q.active:
                continue  # too soon, its items in Redis, or something held or waiting
            ids = q.ids.ids
            if ids and next(reversed(ids.values())) > now - q.ids.window:
                continue  # a retried producer's key must still be recognised
            done.append(q)
            del self.queues[q.name]
            self._uncount(q.pattern)
            retired += 1
        for q in done:
            del idle[q]
        self.telemetry.topics_retired += retired
        return retired
