"""One session's consumption of a queue topic: its lane, its deliveries, its prefetch, its CoDel.

A consumer holds items in two places. The *lane*: dealt to it but not yet in a frame (the
scheduler sends them in the next cycle it serves the session, tagging each as it goes). The
*outstanding* deliveries: sent, not yet ended by ACK, NACK or REVOKE, by tag in sending order.
Together they never exceed the consumer's prefetch, fixed or estimated (prefetch.py).

Server-side CoDel (protocol.md section 5) treats the consumer's outstanding items as a buffer:
the age of the oldest, less the round trip and two processing times (its own, and that of the
item the consumer may be busy with when it arrives), is the time it has waited in a standing
queue inside the consumer. While that has stayed above target for an interval, the most
recently sent item (the least likely to have been started) is taken back with REVOKE, then the
next on CoDel's control law. Target and interval are the channel's, but never less than one
and two of the consumer's processing times: for items that take 300 ms, 20 ms of waiting is
jitter, not a standing queue. From then until the delay has stayed under target for 16
intervals (CoDel's memory of a recent standing queue), the consumer gets new items only up to
its measured prefetch (round trip / processing time + 1), whatever it asked for. This is for
consumers that do not run CoDel themselves: a third-party client, a stalled tab.

An estimated prefetch also has the allowance (prefetch.py: at least target / time per item,
what the consumer works through within CoDel's target, so none of those items waits longer).
CoDel leaves those alone by construction: it revokes only when the consumer works slower than
measured or holds more than that. From then on (the cap and the ceiling above) the allowance
is withheld and the consumer is held to the formula: items meant to wait at most target were
found waiting longer, so the allowance is the very buffer CoDel is draining, and handing it
out again would refill the standing queue it is taking back. It comes back when both have
lifted (by then the pace, measured again, sizes it). A prefetch fixed by the consumer or the
channel never has it: it stays exactly as fixed.
"""

from __future__ import annotations

import math
from collections import deque

from ...control.codel import CoDel
from ...errors import ErrorCode, ProtocolError
from ...protocol import Mode
from ..topics import Sub
from .prefetch import PrefetchEstimator
from .topic import QueueItem, QueueTopic

QUEUE = int(Mode.QUEUE)
REVOKED_KEPT = 256
"""Revoked tags remembered per consumer, for an ACK that races its REVOKE."""


class QueueSub(Sub):
    """A session's subscription to a queue topic (sans-IO; times come from the engine)."""

    __slots__ = (
        "queue",
        "lane",
        "outstanding",
        "tag",
        "fixed",
        "estimator",
        "codel",
        "capped_until",
        "ceiling",
        "acked_since",
        "revoked",
        "live",
    )

    def __init__(self, session: object, queue: QueueTopic, prefetch: int | None) -> None:
        super().__init__(session, None, queue.number, QUEUE)
        settings = queue.settings
        self.queue = queue
        self.lane: deque[QueueItem] = deque()
        self.outstanding: dict[int, tuple[QueueItem, float]] = {}
        """tag -> (item, time sent), in tag order (dicts keep insertion order)."""
        self.tag = 0
        """The last tag issued: tags strictly increase for the life of the subscription."""
        self.fixed = prefetch or settings.prefetch
        """The prefetch the consumer or the channel fixed; None: the estimator's."""
        target = settings.codel_target
        # the channel's target sizes the allowance (the floor ``tick`` gives the per-consumer
        # target, one processing time, would only ever allow one item: always allowed anyway)
        self.estimator = PrefetchEstimator(
            settings.initial_prefetch, settings.max_prefetch, settings.rtt_window, target
        )
        self.codel = CoDel(target, settings.codel_interval) if target else None
        self.capped_until = 0.0
        """Held to its measured prefetch until then: CoDel took items back lately."""
        self.ceiling = 0
        """While CoDel takes items back (0: not): the most this consumer may hold, what it held
        after the last REVOKE. A revoked item is never dealt back to the consumer it was taken
        from (measured without it: items delivered and revoked within 0.2 ms, 5 times over)."""
        self.acked_since = False
        """The consumer ACKed something since the last REVOKE (the ceiling lifts only then)."""
        self.revoked: dict[int, tuple[QueueItem, int]] = {}
        """The latest revoked tags: their item and its delivery count then. An ACK of one that
        has not been delivered again settles it (protocol.md section 5: a REVOKE racing the
        start costs no second run)."""
        self.live = False
        """Connected: a consumer whose connection is gone gets nothing (and holds nothing)."""

    @property
    def prefetch(self) -> int:
        """Unacknowledged deliveries this consumer may hold now."""
        return self.fixed or self.estimator.limit

    def credit(self) -> int:
        if not self.live:
            return 0
        limit = self.prefetch
        if self.capped_until or (self.ceiling and self.fixed is None):
            # a standing queue inside the consumer lately: no more than its measured need, and
            # for an estimated prefetch no allowance either (the module docstring); the ceiling
            # may outlast the cap when the consumer does not ACK (it NACKs, or is stalled)
            limit = min(limit, self.estimator.value)
        if self.ceiling:
            limit = min(limit, self.ceiling)
        return limit - len(self.lane) - len(self.outstanding)

    def has_more(self) -> bool:
        return bool(self.lane)

    def idle(self) -> bool:
        """Nothing out and no CoDel or probe state pending: ``tick`` has nothing to do."""
        codel = self.codel
        return (
            not self.outstanding
            and not self.capped_until
            and not self.ceiling
            and not self.estimator.probe_from
            and (codel is None or not (codel.first_above or codel.dropping))
        )

    def _check(self, tag: int) -> None:
        if tag > self.tag:
            raise ProtocolError(
                f"tag {tag} of queue topic {self.number} was never issued (last {self.tag})",
                ErrorCode.PROTOCOL,
            )

    def ack(self, tags: tuple[int, ...], now: float) -> list[QueueItem]:
        """End the deliveries ``tags`` names; returns their items. Tags no longer outstanding
        are ignored; a tag never issued raises ``ProtocolError`` before anything changes."""
        for tag in tags:
            self._check(tag)
        done: list[QueueItem] = []
        late: list[QueueItem] = []
        sent: list[float] = []
        out = self.outstanding
        # it held all it may while items waited: if they did not wait at the consumer either,
        # the prefetch is too small (the estimator grows it)
        q = self.queue
        starving = len(out) + len(self.lane) >= self.prefetch and (
            bool(q.ready) or (q.home is not None and q.home.waiting(q) > 0)
        )
        for tag in tags:
            d = out.pop(tag, None)
            if d is not None:
                done.append(d[0])
                sent.append(d[1])
            elif tag in self.revoked:
                item, attempt = self.revoked.pop(tag)
                # taken back while the consumer worked it: its ACK settles it unless it was
                # delivered again meanwhile (that delivery's outcome then counts)
                if item.attempt == attempt and q.withdraw(item):
                    q.stats.late_acked += 1
                    late.append(item)
        if late or done:
            self.acked_since = True
        if late:
            q.stats.acked += len(late)
            if q.home is not None:
                q.home.settle(q, late, None, False)
            q.touch()
        if done:
            q.stats.acked += len(done)
            if q.home is not None:
                q.home.settle(q, done, None, False)
            self.estimator.on_ack(now, sent, starving)
            q.touch()
        return done + late if late else done

    def nack(self, tag: int, requeue: bool) -> QueueItem | None:
        """Give delivery ``tag`` back (to the head of the queue) or dead-letter it."""
        self._check(tag)
        d = self.outstanding.pop(tag, None)
        if d is None:
            return None
        q = self.queue
        q.stats.nacked += 1
        item = d[0]
        if not requeue:
            q.dead(item)
        elif q.failed(item):
            # the item goes to another consumer when one has room: this one goes to the back
            consumers = q.consumers
            if len(consumers) > 1:
                consumers.remove(self)
                consumers.append(self)
            q.requeue([item])
        q.touch()
        return item

    def give_back(self, lost: bool) -> int:
        """Return every item held (a lost connection, UNSUBSCRIBE, the session's end).

        ``lost``: the deliveries ended with the consumer gone, which counts toward the
        delivery limit; items of the lane were never sent and do not count. Returns how many.
        """
        q = self.queue
        back: list[QueueItem] = []
        for item, _ in self.outstanding.values():
            if not lost or q.failed(item):
                back.append(item)
        n = len(self.outstanding) + len(self.lane)
        back.extend(self.lane)
        self._let_go()
        if not lost:
            q.stats.requeued += len(back)
        q.requeue(back)
        return n

    def _let_go(self) -> None:
        """Hold nothing, and forget what went with it (revoked tags, CoDel's state)."""
        self.outstanding.clear()
        self.lane.clear()
        self.revoked.clear()
        self.ceiling = 0
        self.acked_since = False
        if self.codel is not None:
            self.codel.reset()

    def forfeit(self) -> tuple[tuple[int, ...], list[QueueItem]]:
        """Let go of every item held, none requeued here: they may no longer be this node's
        (the other nodes took it for dead and gave them back to the queue for anyone). Returns
        the outstanding tags, for the REVOKE the caller sends (an ACK of one is then accepted
        and ignored: protocol.md section 5, a tag no longer outstanding), and the items, for
        the queue's home to give back where it still holds them."""
        tags = tuple(self.outstanding)
        items = [item for item, _ in self.outstanding.values()]
        items.extend(self.lane)
        self._let_go()
        return tags, items

    def tick(self, now: float) -> int:
        """Server-side CoDel and the round-trip probe; returns the tag revoked, or 0."""
        est = self.estimator
        if self.fixed is None and est.due_probe(now):
            est.start_probe(now)
            if self.lane:  # only deliveries sent from now on are clean probes
                self.queue.requeue(list(self.lane))
                self.lane.clear()
        codel = self.codel
        if codel is None or not self.live:
            if self.ceiling and self.acked_since:
                self.ceiling = 0
                self.queue.touch()
            return 0
        out = self.outstanding
        if est.processing:
            # knobs in time, floors in items: a standing queue shorter than one item is no
            # queue, and an interval must see more than one item leave (the source document:
            # the interval is about the worst processing time of one item)
            base = self.queue.settings
            codel.target = max(base.codel_target or codel.target, est.processing)
            codel.interval = max(base.codel_interval, 2 * est.processing)
        delay = 0.0
        if out:
            # protocol.md section 5: ACK time - delivery time - round trip - processing, as it
            # stands now for the oldest item (its ACK cannot come earlier than now): the
            # smallest delivery-to-ACK time is round trip + processing
            allowance = est.sojourn if est.processing else self.queue.settings.unmeasured_allowance
            delay = now - out[next(iter(out))][1] - allowance
        if len(out) > self.in_hand(now):
            drop = codel.should_drop(delay, now)
        else:
            # nothing beyond what the consumer may be working on: no standing queue (CoDel
            # never drops a queue's last packet); revoking those would have them done twice
            drop = codel.should_drop(0.0, now)
        if codel.dropping:
            # CoDel's own memory: a queue that comes back within 16 intervals is the same one
            self.capped_until = now + 16 * codel.interval
        elif self.capped_until and now >= self.capped_until:
            self.capped_until = 0.0
            self.queue.touch()  # the standing queue is long gone: it may take its fill again
        if (
            self.ceiling
            and self.acked_since
            and not codel.dropping
            and (not out or delay < codel.target)
        ):
            self.ceiling = 0  # the standing queue is gone: its measured prefetch again
            self.queue.touch()
        return self.revoke() if drop else 0

    def revoke(self) -> int:
        """Take back the newest outstanding delivery (to the head of the queue); returns its
        tag, for the REVOKE the caller sends (0: nothing outstanding)."""
        out = self.outstanding
        if not out:
            return 0
        tag = next(reversed(out))
        item, _ = out.pop(tag)
        q = self.queue
        q.stats.revoked += 1
        revoked = self.revoked
        revoked[tag] = (item, item.attempt)
        if len(revoked) > REVOKED_KEPT:
            del revoked[next(iter(revoked))]
        # no more than it holds now until the standing queue is gone: the item just taken back
        # must not come straight back to it
        self.ceiling = max(1, len(out) + len(self.lane))
        self.acked_since = False
        q.requeue([item])
        return tag

    def in_hand(self, now: float) -> int:
        """Outstanding items the consumer may have started by the time a REVOKE sent now
        reaches it; CoDel revokes only beyond these, so a revoked item has not been started
        and is not run twice.

        The oldest outstanding item is the one in progress (consumers take items in order, and
        the clients give back the newest); it began no earlier than the consumer's latest ACK
        left it (half a round trip before that ACK arrived), so the next one begins no earlier
        than a processing time after that, at the consumer's fastest lately. And it had not
        finished half a round trip ago (its ACK would be here), so by the time a REVOKE
        arrives it has started at most a round trip's worth more. Both with a quarter of the
        round trip (at least 2 ms) for the error of these estimates.
        """
        est = self.estimator
        p = est.fastest
        rtt = est.round_trip
        if not p or rtt is None:
            return 2
        slack = rtt + max(0.002, rtt / 4)
        since = now - est.last_ack + slack - p
        if since < 0:
            return 1
        return 1 + min(1 + math.floor(slack / p), 1 + math.floor(since / p))

    def __repr__(self) -> str:
        return (
            f"<QueueSub {self.queue.name!r} #{self.number} lane={len(self.lane)} "
            f"outstanding={len(self.outstanding)}/{self.prefetch}>"
        )
