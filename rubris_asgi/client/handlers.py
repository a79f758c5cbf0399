"""What the client does with each server message: the ``_ServerMessages`` mixin of Client."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from ..control.ratelimit import RateLimiter
from ..errors import ErrorCode, ProtocolError
from ..protocol import (
    ClientMessage,
    Codec,
    Entry,
    EntryOp,
    Flow,
    Gap,
    Goodbye,
    Item,
    Message,
    Mode,
    Nak,
    Pong,
    Push,
    Rejected,
    Result,
    Revoke,
    Stream,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Unsubscribed,
)
from ..protocol.deflate import inflate
from ..protocol.naming import quoted
from .concurrency import _invoke
from .consumer import Consumer, QueueItem, _Settler
from .errors import (
    SubscribeRejected,
    SubscriptionEnded,
    _Bye,
)
from .outcomes import Rejection, _Outcomes, _RefusalLog
from .payloads import _call_error, _decode
from .stats import ClientStats
from .subscription import GAPS_KEPT, GapInfo, PushInfo, Subscription, _StreamBox, _Topic
from .tables import _since, _Table

log = logging.getLogger("rubris_asgi.client")


class _ServerMessages:
    """What the client does with each server message; mixed into :class:`~.core.Client`.

    The reader hands every message after WELCOME to :meth:`_on_message`, in the order of the
    wire. The attributes and methods below are the Client's, declared here for the type checker.
    """

    max_inflated: int
    ack_every: int
    stats: ClientStats
    publish_limiter: RateLimiter
    rejections: deque[Rejection]
    on_refused: Callable[[Rejection], Any] | None
    _outcomes: _Outcomes
    _refusals: _RefusalLog
    _subs: dict[_Topic, None]
    _topics: dict[int, _Topic]
    _sub_reqs: dict[int, _Topic]
    _pub_reqs: OrderedDict[int, tuple[str, Any]]
    _calls: dict[int, asyncio.Future[Any]]
    _streams: dict[int, _StreamBox]
    _call_methods: dict[int, str]
    _pings: dict[int, asyncio.Future[None]]
    _control: Callable[[ClientMessage], None]
    _reqs: itertools.count[int]
    _send_ack: Callable[[Subscription], None]
    _settler: _Settler
    _clock: Callable[[], float]

    async def _on_message(self, msg: Message) -> None:
        if isinstance(msg, Push):
            await self._on_push(msg)
        elif isinstance(msg, Entry):
            await self._on_entry(msg)
        elif isinstance(msg, Item):
            self._on_item(msg)
        elif isinstance(msg, Revoke):
            sub = self._topics.get(msg.topic)
            if isinstance(sub, Consumer):
                sub._revoke(msg.tags)
        elif isinstance(msg, Result):
            await self._on_result(msg)
        elif isinstance(msg, Stream):
            await self._on_stream(msg)
        elif isinstance(msg, Subscribed):
            self._on_subscribed(msg)
        elif isinstance(msg, Rejected):
            await self._on_rejected(msg)
        elif isinstance(msg, Unsubscribed):
            self._on_unsubscribed(msg)
        elif isinstance(msg, Gap):
            await self._on_gap(msg)
        elif isinstance(msg, Pong):
            fut = self._pings.get(msg.token)
            if fut is not None and not fut.done():
                fut.set_result(None)
            elif self._outcomes.barriers:
                self.stats.enqueued += self._outcomes.pong(msg.token)
        elif isinstance(msg, Goodbye):
            self.stats.goodbye = (msg.code, msg.reason)
            raise _Bye(msg.code, msg.reason)
        elif isinstance(msg, Flow):
            self.stats.flow = msg.fill
            self.publish_limiter.on_fill(msg.fill)
        else:
            raise ProtocolError(
                f"the server sent {type(msg).__name__.upper()}, which is not a server message",
                ErrorCode.PROTOCOL,
            )

    def _inflate(self, payload: bytes, compressed: bool) -> bytes:
        if not compressed:
            return payload
        data = inflate(payload, self.max_inflated)
        self.stats.compressed += 1
        self.stats.bytes_saved += len(data) - len(payload)
        return data

    async def _on_push(self, m: Push) -> None:
        sub = self._topics.get(m.topic)
        if not isinstance(sub, Subscription):
            return  # unsubscribed meanwhile
        private = sub.mode == Mode.PRIVATE
        if private and m.seq <= sub.last_seq:
            sub._ack_due = True  # a replay after resume: ours already, but say so again
            return
        if sub.mode == Mode.RING and m.seq <= sub.last_seq:
            # a ring replays from the position we stated (or asked for twice): ours already;
            # delivering it again, or after something newer, would break the order
            self.stats.duplicates += 1
            return
        payload = self._inflate(m.payload, m.compressed)
        value = _decode(sub.codec, payload, sub.name)
        sub.last_seq = max(sub.last_seq, m.seq)
        info = PushInfo(sub.name, m.topic, m.seq, m.compressed)
        if sub._callback is not None:
            await _invoke(sub._callback, value, info, what=f"callback of {sub.name!r}")
        else:
            level = sub._put(value, info)
            if level:
                self._control(Nak(level))
        if private:
            sub._unacked += 1
            if sub._unacked >= self.ack_every:
                self._send_ack(sub)

    async def _on_entry(self, m: Entry) -> None:
        """One change of a keyed topic (protocol.md section 5b), folded into its table."""
        sub = self._topics.get(m.topic)
        if not isinstance(sub, _Table):
            return  # unsubscribed meanwhile
        value: Any = None
        if m.op == EntryOp.SET:
            value = _decode(sub.codec, self._inflate(m.payload, m.compressed), sub.name)
        elif m.op == EntryOp.PATCH:  # a JSON merge patch, whatever the values' codec
            value = _decode(Codec.JSON, self._inflate(m.payload, m.compressed), sub.name)
        # every change applies, even one at or below the table's seq: a recovery may send again
        # a key the client holds, always at its latest state, and SET, DELETE and merge patches
        # are idempotent
        level = await sub._entry(m.seq, m.op, m.key, value)
        if level:
            self._control(Nak(level))

    def _on_item(self, m: Item) -> None:
        sub = self._topics.get(m.topic)
        if not isinstance(sub, Consumer):
            return  # unsubscribed meanwhile (the server takes it back), or a number we never had
        self.stats.items += 1
        # unlike a bad PUSH, which closes the client, a bad work item would go round every
        # consumer and close each in turn: it is given back instead
        try:
            payload = self._inflate(m.payload, m.compressed)
        except ProtocolError as exc:
            sub._undecodable(m.topic, m.tag, exc, requeue=True)  # a larger max_inflated may do
            return
        try:
            value = _decode(sub.codec, payload, sub.name)
        except ProtocolError as exc:
            sub._undecodable(m.topic, m.tag, exc, requeue=False)  # no consumer will do better
            return
        generation = self._settler.generation
        item = QueueItem(
            sub, m.topic, generation, m.tag, m.attempt, value, self._clock(), m.compressed
        )
        sub._deliver(item)

    async def _on_result(self, m: Result) -> None:
        fut = self._calls.get(m.call)
        box = self._streams.get(m.call) if fut is None else None
        if fut is None and box is None:
            return  # timed out or abandoned
        payload = self._inflate(m.payload, m.compressed)
        if m.status == 0:
            value = _decode(Codec.JSON, payload, "RESULT")
            if fut is not None:
                if not fut.done():
                    fut.set_result(value)
            elif box is not None:
                if payload:
                    await box.put(value)
                box.finish()
            return
        err = _call_error(payload, self._call_methods.get(m.call, ""))
        if fut is not None:
            if not fut.done():
                fut.set_exception(err)
        elif box is not None:
            box.finish(err)

    async def _on_stream(self, m: Stream) -> None:
        box = self._streams.get(m.call)
        if box is None:
            return
        payload = self._inflate(m.payload, m.compressed)
        if payload or not m.last:
            await box.put(_decode(Codec.JSON, payload, "STREAM"))
        if m.last:
            box.finish()

    def _on_subscribed(self, m: Subscribed) -> None:
        sub = self._sub_reqs.pop(m.req, None)
        if sub is None:
            return
        queue, keyed = m.mode == Mode.QUEUE, m.mode == Mode.KEYED
        if queue != isinstance(sub, Consumer) or keyed != isinstance(sub, _Table):
            self._wrong_kind(sub, m)
            return
        # Already active: the answer to a ring or table position restated by a resumed session
        # (or to a SUBSCRIBE sent twice). It is the same subscription, moved to the position we
        # stated: the fields below take its news (``recovered``: nothing lost since then). A
        # table needs nothing more here: another epoch, or a position the server cannot
        # recover, is followed by a RESET, which empties it.
        was_active = sub.active
        late = 0  # the late joiner's n, if this answers the SUBSCRIBE that asked for it
        if sub._first_params is not None:
            sub._first_params = None  # asked once: a re-subscribe goes on from epoch/since
            if isinstance(sub, Subscription):
                late = sub._last
        if isinstance(sub, Subscription) and m.epoch != sub.epoch:
            # a new numbering: nothing held so far compares with it. The ring starts after
            # head (or, for a late joiner, after the n it replays), which is what the client
            # then holds: a resume right away states that position
            if m.mode == Mode.RING:
                sub.last_seq = max(0, m.head - late)
            else:
                sub.last_seq = 0
            sub._acked = sub._unacked = 0
        if sub.topic and sub.topic != m.topic and self._topics.get(sub.topic) is sub:
            del self._topics[sub.topic]  # not expected (numbers stay), but never two numbers
        sub.topic = m.topic
        sub.mode = m.mode
        sub.codec = m.codec
        sub.epoch = m.epoch
        sub.head = m.head
        sub.recovered = m.recovered
        self._topics[m.topic] = sub
        if not sub._wanted and not was_active:
            # (an active one was unsubscribed with its number: that UNSUBSCRIBE is on its way)
            self._control(Unsubscribe(m.topic))
        sub.active = True
        fut, sub._pending = sub._pending, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _wrong_kind(self, sub: _Topic, m: Subscribed) -> None:
        """``subscribe()`` found a queue or keyed topic, ``consume()`` a topic that is not a
        queue, or ``subscribe_table()`` one that is not keyed: the client gives it up (pushes,
        items and entries are each understood by one kind only)."""
        self._control(Unsubscribe(m.topic))  # its UNSUBSCRIBED finds no topic: ignored
        self._subs.pop(sub, None)
        name = quoted(sub.name)  # as SubscribeRejected looks for it: the name is shown once
        use = {int(Mode.QUEUE): "consume", int(Mode.KEYED): "subscribe_table"}.get(
            m.mode, "subscribe"
        )
        if isinstance(sub, Consumer):
            reason = f"{name} is not a queue topic (mode {m.mode}): use Client.{use}()"
        elif isinstance(sub, _Table):
            reason = f"{name} is not a keyed topic (mode {m.mode}): use Client.{use}()"
        elif m.mode == Mode.KEYED:
            reason = f"{name} is a keyed topic: use Client.subscribe_table()"
        else:
            reason = f"{name} is a queue topic: use Client.consume()"
        fut, sub._pending = sub._pending, None
        if fut is not None and not fut.done():
            fut.set_exception(SubscribeRejected(0, reason, topic=sub.name))
        sub._end(SubscriptionEnded(0, reason))

    async def _on_rejected(self, m: Rejected) -> None:
        sub = self._sub_reqs.pop(m.req, None)
        if sub is not None:
            self._subs.pop(sub, None)
            fut, sub._pending = sub._pending, None
            if fut is not None and not fut.done():
                fut.set_exception(SubscribeRejected(m.code, m.reason, topic=sub.name))
            sub._end(SubscriptionEnded(m.code, m.reason))
            return
        if self._outcomes.rejected(m.req, m.code, m.reason):
            self.stats.rejected += 1  # an enqueue(): raised to its caller as ItemRefused
            return
        self.stats.rejected += 1
        name, value = self._pub_reqs.pop(m.req, ("", None))
        r = Rejection(m.req, name, m.code, m.reason, value)
        self.rejections.append(r)
        self._refusals.note(r)  # not a line each: a producer may be refused thousands of times
        if self.on_refused is not None:
            await _invoke(self.on_refused, r, what="on_refused")

    def _on_unsubscribed(self, m: Unsubscribed) -> None:
        sub = self._topics.pop(m.topic, None)
        if sub is None:
            return
        if (
            m.code == ErrorCode.RESTARTED
            and sub._wanted
            and isinstance(sub, (Subscription, _Table))
        ):
            # the topic's numbering began again (servers sharing it lost it): subscribe again,
            # saying what we hold, to learn the new epoch (recovered=0; a table is RESET and
            # sent whole); the subscription goes on
            self.stats.restarted += 1
            sub.active = False
            req = next(self._reqs)
            self._sub_reqs[req] = sub
            self._control(Subscribe(req, sub.name, sub.epoch, _since(sub), sub._params))
            return
        self._subs.pop(sub, None)
        if m.code == 0:
            sub._end(SubscriptionEnded(0, "unsubscribed"))
        else:
            sub._end(SubscriptionEnded(m.code, m.reason))

    async def _on_gap(self, m: Gap) -> None:
        sub = self._topics.get(m.topic)
        if not isinstance(sub, Subscription):
            return
        start, count = m.start, m.count
        if sub.mode == Mode.RING and count and start <= sub.last_seq:
            # what we received is not lost: a GAP reaches back only past a stated position by
            # mistake, and "exactly once or inside a GAP" must hold for what the app sees
            end = start + count - 1
            if end <= sub.last_seq:
                return
            start, count = sub.last_seq + 1, end - sub.last_seq
        info = GapInfo(sub.name, start, count)
        sub.gaps.append(info)
        if len(sub.gaps) > GAPS_KEPT:
            del sub.gaps[: len(sub.gaps) - GAPS_KEPT]
        self.stats.gaps += 1
        if count:
            sub.last_seq = max(sub.last_seq, start + count - 1)
        if sub._on_gap is not None:
            await _invoke(sub._on_gap, info, what=f"on_gap of {sub.name!r}")
