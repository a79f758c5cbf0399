"""What the engine counts for operators, kept so that counting costs the hot path nothing.

Most figures an operator wants are counters the engine keeps anyway (``CycleStats``,
``PoolStats``, ``IntakeStats``, ``QueueStats``); they are read when someone looks (a scrape of
``/metrics``, the ops page) and never pushed anywhere. This module holds the few things that
were not counted yet: events outside the cycle (NAKs, blocked writes, closes, errors, sessions
opened), and the histograms:

``cycle``
    How long each scheduler cycle took: two clock reads per cycle.

``latency``
    Publish to frame, WebSocket sessions: how long a message of a shared topic waited between
    its publish (its arrival, for one that came through the intake) and the frame that carried
    it to a session. This is the latency and the skew the batching source document is about:
    subscribers of one topic get its message in the same cycle, so the spread of this histogram
    is the spread of the cycle. Timing every delivery would cost a clock read and a bucket
    search per message, so each cycle *samples* at most ``PROBES`` of the sessions it serves,
    evenly spread over the cycle, and times the first ``PROBE_SUBS`` of their pending shared
    topics. A sample stands for ``step`` sessions (its weight), so the histogram's count
    estimates deliveries. The time a sampled frame was handed over is interpolated between the
    cycle's start and end by the session's place in the cycle: no clock is read per frame.

``longpoll``
    The same, for long-poll sessions, kept apart because it measures something else: a
    long-poll session can be sent a frame only while one of its polls waits, and a frame takes
    at most one message of each topic, so a message also waits for the client to come back,
    once per message of its topic queued before it. On a topic published faster than the
    client polls, that queue and this figure grow while the server answers every poll at once;
    mixed into ``latency`` it made a server answering in milliseconds look seconds late.

``longpoll_ready``
    The server's part of ``longpoll``: from the later of the publish and the arrival of the
    poll that took the frame, to the frame. It is ``latency``'s counterpart for long-poll.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable

from .session import Session
from .topics import SharedTopic

CYCLE_BOUNDS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)
"""Upper bounds (seconds) of the cycle-duration buckets."""

LATENCY_BOUNDS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Upper bounds (seconds) of the publish-to-frame buckets."""
LONGPOLL_BOUNDS = (*LATENCY_BOUNDS, 30.0, 60.0, 120.0, 300.0, 600.0)
"""The same for long-poll's publish to frame, which waits for the client's polls: a client that
polls slower than its topic is published falls behind by minutes (quantiles stop at the last
bound, and a chart stuck at 10 s would hide that it keeps growing)."""

HISTOGRAMS = {
    "cycle_duration_seconds": "cycle",
    "publish_to_frame_seconds": "latency",
    "longpoll_publish_to_frame_seconds": "longpoll",
    "longpoll_ready_to_frame_seconds": "longpoll_ready",
}
"""The histograms by the name the snapshot, ``/metrics`` and the ops page give them -> the
attribute of ``Telemetry`` that holds it."""

PROBES = 16
"""Sessions sampled per cycle for publish-to-frame (all of them when a cycle serves fewer)."""
PROBE_SUBS = 8
"""Pending shared topics timed per sampled session."""


class Histogram:
    """Fixed buckets, Prometheus style: ``counts[i]`` holds samples <= ``bounds[i]`` and above
    the bound before; the last count is above every bound (+Inf). Not cumulative."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError("histogram bounds must be increasing")
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, weight: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += weight
        self.sum += value * weight
        self.count += weight

    def quantile(self, q: float) -> float | None:
        """An estimate of the ``q`` quantile as Prometheus' ``histogram_quantile`` makes it
        (linear inside the bucket); None without samples."""
        if not self.count:
            return None
        rank = q * self.count
        seen = 0
        lower = 0.0
        for i, n in enumerate(self.counts):
            if n and seen + n >= rank:
                if i == len(self.bounds):
                    return self.bounds[-1]
                return lower + (self.bounds[i] - lower) * (rank - seen) / n
            seen += n
            if i < len(self.bounds):
                lower = self.bounds[i]
        return self.bounds[-1]

    def as_dict(self) -> dict[str, object]:
        return {
            "bounds": list(self.bounds),
            "counts": list(self.counts),
            "sum": self.sum,
            "count": self.count,
        }


class Telemetry:
    """Counters of events outside the cycle, and the histograms (module docstring)."""

    __slots__ = (
        "cycle",
        "latency",
        "longpoll",
        "longpoll_ready",
        "retired_seqs",
        "topics_retired",
        "sessions_opened",
        "sessions_resumed",
        "naks",
        "blocked_writes",
        "failed_sends",
        "penalty_seconds",
        "closed_blocked",
        "closed_backlog",
        "errors",
        "api_refusals",
    )

    def __init__(self) -> None:
        self.cycle = Histogram(CYCLE_BOUNDS)
        self.latency = Histogram(LATENCY_BOUNDS)
        self.longpoll = Histogram(LONGPOLL_BOUNDS)
        self.longpoll_ready = Histogram(LATENCY_BOUNDS)
        self.retired_seqs = 0
        """The seqs of shared topics forgotten: their publishes, which ``published`` adds to
        the live topics' seqs (counted so, not per publish, to keep publish lean)."""
        self.topics_retired = 0
        """Topics forgotten because nobody needed them any more (``Engine.retire``)."""
        self.sessions_opened = 0
        self.sessions_resumed = 0
        self.naks = 0
        self.blocked_writes = 0
        """Frames the socket could not take at once (finished by a task of their own)."""
        self.failed_sends = 0
        """Blocked writes that took longer than ``blocked_after``: each one a penalty."""
        self.penalty_seconds = 0.0
        self.closed_blocked = 0
        """Sessions ended as slow consumers because a write stayed stuck for ``max_blocked``."""
        self.closed_backlog = 0
        """Sessions ended as slow consumers because their direct queue filled."""
        self.errors: Counter[tuple[str, int]] = Counter()
        """Protocol errors sent, by (GOODBYE / REJECTED / RESULT / http, protocol code)."""
        self.api_refusals: Counter[int] = Counter()
        """HTTP API requests refused, by status."""

    def timed(self, s: Session, at: float, stamp: float, weight: int) -> None:
        """A sampled delivery to ``s``: a message published at ``stamp`` went out in a frame
        handed over at ``at`` (the scheduler's probes; module docstring)."""
        if s.transport != "longpoll":
            self.latency.observe(max(0.0, at - stamp), weight)
            return
        self.longpoll.observe(max(0.0, at - stamp), weight)
        # a long-poll sink's ``last_seen`` is when its waiting poll came: before the frame
        # was handed over, the poll that takes it has not returned to set it again
        polled = getattr(s.sink, "last_seen", stamp)
        self.longpoll_ready.observe(max(0.0, at - max(stamp, polled)), weight)

    def published(self, topics: Iterable[SharedTopic]) -> int:
        """Messages stored in shared topics since start: the live ``topics``' seqs (a seq
        counts a topic's publishes) and the forgotten ones'."""
        return self.retired_seqs + sum(t.seq for t in topics)

    def error(self, kind: str, code: int) -> None:
        self.errors[(kind, int(code))] += 1
