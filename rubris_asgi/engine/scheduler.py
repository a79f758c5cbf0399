"""The cycle: coalesced, fair batches (the batching source document), in one place.

One publish reaching a thousand sockets::

    publish(topic, value)        encode + compress once; topic.publish() stores the PUSH bytes
        │                        and, once per cycle however many publishes, marks it dirty
        ▼
    run_cycle()  1. fan-out      each dirty topic's subscriptions join their session's ordered
                                 pending set; each such session joins the pending-client list
                 2. deal         each queue topic with items and free consumers hands items
                                 to its consumers' lanes in rotation (queues/topic.py)
                 3. timers       sessions whose penalty or NAK hold has passed re-join the list
                 4. serve        for each pending session that is READY: lease a buffer, take
                                 the direct queue first, then one message per pending topic
                                 (private and queue topics: up to their batch depth; a queue
                                 item is tagged as its ITEM is built into the frame); topics
                                 with more waiting rotate behind the ones not reached; stop when the
                                 buffer is full; hand the frame to the transport (never awaited)

A cycle's cost is (sessions with work) × (their pending topics) plus the subscriptions of the
topics that changed; it never walks all connected sessions or all subscriptions. ``publish`` does
no fan-out. Clients that share a topic all get its message in the same cycle, because each
session takes at most one message per topic per cycle (no greedy draining that would let one
client race ahead of another: the source document's skew argument).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice

from ..config import FlowConfig
from ..protocol import Gap, encode, encode_uv
from ..protocol.wire import BYTE
from .buffers import FrameBuffer, SizeClass, WriterPool
from .flow import current_interval
from .intake import Intake
from .queues import QueueSub, QueueTopic
from .session import Session, SessionState
from .telemetry import PROBE_SUBS, PROBES, Telemetry
from .topics import PRIVATE, RING, SNAPSHOT, PrivateSub, SharedTopic, Sub


@dataclass
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


BLOCK = SizeClass.BLOCK
"""A message too large for a block goes out alone in a larger buffer (protocol.md section 5)."""


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
    ) -> None:
        self.pool = pool
        self.clock = clock
        self.flow = flow or FlowConfig()
        self.dirty: list[SharedTopic] = []
        self.queues: list[QueueTopic] = []
        """Queue topics whose items or consumers changed: dealt at the next cycle's start."""
        self.now = 0.0
        """The current cycle's time (a queue delivery's send time)."""
        self.clients: list[Session] = []
        self.timers: list[tuple[float, int, Session]] = []
        self._tie = itertools.count()
        self.stats = CycleStats()
        self.telemetry = telemetry or Telemetry()
        self.wake: Callable[[], None] = _noop
        """Set by the async runner: called when work arrives while it sleeps."""
        self.idle = False
        self.intake: Intake | None = None
        """Publishes from outside the process, drained at the start of each cycle."""
        # the asynchronous-write window (WriterConfig.async_window): writes handed to a
        # server that completes them on its own threads, counted per slice of a cycle
        self.async_window = 128
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

    def _dealt(self, sub: QueueSub) -> None:
        s: Session = sub.session  # type: ignore[assignment]
        s.pending[sub] = None
        self.client_pending(s)

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
            self.dirty or self.queues or self.clients or (self.intake and self.intake.count)
        )

    def next_timer(self) -> float | None:
        return self.timers[0][0] if self.timers else None

    # the cycle

    def run_cycle(self) -> int:
        """Run one cycle; returns the number of frames handed to transports."""
        now = self.now = self.clock()
        stats = self.stats
        stats.cycles += 1
        intake = self.intake
        if intake is not None and intake.count:
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

        self.clients = []
        probes = self._probes(clients) if clients else None
        frames = 0
        window = self.async_window
        rest = iter(clients)
        for s in rest:
            s.queued = False
            if not s.ready or s.state is SessionState.CLOSED:
                continue  # the transport re-queues it when it can take a frame
            if s.hold_until > now:
                self.hold(s, s.hold_until)
                continue
            if self._serve(s):
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

    def _serve(self, s: Session) -> bool:
        """Build and hand over one frame for ``s``; the hot path of the whole engine."""
        parts: list[bytes] = []
        append = parts.append
        size = 0
        cap = 0
        lease: FrameBuffer | None = None
        full = False

        direct = s.direct
        while direct:
            m = direct[0]
            n = len(m)
            if size + n > cap:
                if size:
                    full = True
                    break
                lease = self.pool.acquire(n)
                if lease is None:
                    return self._exhausted(s)
                cap = lease.capacity if lease.size_class is BLOCK else n
            direct.popleft()
            append(m)
            size += n

        pend = s.pending
        if pend and not full:
            busy: list[Sub] = []
            carry: Sub | None = None
            it = iter(pend)
            for sub in it:
                mode = sub.mode
                if mode == SNAPSHOT:
                    t = sub.topic
                    seq = t.seq  # type: ignore[union-attr]
                    if seq == sub.cursor:
                        continue
                    m = t.msg  # type: ignore[union-attr]
                    n = len(m)
                    if size + n > cap:  # full, or the frame's first message: lease a buffer
                        if size or (lease := self.pool.acquire(n)) is None:
                            carry = sub
                            full = True
                            break
                        cap = lease.capacity if lease.size_class is BLOCK else n
                    append(m)
                    size += n
                    sub.cursor = seq
                elif mode == RING:
                    t = sub.topic
                    c = sub.cursor
                    head = t.seq  # type: ignore[union-attr]
                    if c > head:
                        continue
                    m = t.ring[c % t.cap]  # type: ignore[union-attr]
                    oldest = head - t.cap + 1  # type: ignore[union-attr]
                    if c < oldest:
                        # lapped: name exactly what is lost, then carry on from the oldest held
                        m = encode(Gap(sub.number, c, oldest - c)) + t.ring[oldest % t.cap]  # type: ignore[union-attr]
                        self.stats.gaps += 1
                        c = oldest
                    n = len(m)
                    if size + n > cap:  # full, or the frame's first message: lease a buffer
                        if size or (lease := self.pool.acquire(n)) is None:
                            carry = sub
                            full = True
                            break
                        cap = lease.capacity if lease.size_class is BLOCK else n
                    append(m)
                    size += n
                    sub.cursor = c + 1
                    if c < head:
                        busy.append(sub)
                elif mode == PRIVATE:
                    q: PrivateSub = sub  # type: ignore[assignment]
                    unsent = q.unsent
                    unacked = q.unacked
                    k = q.batch
                    while unsent and k:
                        item = unsent[0]
                        m = item[1]
                        n = len(m)
                        if size + n > cap:
                            if size or (lease := self.pool.acquire(n)) is None:
                                full = True
                                break
                            cap = lease.capacity if lease.size_class is BLOCK else n
                        unsent.popleft()
                        unacked.append(item)
                        append(m)
                        size += n
                        k -= 1
                    if full:
                        carry = sub
                        break
                    if unsent:
                        busy.append(sub)
                else:  # a queue topic: the items dealt to this consumer, tagged as they go
                    qs: QueueSub = sub  # type: ignore[assignment]
                    lane = qs.lane
                    out = qs.outstanding
                    if not out:  # deliveries go out: its CoDel and probe need ticks again
                        qs.queue.active[qs] = None
                    tag = qs.tag
                    k = qs.queue.settings.batch
                    topic_uv = encode_uv(qs.number)
                    while lane and k:
                        job = lane[0]
                        # ITEM, as protocol.item_message builds it, with the topic's uv once
                        attempt = job.attempt + 1
                        body = (
                            topic_uv
                            + encode_uv(tag + 1)
                            + (BYTE[attempt] if attempt < 0x80 else encode_uv(attempt))
                            + job.payload
                        )
                        m = (b"\x8c" if job.compressed else b"\x0c") + encode_uv(len(body)) + body
                        n = len(m)
                        if size + n > cap:
                            if size or (lease := self.pool.acquire(n)) is None:
                                full = True
                                break
                            cap = lease.capacity if lease.size_class is BLOCK else n
                        lane.popleft()
                        tag += 1
                        job.attempt += 1
                        out[tag] = (job, self.now)
                        append(m)
                        size += n
                        k -= 1
                    qs.queue.stats.delivered += tag - qs.tag
                    qs.tag = tag
                    if full:
                        carry = sub
                        break
                    if lane:
                        busy.append(sub)
            if carry is not None:
                self.stats.deferred += 1
                # not reached this cycle: first in line next cycle, in their order, then the
                # busy ones, so a full buffer rotates through every topic
                nxt = {carry: None}
                for sub in it:
                    nxt[sub] = None
                for sub in busy:
                    nxt[sub] = None
                s.pending = nxt
            elif busy:
                s.pending = dict.fromkeys(busy)
            else:
                pend.clear()

        if not parts:
            if lease is not None:
                self.pool.release(lease)
            if s.has_work():  # the pool had no lease for the first message
                self._exhausted(s)
            return False
        assert lease is not None
        lease.size = size
        frame = parts[0] if len(parts) == 1 else b"".join(parts)
        stats = self.stats
        stats.messages += len(parts)
        stats.bytes += size
        s.ready = False
        sink = s.sink
        if sink is None:  # detached between readiness and now: keep nothing half-done
            self.pool.release(lease)
            return False
        sink.send_frame(frame, lease)
        return True

    def _exhausted(self, s: Session) -> bool:
        # every lease is out: try again next cycle, nothing taken from the session
        self.stats.exhausted += 1
        if not s.queued:
            s.queued = True
            self.clients.append(s)
        return False
