"""One session's frame, by mode: the hot path of the whole engine.

The cycle (scheduler.py) calls :meth:`FrameBuilder.serve` once for each pending session that
is READY. It leases a buffer when the first message is known, takes the direct queue first,
then one message per pending topic:

- snapshot: the topic's stored PUSH, if its seq moved past the subscription's cursor;
- ring: the PUSH at the cursor, or a GAP naming what was lapped and then the oldest held;
- private: up to the subscription's batch depth of its unsent PUSHes, kept until ACKed;
- queue: up to the queue's batch of the items dealt to this consumer, each tagged and built
  into its ITEM as it goes (protocol.codec.item_encoder);
- keyed: up to the topic's batch of ENTRY messages, each key's latest change after the
  subscription's cursor in seq order (its PATCH where the subscriber holds the change before),
  RESET first when a delete it needs was forgotten, SYNCED once its table is whole
  (keyed/topic.py says why two numbers per subscriber suffice);
- rated (a snapshot with ``max_rate``) and keyed with ``max_rate``: nothing before the
  subscription's due time; a timer (``later``) puts it back then.

A message that does not fit after others waits for the next frame; topics not reached stay
first in line, topics with more waiting (rings, private and queue subscriptions) rotate behind
them, so a full buffer goes round every topic. The modes are branches of one loop rather than a
method each: a call per (session, topic) is a measurable share of a 1,000 x 100 cycle.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from typing import Protocol

from ..protocol import Gap, encode
from .buffers import FrameBuffer, SizeClass, WriterPool
from .keyed.topic import KEYED, KeyedSub, KeyedTopic, reset_message, synced_message
from .queues import QueueSub
from .session import Session
from .topics import PRIVATE, RATED, RING, SNAPSHOT, PrivateSub, RatedSub, Sub

BLOCK = SizeClass.BLOCK
"""A message too large for a block goes out alone in a larger buffer (protocol.md section 5)."""


class FrameCounters(Protocol):
    """What the builder counts, in the scheduler's ``CycleStats`` (kept there: ``Rubris.stats()``
    reads one object for the cycle and its frames)."""

    messages: int
    bytes: int
    deferred: int
    exhausted: int
    gaps: int


class FrameBuilder:
    """Builds one frame for a session and hands it to the session's transport (never awaited)."""

    def __init__(
        self,
        pool: WriterPool,
        stats: FrameCounters,
        retry: Callable[[Session], None],
        again: Callable[[Session], None],
        later: Callable[[RatedSub | KeyedSub], None],
    ) -> None:
        self.pool = pool
        self.stats = stats
        self.retry = retry
        """Puts a session back in the next cycle: the pool had no lease free for its frame."""
        self.again = again
        """A session whose frame was written at once and has more to send: the next cycle."""
        self.later = later
        """A subscription with a ``max_rate`` that must wait for its due time."""
        # Frames shared across sessions: a session whose frame is the same messages as the
        # last one built gets the same bytes (no join), and, while a write of them is under
        # way, the same lease (one more holder). Transports reuse what they derive from a
        # frame's bytes by its identity (server/direct.py: its WebSocket framing).
        self.last_parts: list[bytes] = []
        self.last_joined = b""
        self.frame = b""
        """The bytes of the latest lease taken."""
        self.lease = FrameBuffer(BLOCK, 0)
        self.lease.holders = 0  # a placeholder never taken from the pool: nothing shares it

    def serve(self, s: Session, now: float) -> bool:
        """Build and hand over one frame for ``s``; whether one went out. ``now`` is the cycle's
        time, a queue delivery's send time."""
        parts: list[bytes] = []
        append = parts.append
        size = 0
        cap = 0
        full = False
        room = self.pool.room

        direct = s.direct
        while direct:  # None or empty: nothing direct
            m = direct[0]
            n = len(m)
            if size + n > cap:
                if size:
                    full = True
                    break
                cap = room(n)
                if not cap:
                    return self._exhausted(s)
            direct.popleft()
            append(m)
            size += n
        if direct is not None and not direct:
            s.direct = None  # all sent: the deque goes (a session's next one is made anew)

        pend = s.pending
        if pend and not full:
            busy: list[Sub] | None = None  # made for the first sub with more waiting
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
                    if size + n > cap:  # full, or the frame's first message: room for it?
                        if size or not (cap := room(n)):
                            carry = sub
                            full = True
                            break
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
                    if size + n > cap:  # full, or the frame's first message: room for it?
                        if size or not (cap := room(n)):
                            carry = sub
                            full = True
                            break
                    append(m)
                    size += n
                    sub.cursor = c + 1
                    if c < head:
                        if busy is None:
                            busy = []
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
                            if size or not (cap := room(n)):
                                full = True
                                break
                        unsent.popleft()
                        unacked.append(item)
                        append(m)
                        size += n
                        k -= 1
                    if full:
                        carry = sub
                        break
                    if unsent:
                        if busy is None:
                            busy = []
                        busy.append(sub)
                elif mode == KEYED:
                    ks: KeyedSub = sub  # type: ignore[assignment]
                    kt: KeyedTopic = ks.topic  # type: ignore[assignment]
                    c = ks.cursor
                    head = kt.seq
                    memo = kt.memo
                    if (
                        memo is not None
                        and memo[0] == c
                        and memo[2] == head
                        and memo[1] == ks.synced
                        and ks.base < 0
                        and not ks.every
                        and (
                            size + memo[4] <= cap
                            or (not size and (cap := room(memo[4])) >= memo[4])
                        )
                    ):
                        # the same messages as the last subscriber read from the same place
                        # (every up-to-date subscriber of a cycle), at the cost of one extend
                        append(memo[3])
                        size += memo[4]
                        c = ks.cursor = memo[5]
                        if c >= head:
                            ks.synced = head
                        else:
                            if busy is None:
                                busy = []
                            busy.append(sub)
                        continue
                    base = ks.base
                    if c >= head and (base < 0 or c > head):  # all read (or parked: resuming)
                        continue
                    if ks.every and base < 0 and now < ks.due:  # its max_rate: not yet
                        self.later(ks)
                        continue
                    if c < kt.forgotten and kt.forgotten > base:
                        # a delete it has not seen, of a key it may hold, is forgotten: start
                        # its table again
                        m = reset_message(kt)
                        n = len(m)
                        if size + n > cap:
                            if size or not (cap := room(n)):
                                carry = sub
                                full = True
                                break
                        append(m)
                        size += n
                        c = 0
                        ks.start(0)
                        base = ks.base
                    synced = ks.synced
                    seqs = kt.log_seq
                    keys = kt.log_key
                    entries = kt.entries
                    end = len(seqs)
                    i = bisect_right(seqs, c)
                    k = kt.batch
                    sent = False
                    start, size0, c0 = len(parts), size, c
                    while i < end and k:
                        seq = seqs[i]
                        e = entries.get(keys[i])
                        if e is None or e.seq != seq or (e.value is None and seq <= base):
                            c = seq  # a dead line, or a delete of what it never held
                            i += 1
                            continue
                        m = e.msg
                        if e.patch is not None and synced >= e.prev:
                            m = e.patch
                        n = len(m)
                        if size + n > cap:
                            if size or not (cap := room(n)):
                                full = True
                                break
                        append(m)
                        size += n
                        c = seq
                        i += 1
                        k -= 1
                        sent = True
                    if i >= end and not full:
                        c = head  # read to the end: nothing after the last line
                    if base < 0 and not full and c0 >= kt.forgotten:
                        kt.memo = (c0, synced, head, b"".join(parts[start:]), size - size0, c)
                    ks.cursor = c
                    if c >= head:
                        ks.synced = head
                        if base >= 0:  # its table is whole: say so
                            m = synced_message(kt)
                            n = len(m)
                            if size + n > cap and (size or not (cap := room(n))):
                                full = True
                            else:
                                append(m)
                                size += n
                                ks.base = -1
                                sent = True
                    if sent and ks.every:
                        ks.due = now + ks.every
                    if full:
                        carry = sub
                        break
                    if c < head:
                        if busy is None:
                            busy = []
                        busy.append(sub)
                elif mode == RATED:
                    rs: RatedSub = sub  # type: ignore[assignment]
                    t = rs.topic
                    seq = t.seq  # type: ignore[union-attr]
                    if seq == rs.cursor:
                        continue
                    if rs.cursor and now < rs.due:  # its first value at once, then max_rate
                        self.later(rs)
                        continue
                    m = t.msg  # type: ignore[union-attr]
                    n = len(m)
                    if size + n > cap:
                        if size or not (cap := room(n)):
                            carry = sub
                            full = True
                            break
                    append(m)
                    size += n
                    rs.cursor = seq
                    rs.due = now + rs.every
                else:  # a queue topic: the items dealt to this consumer, tagged as they go
                    qs: QueueSub = sub  # type: ignore[assignment]
                    lane = qs.lane
                    out = qs.outstanding
                    queue = qs.queue
                    if not out:  # deliveries go out: its CoDel and probe need ticks again
                        queue.active[qs] = None
                    tag = qs.tag
                    k = queue.settings.batch
                    encode_item = queue.encode_item  # the topic's uv is already in it
                    while lane and k:
                        job = lane[0]
                        attempt = job.attempt + 1
                        m = encode_item(tag + 1, attempt, job.payload, job.compressed)
                        n = len(m)
                        if size + n > cap:
                            if size or not (cap := room(n)):
                                full = True
                                break
                        lane.popleft()
                        tag += 1
                        job.attempt += 1
                        out[tag] = (job, now)
                        append(m)
                        size += n
                        k -= 1
                    queue.stats.delivered += tag - qs.tag
                    qs.tag = tag
                    if full:
                        carry = sub
                        break
                    if lane:
                        if busy is None:
                            busy = []
                        busy.append(sub)
            if carry is not None:
                self.stats.deferred += 1
                # not reached this cycle: first in line next cycle, in their order, then the
                # busy ones, so a full buffer rotates through every topic
                nxt = {carry: None}
                for sub in it:
                    nxt[sub] = None
                for sub in busy or ():
                    nxt[sub] = None
                s.pending = nxt
            elif busy:
                s.pending = dict.fromkeys(busy)
            else:
                pend.clear()

        if not parts:
            if s.has_work():  # the pool had no lease for the first message
                self._exhausted(s)
            return False
        if len(parts) == 1:
            frame = parts[0]  # the message itself: the same object for all its sessions
        elif parts == self.last_parts:  # the same messages as the last frame joined
            frame = self.last_joined
        else:
            frame = b"".join(parts)
            self.last_parts = parts
            self.last_joined = frame
        stats = self.stats
        stats.messages += len(parts)
        stats.bytes += size
        sink = s.sink
        if sink is None:  # detached between readiness and now: keep nothing half-done
            s.ready = False
            return False
        if sink.write_now(frame):  # written whole, no waiting: no lease, ready again
            if s.pending or s.direct:
                self.again(s)
            return True
        s.ready = False
        lease = self.lease
        if frame is self.frame and lease.holders:  # the same bytes, still being written
            self.pool.share(lease)
        else:  # room() said yes at the first message, and no lease was taken since
            lease = self.pool.take(len(parts[0]))
            lease.size = size
            self.frame = frame
            self.lease = lease
        sink.send_frame(frame, lease)
        return True

    def _exhausted(self, s: Session) -> bool:
        # every lease is out: try again next cycle, nothing taken from the session
        self.stats.exhausted += 1
        self.retry(s)
        return False
