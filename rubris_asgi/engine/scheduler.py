"""The cycle: coalesced, fair batches (the batching source document), in one place.

One publish reaching a thousand sockets::

    publish(topic, value)        encode + compress once; topic.publish() stores the PUSH bytes
        │                        and, once per cycle however many publishes, marks it dirty
        ▼
    run_cycle()  1. fan-out      each dirty topic's subscriptions join their session's ordered
                                 pending set; each such session joins the pending-client list
                 2. deal         each queue topic with items and free consumers hands items
                                 to its consumers' lanes in rotation (queues/topic.py)
                 3. timers       sessions whose penalty or NAK hold has passed re-join the list,
                                 subscriptions whose max_rate interval has passed their
                                 session's pending set
                 4. serve        each pending session that is READY gets one frame, built
                                 and handed to its transport (never awaited) by frames.py:
                                 its direct queue, then one message per pending topic

A cycle's cost is (sessions with work) × (their pending topics) plus the subscriptions of the
topics that changed; it never walks all connected sessions or all subscriptions. ``publish`` does
no fan-out. Clients that share a topic all get its message in the same cycle, because each
session takes at most one message per topic per cycle (no greedy draining that would let one
client race ahead of another: the source document's skew argument).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count, islice

from ..config import FlowConfig
from .buffers import WriterPool
from .flow import current_interval
from .frames import FrameBuilder
from .intake import Intake
from .keyed.topic import KeyedSub
from .queues import QueueSub, QueueTopic
from .session import Session, SessionState
from .telemetry import PROBE_SUBS, PROBES, Telemetry
from .topics import RING, SNAPSHOT, RatedSub, SharedTopic, Sub


@dataclass(slots=True)
class CycleStats:
    """Counters since start; ``Rubris.stats()`` exposes them."""

    cycles: int = 0
    frames: int = 0
    messages: int = 0
    bytes: int = 0
    deferred: int = 0
    """Messages that did not fit the frame after others and waited for the next cycle."""
    exhausted: int = 0
    """Sessions skipped in a cycle because the writer pool had no lease free."""
    gaps: int = 0


def _noop() -> None:
    return None


class Scheduler:
    """Pending sets and the cycle. Sans-IO: ``run_cycle()`` is a plain function call."""

    def __init__(
        self,
        pool: WriterPool,
        clock: Callable[[], float],
        flow: FlowConfig | None = None,
        telemetry: Telemetry | None = None,
        *,
        wake: Callable[[], None] = _noop,
        async_window: int = 128,
    ) -> None:
        """``wake()``: called when work arrives while the runner sleeps (``idle``)."""
        self.pool = pool
        self.clock = clock
        self.flow = flow or FlowConfig()
        self.dirty: list[SharedTopic] = []
        self.queues: list[QueueTopic] = []
        """Queue topics whose items or consumers changed: dealt at the next cycle's start."""
        self.clients: list[Session] = []
        self.timers: list[tuple[float, int, Session]] = []
        self.rated: list[tuple[float, int, RatedSub | KeyedSub]] = []
        """Subscriptions with a ``max_rate`` that had something to send before their time."""
        self._tie = count()
        self.stats = CycleStats()
        # each served session's frame
        self.frames = FrameBuilder(pool, self.stats, self._retry, self.client_pending, self.later)
        self.telemetry = telemetry or Telemetry()
        self.wake = wake
        self.idle = False
        self.intake: Intake | None = None
        """Publishes from outside the process, drained at the start of each cycle."""
        # the asynchronous-write window (WriterConfig.async_window): writes handed to a
        # server that completes them on its own threads, counted per slice of a cycle
        self.async_window = async_window
        self.writes_out = 0
        """Asynchronous writes of the current slice not yet done."""
        self.slice = 0
        self.paused = False
        """The last cycle stopped early with ``async_window`` writes out: let them settle."""
        self.settled: Callable[[], None] = _noop
        """Set by the async runner while it waits for a paused cycle's writes."""

    # notifications (O(1), coalesced)

    def topic_dirty(self, topic: SharedTopic) -> None:
        self.dirty.append(topic)
        if self.idle:
            self.idle = False
            self.wake()

    def queue_dirty(self, q: QueueTopic) -> None:
        self.queues.append(q)
        if self.idle:
            self.idle = False
            self.wake()

    def _retry(self, s: Session) -> None:
        """The pool had no lease for ``s``'s frame: the next cycle tries again."""
        if not s.queued:
            s.queued = True
            self.clients.append(s)

    def _dealt(self, sub: QueueSub) -> None:
        s: Session = sub.session  # type: ignore[assignment]
        s.pending[sub] = None
        self.client_pending(s)

    def later(self, sub: RatedSub | KeyedSub) -> None:
        """``sub`` has more, but not before ``sub.due`` (its ``max_rate``): back in its
        session's pending set then (one timer per subscription however often it is put off)."""
        if not sub.waiting:
            sub.waiting = True
            heapq.heappush(self.rated, (sub.due, next(self._tie), sub))

    def client_pending(self, s: Session) -> None:
        if not s.queued and not s.held:
            s.queued = True
            self.clients.append(s)
            if self.idle:
                self.idle = False
                self.wake()

    def intake_pending(self) -> None:
        if self.idle:
            self.idle = False
            self.wake()

    def hold(self, s: Session, until: float) -> None:
        """Keep ``s`` out of the cycles until ``until`` (penalty, NAK pacing)."""
        if until > s.hold_until:
            s.hold_until = until
        if not s.held:
            s.held = True
            heapq.heappush(self.timers, (s.hold_until, next(self._tie), s))
            if self.idle:
                # set between cycles (a blocked write ending): the loop sleeps on the timers
                # it knew of, perhaps none; it must look again or the session waits for
                # whatever work comes next
                self.idle = False
                self.wake()

    def write_started(self) -> int:
        """A transport's write completes later, on the server's threads; returns its slice."""
        self.writes_out += 1
        return self.slice

    def write_settled(self, slice_: int) -> None:
        """That write has ended. Writes of older slices no longer count: a stuck one (a slow
        client) holds up at most the slice it was handed over in."""
        if slice_ == self.slice:
            self.writes_out -= 1
            if self.paused and self.writes_out <= self.async_window // 2:
                self.settled()

    def next_slice(self) -> None:
        """The paused cycle goes on: a new slice, counting from zero."""
        self.paused = False
        self.slice += 1
        self.writes_out = 0

    def has_work(self) -> bool:
        return bool(
            self.dirty
            or self.queues
            or self.clients
            or (self.intake and self.intake.count and not self.intake.blocked)
        )

    def next_timer(self) -> float | None:
        timers, rated = self.timers, self.rated
        if rated and (not timers or rated[0][0] < timers[0][0]):
            return rated[0][0]
        return timers[0][0] if timers else None

    # the cycle

    def run_cycle(self) -> int:
        """Run one cycle; returns the number of frames handed to transports."""
        now = self.clock()
        stats = self.stats
        stats.cycles += 1
        intake = self.intake
        if intake is not None and intake.count and not intake.blocked:
            intake.drain()  # publishes here mark their topics dirty for this very cycle
        clients = self.clients

        queues = self.queues
        if queues:
            self.queues = []
            for q in queues:
                q.dirty = False
                q.deal(self._dealt)
                if q.producers is not None:  # items left: its PUBLISH producers' FLOW
                    q.producers.check()

        dirty = self.dirty
        if dirty:
            self.dirty = []
            for t in dirty:
                t.dirty = False
                for sub in t.subs:
                    s: Session = sub.session  # type: ignore[assignment]
                    s.pending[sub] = None
                    if not s.queued and not s.held:
                        s.queued = True
                        clients.append(s)

        timers = self.timers
        while timers and timers[0][0] <= now:
            _, _, s = heapq.heappop(timers)
            s.held = False
            if s.hold_until > now:  # the hold was extended after this timer was set
                self.hold(s, s.hold_until)
            elif not s.queued and s.has_work():
                s.queued = True
                clients.append(s)

        rated = self.rated
        while rated and rated[0][0] <= now:
            sub = heapq.heappop(rated)[2]
            sub.waiting = False
            s = sub.session  # type: ignore[assignment]
            if s.subs.get(sub.number) is sub and sub.has_more():
                s.pending[sub] = None
                if not s.queued and not s.held:
                    s.queued = True
                    clients.append(s)

        self.clients = []
        probes = self._probes(clients) if clients else None
        frames = 0
        window = self.async_window
        serve = self.frames.serve
        rest = iter(clients)
        for s in rest:
            s.queued = False
            if not s.ready or s.state is SessionState.CLOSED:
                continue  # the transport re-queues it when it can take a frame
            if s.hold_until > now:
                self.hold(s, s.hold_until)
                continue
            if serve(s, now):
                frames += 1
                if s.nak_interval:  # paced by its NAKs: its next frame waits
                    pause = current_interval(s, now, self.flow)
                    if pause:
                        self.hold(s, now + pause)
                if self.writes_out >= window:
                    # the server's threads have a window of writes: pause the cycle until
                    # they settle; the sessions not reached go first next time (still queued)
                    left = list(rest)
                    if left:
                        self.clients = left + self.clients
                        self.paused = True
                    break
        stats.frames += frames
        end = self.clock()
        self.telemetry.cycle.observe(end - now)
        if probes:
            self._timed(probes, now, end, len(clients))
        return frames

    # publish-to-frame samples (telemetry.py): a few sessions a cycle, nothing per frame

    @staticmethod
    def _probes(clients: list[Session]) -> list[tuple[int, list[tuple[Sub, int]]]]:
        """The sessions this cycle samples, by place, with their shared topics' cursors."""
        step = len(clients) // PROBES or 1
        probes = []
        for i in range(step - 1, len(clients), step):
            subs = [
                (sub, sub.cursor)
                for sub in islice(clients[i].pending, PROBE_SUBS)
                if sub.mode == RING or sub.mode == SNAPSHOT
            ]
            if subs:
                probes.append((i, subs))
        return probes

    def _timed(
        self, probes: list[tuple[int, list[tuple[Sub, int]]]], start: float, end: float, n: int
    ) -> None:
        """Record what the sampled sessions were sent: each moved cursor is one message.

        Replays are left out: a snapshot's first value and whatever was published before the
        session's connection began (a resume, a ring replay)."""
        timed = self.telemetry.timed  # by transport: long-poll waits for its polls
        weight = n // PROBES or 1
        span = end - start
        for i, subs in probes:
            at = start + span * (i + 1) / n  # when its frame was handed over, interpolated
            for sub, cursor in subs:
                if sub.cursor == cursor:
                    continue  # not served this cycle (not ready, held, frame full)
                t: SharedTopic = sub.topic  # type: ignore[assignment]
                if sub.mode == SNAPSHOT:
                    if not cursor:
                        continue
                    stamp = t.stamp
                else:  # the message at the old cursor, or the oldest held when it was lapped
                    stamp = t.stamps[max(cursor, t.seq - t.cap + 1) % t.cap]
                s: Session = sub.session  # type: ignore[assignment]
                if stamp >= s.attached_at:
                    timed(s, at, stamp, weight)
