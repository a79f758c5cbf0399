"""The sans-IO engine: sessions, topics and the operations on them, around one ``Scheduler``.

Transports call into it (open/attach/detach a session, subscribe, ACK, ...); the application
publishes into it; the scheduler's cycle drains it into frames. Nothing here awaits or touches a
socket, so every rule can be tested by calling methods and reading the frames a fake transport
receives.
"""

from __future__ import annotations

import hmac
import itertools
import secrets
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..config import Config
from ..errors import ErrorCode, ProtocolError, QueueFull, SessionClosed
from ..protocol import (
    Ack,
    Codec,
    Flow,
    Goodbye,
    Mode,
    Rejected,
    Subscribed,
    Unsubscribed,
    encode,
)
from ..protocol.deflate import Compression, Compressor
from .buffers import FrameBuffer, WriterPool
from .channels import Channel, Registry
from .intake import Intake
from .keyed.operations import TableOperations
from .keyed.presence import LocalBook, Members
from .keyed.topic import KEYED, KeyedTopic
from .keyed.watching import PresenceOperations
from .lifetimes import Lifetimes
from .membership import Membership, Relay, Relayed, TableRelay
from .queues import QueueHome, QueueSub, QueueTopic
from .queues.operations import ITEM_HEADER, QueueOperations
from .scheduler import Scheduler
from .session import FrameSink, Session, SessionState
from .telemetry import Telemetry
from .topics import (
    RING,
    SNAPSHOT,
    PrivateSub,
    RatedSub,
    SharedTopic,
    Sub,
    encode_payload,
    new_epoch,
    trimmed,
)

PARKED = 1 << 62
"""A ring cursor held while its session resumes: past any head, so nothing is sent."""


class Engine(QueueOperations, TableOperations, PresenceOperations):
    """Sessions, shared topics (keyed ones too), private queues and work queues, driven by one
    scheduler."""

    def __init__(
        self,
        config: Config | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        compressor: Compressor | None = None,
        on_session_end: Callable[[Session], None] | None = None,
        on_item_end: Callable[[str, bool], None] | None = None,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        """Told: ``on_session_end(session)`` as a session ends; ``on_item_end(batch_item,
        failed)`` as a queue item carrying a batch item ends (batch tracking's hand-over to its
        store); ``wake()`` as work arrives while the scheduler's runner sleeps."""
        self.config = config or Config()
        self.clock = clock
        self.on_session_end = on_session_end
        self.on_item_end = on_item_end
        self.pool = WriterPool(self.config.pool)
        self.compression = Compression(compressor)
        self.telemetry = Telemetry()
        self.scheduler = Scheduler(
            self.pool,
            clock,
            self.config.flow,
            self.telemetry,
            wake=wake,
            async_window=self.config.writer.async_window,
        )
        self.topics: dict[str, SharedTopic] = {}
        self.queues: dict[str, QueueTopic] = {}
        self.tables: dict[str, KeyedTopic] = {}
        """The keyed topics among ``topics``: what the tombstones' sweep walks."""
        self.watched: dict[str, Channel] = {}
        """Topics whose channel has ``presence``, by name: their subscribers are members."""
        self._book = LocalBook(self._set_member, self._drop_member, self._set_count)
        self.members = Members(self._book)
        """This node's sessions per member of each watched topic (keyed/presence.py)."""
        self.lifetimes = Lifetimes(self.config, self.topics, self.queues, self.telemetry, clock)
        """How many topics each channel has, and when one nobody needs goes."""
        self.sessions: dict[str, Session] = {}
        self.holders: dict[Any, int] = {}
        """Live sessions per user (its owner key) and per address (anonymous ones)."""
        self.unattached: dict[Session, None] = {}
        """The sessions without a connection (new, or detached): what :meth:`expire` walks, four
        times a second, rather than every session."""
        limits = self.config.limits
        self.intake = Intake(
            limits.intake_messages,
            limits.intake_bytes,
            publish=self.publish,
            wake=self.scheduler.intake_pending,
            flow=self._send_flow,
            clock=clock,
        )
        self.scheduler.intake = self.intake
        self._item_max = self.config.pool.max_size - ITEM_HEADER
        """Queue payloads up to this size need no size check."""
        self._numbers = itertools.count(1)
        self.session_prefix = ""
        """What new session ids start with: a distributed broker's node id and mark."""
        self.relay: Relay | None = None
        """A distributed broker's (from :meth:`join`): every shared publish goes there to be
        numbered, and comes back through :meth:`apply`."""
        self.queue_home: QueueHome | None = None
        """A distributed broker's (from :meth:`join`): where queue topics keep their items."""
        self.table_relay: TableRelay | None = None
        """A distributed broker's (from :meth:`join`): every change of a keyed topic goes
        there to be decided and numbered, and comes back through :meth:`apply_entries`."""

    # other nodes (membership.py)

    def join(self, m: Membership) -> None:
        """Share topics with other nodes through a started broker (its relay numbers every
        shared publish; its queue home keeps the queues' items, those made already too)."""
        self.relay = m.relay
        self.table_relay = m.tables
        self.session_prefix = m.session_prefix
        if m.presence is not None:
            self.members.book = m.presence
        self.queue_home = home = m.queue_home
        if home is not None:
            for q in self.queues.values():
                q.rehome(home)

    def room_made(self) -> None:
        """The relay has room again for what the intake holds (``Backlogged``)."""
        self.intake.unblock()

    def leave(self) -> None:
        """Alone again (the broker stopped): publishes numbered here, queue items kept here."""
        self.relay = None
        self.table_relay = None
        self.members.book = self._book
        self.intake.unblock()  # what waited for the relay's room is published here now
        home, self.queue_home = self.queue_home, None
        if home is not None:
            for q in self.queues.values():
                if q.home is home:
                    q.rehome(None)

    # sessions

    def open_session(self, user: Any = None, owner: Any = None, address: str = "") -> Session:
        """A new session; its id and resume secret are 128 random bits each.

        Refused (``ProtocolError`` 6) past ``max_sessions`` here, and past the holder's own
        cap: ``max_sessions_per_user`` for a user (``owner``), ``max_sessions_per_address``
        for anonymous sessions from one client ``address`` (when it is known), so no one
        client takes the sessions every other needs."""
        limits = self.config.limits
        if len(self.sessions) >= limits.max_sessions:
            raise ProtocolError("too many sessions on this server", ErrorCode.TOO_MANY)
        holder = _holder(owner, address)
        if owner is not None:
            cap, whose = limits.max_sessions_per_user, "user"
        else:  # an address unknown (a server that gives none) is nobody's to cap
            cap, whose = (limits.max_sessions_per_address if address else 0), "address"
        if cap and self.holders.get(holder, 0) >= cap:
            raise ProtocolError(
                f"too many sessions for this {whose} (limit {cap})", ErrorCode.TOO_MANY
            )
        sid = self.session_prefix + secrets.token_urlsafe(16)
        s = Session(sid, f"{sid}.{secrets.token_urlsafe(16)}", user, owner)
        s.address = address
        self.holders[holder] = self.holders.get(holder, 0) + 1
        # detached until its transport attaches it, after WELCOME is written: the session
        # timeout counts from now, not from 0 (a slow WELCOME write must not expire it)
        s.detached_at = self.clock()
        self.sessions[sid] = s
        self.unattached[s] = None
        self.telemetry.sessions_opened += 1
        return s

    def find_resumable(
        self, token: str, owner: Any = None, *, owner_tag: str | None = None
    ) -> Session | None:
        """The live session this resume token names, if it belongs to ``owner`` (or, asked
        for another node, to the owner whose ``repr`` is ``owner_tag``).

        The secret half is compared in constant time; a token of another user finds nothing.
        """
        sid, _, _secret = token.partition(".")
        s = self.sessions.get(sid)
        if s is None or s.state is SessionState.CLOSED or s.state is SessionState.CLOSING:
            return None
        if not hmac.compare_digest(s.resume_token.encode(), token.encode()):
            return None
        if s.owner != owner if owner_tag is None else repr(s.owner) != owner_tag:
            return None
        return s

    def attach(self, s: Session, sink: FrameSink, *, ready: bool = True) -> None:
        """Bind a connection to ``s``; private messages in flight are sent again."""
        s.sink = sink
        s.state = SessionState.CONNECTED
        self.unattached.pop(s, None)
        s.ready = ready
        s.attached_at = self.clock()  # what was published before is a replay, not latency
        for sub in s.subs.values():
            if isinstance(sub, PrivateSub) and sub.unacked:
                sub.rewind()
                s.pending[sub] = None
            elif isinstance(sub, QueueSub):
                sub.live = True
                sub.queue.touch()
        if s.has_work():
            self.scheduler.client_pending(s)

    def park_rings(self, s: Session) -> None:
        """Hold the ring and keyed subscriptions of ``s``, which is being resumed, until
        ``unpark``.

        The cursors say what the server *wrote*, and what it wrote to a dying connection may
        never have arrived: the resuming client restates what it holds (SUBSCRIBE with
        epoch/since after its HELLO), and nothing newer may go out before that replay. A parked
        cursor is past any head, so the cycle passes it by at no cost to the hot loop.
        """
        # a client that gave up on a slow resume and resumes again parks what is parked
        # already: the cursors kept are those from before the first, and the rings wait for
        # the last of the resuming frames
        s.resuming += 1
        held = {sub for sub, _ in s.parked}
        for sub in s.subs.values():
            if (sub.mode == RING or sub.mode == KEYED) and sub not in held:
                s.parked.append((sub, sub.cursor))
                sub.cursor = PARKED

    def unpark(self, s: Session) -> None:
        """A resuming frame is handled: once the last one is, the rings none of them restated
        go on where they were."""
        s.resuming -= 1
        if s.resuming > 0:
            return
        parked, s.parked = s.parked, []
        for sub, cursor in parked:
            if sub.cursor == PARKED:
                sub.cursor = cursor
                if s.subs.get(sub.number) is sub and sub.has_more():
                    s.pending[sub] = None
                    self.scheduler.client_pending(s)

    def detach(self, s: Session) -> None:
        """The connection is gone; the session waits for a resume until the timeout."""
        s.sink = None
        s.ready = False
        if s.state is SessionState.CONNECTED:
            s.state = SessionState.DETACHED
        if s.state is SessionState.DETACHED:
            self.unattached[s] = None
        s.detached_at = self.clock()
        self._give_back_queues(s, lost=True)  # not held through the resume window

    def set_ready(self, s: Session) -> None:
        """The transport can take a frame now (a poll arrived, a write completed)."""
        if s.state is SessionState.CLOSED:
            return
        s.ready = True
        if s.has_work():
            self.scheduler.client_pending(s)

    def frame_done(self, s: Session, lease: FrameBuffer) -> None:
        """The transport finished writing a frame: return its lease, serve the session again."""
        self.pool.release(lease)
        if s.sink is not None:
            self.set_ready(s)

    def close_session(self, s: Session, code: int, reason: str) -> None:
        """Queue GOODBYE as the session's last message; the transport closes after it."""
        if s.state is SessionState.CLOSED or s.state is SessionState.CLOSING:
            return
        s.pending.clear()
        self._give_back_queues(s, lost=True)
        s.direct = deque((encode(Goodbye(code, reason)),))  # nothing else goes before it
        self.telemetry.error("goodbye", code)
        s.state = SessionState.CLOSING
        s.close_code = code
        self.scheduler.client_pending(s)

    def end_session(self, s: Session) -> None:
        """Forget ``s``: unsubscribe everything, fail waiting private senders."""
        if s.state is SessionState.CLOSED:
            return
        s.state = SessionState.CLOSED
        s.ready = False
        s.sink = None
        for sub in list(s.subs.values()):
            self._drop_sub(s, sub, lost=True)
        s.direct = None
        s.pending.clear()
        if self.sessions.pop(s.id, None) is not None:
            holder = _holder(s.owner, s.address)
            left = self.holders.get(holder, 0) - 1
            if left > 0:
                self.holders[holder] = left
            else:
                self.holders.pop(holder, None)
        self.unattached.pop(s, None)
        if self.on_session_end is not None:
            self.on_session_end(s)

    def expire(self) -> list[Session]:
        """End detached sessions past the session timeout; returns them."""
        deadline = self.clock() - self.config.timing.session_timeout
        gone = [
            s
            for s in self.unattached
            if s.state is SessionState.DETACHED and s.detached_at <= deadline
        ]
        for s in gone:
            self.end_session(s)
        return gone

    # direct messages

    def direct(self, s: Session, msg: bytes) -> None:
        """Queue an encoded direct message (RESULT, STREAM, SUBSCRIBED, ...) for ``s``."""
        if s.state is SessionState.CLOSED or s.state is SessionState.CLOSING:
            return
        direct = s.direct
        if direct is None:
            direct = s.direct = deque()
        elif len(direct) >= self.config.limits.max_direct_queue:
            self.telemetry.closed_backlog += 1
            self.close_session(s, ErrorCode.SLOW_CONSUMER, "direct queue full")
            return
        self.pool.check_size(len(msg))
        direct.append(msg)
        self.scheduler.client_pending(s)

    def _send_flow(self, fill: int, publishers: list[Any]) -> None:
        """FLOW(fill) to the sessions that published through the intake lately."""
        msg = encode(Flow(fill))
        for s in publishers:
            if isinstance(s, Session) and s.state is SessionState.CONNECTED:
                self.direct(s, msg)

    # shared topics

    def topic(
        self,
        name: str,
        mode: int,
        *,
        ring: int | None = None,
        codec: int = Codec.JSON,
        compress_at: int | None = None,
        max_keys: int | None = None,
        batch: int = 64,
    ) -> SharedTopic:
        """The shared topic ``name``, created on first use (``max_keys`` and ``batch``: a
        keyed topic's, mode 5)."""
        t = self.topics.get(name)
        if t is not None:
            return t
        if len(self.topics) + len(self.queues) >= self.config.limits.max_topics:
            raise ProtocolError("too many topics on this server", ErrorCode.TOO_MANY)
        if mode == KEYED:
            t = self.tables[name] = KeyedTopic(
                name,
                next(self._numbers),
                epoch=new_epoch(),
                codec=codec,
                compress_at=compress_at,
                on_dirty=self.scheduler.topic_dirty,
                max_keys=max_keys or self.config.limits.max_keys,
                batch=batch,
            )
        else:
            t = SharedTopic(
                name,
                next(self._numbers),
                mode,
                epoch=new_epoch(),
                codec=codec,
                ring=ring or self.config.ring_size,
                compress_at=compress_at,
                on_dirty=self.scheduler.topic_dirty,
            )
        self.topics[name] = t
        return t

    def shared_named(self, name: str, registry: Registry) -> SharedTopic:
        """The shared topic ``name``, made on first use from the channel that matches it;
        ``ProtocolError`` (code 3) when no shared channel does."""
        t = self.topics.get(name)
        if t is None:
            found = registry.match(name)
            if found is None or not found[0].shared:
                raise ProtocolError(f"no shared channel matches {name!r}", ErrorCode.UNKNOWN)
            t = self.topic_of(name, found[0])
        t.app = True  # the application's own: kept for its channel's ``keep``
        return t

    def topic_of(self, name: str, ch: Channel) -> SharedTopic:
        """The shared topic ``name`` of channel ``ch``, created with the channel's settings;
        ``ProtocolError`` 6 past the channel's ``max_topics`` (other channels unaffected)."""
        t = self.topics.get(name)
        if t is not None:
            return t
        self.lifetimes.admit(ch)
        t = self.topic(
            name,
            ch.mode,
            ring=ch.ring,
            codec=ch.codec,
            compress_at=ch.compress_at,
            max_keys=ch.max_keys,
            batch=ch.batch,
        )
        t.keep = ch.keep
        if ch.presence is not None:
            self.watched[name] = ch
        self.lifetimes.born(t, ch)
        return t

    def retire(self, now: float, followed: Callable[[str], bool]) -> int:
        """Forget the topics nobody needs (engine/lifetimes.py); ``followed(name)``: whether
        a distributed broker still follows a shared topic for other nodes. The presence
        topics of a topic with members here are kept."""
        holds = self.members.holds
        n = self.lifetimes.retire(now, lambda name: followed(name) or holds(name))
        if n:
            for name in [n for n in self.watched if n not in self.topics]:
                del self.watched[name]
        return n

    def discard_topic(self, name: str) -> bool:
        """Forget the shared topic ``name`` if nobody subscribes to it (True when it did)."""
        t = self.topics.get(name)
        if t is None or t.subs:
            return False
        self.lifetimes.forget(t)
        return True

    def publish(self, t: SharedTopic, value: Any, stamp: float | None = None) -> int:
        """Publish to a shared topic: encode and compress once, O(1); returns the seq.

        ``stamp``: when the message arrived (the intake's, for publish-to-frame; a message the
        intake took is never refused by a broker); now if None. Raises ``MessageTooLarge``
        (nothing stored, nothing sent) over the pool's maximum, ``BrokerUnavailable`` when a
        distributed broker cannot take it; ``TypeError`` for a keyed topic (its changes are
        ``set_entry`` and the others).
        """
        if t.mode == KEYED:
            t.publish(b"", False, 0.0)  # raises: says what to call instead
        payload = encode_payload(value, t.codec)
        data, compressed = self.compression.maybe_compress(payload, t.compress_at)
        # the PUSH header is at most ~25 bytes; checking the payload against the maximum minus
        # that keeps a message that passes here from being refused when it is written
        self.pool.check_size(len(data) + 32)
        relay = self.relay
        if relay is not None:  # it waits in the broker's outbox: at its own size
            how = Relayed.PUBLISH if stamp is None else Relayed.TAKEN
            return relay(t, trimmed(data), compressed, how)
        return t.publish(data, compressed, self.clock() if stamp is None else stamp)

    def prepare(self, t: SharedTopic, value: Any) -> tuple[bytes, bool]:
        """``value`` encoded for ``t`` and compressed where that pays; size checked."""
        data, compressed = self.compression.maybe_compress(
            encode_payload(value, t.codec), t.compress_at
        )
        self.pool.check_size(len(data) + 32)
        return trimmed(data), compressed  # for the broker's outbox, where it waits

    def publish_if_followed(self, t: SharedTopic, value: Any) -> None:
        """Publish ``value`` where a distributed broker has subscribers for ``t`` on any node
        (this one's topic may have none); alone, an ordinary publish."""
        if self.relay is None:
            self.publish(t, value)
            return
        data, compressed = self.prepare(t, value)
        self.relay(t, data, compressed, Relayed.IF_FOLLOWED)

    def publish_first(self, t: SharedTopic, value: Any) -> None:
        """Publish a first value: only while ``t`` has no message (a subscribe handler's
        value; with a broker, decided where the topic is numbered, so one node's wins)."""
        if self.relay is None:
            if t.seq == 0:
                self.publish(t, value)
            return
        data, compressed = self.prepare(t, value)
        self.relay(t, data, compressed, Relayed.FIRST)

    def apply(self, t: SharedTopic, seq: int, data: bytes, compressed: bool) -> None:
        """Store a message numbered by the broker as ``seq`` (greater than ``t.seq``).

        The broker hands a ring topic its messages without a hole (it fetches what it missed
        first), so the ring holds every seq from its oldest to its head; a snapshot may skip.
        """
        t.seq = seq - 1
        t.publish(data, compressed, self.clock())

    def restart_topic(self, t: SharedTopic, epoch: int) -> None:
        """The broker numbers ``t`` afresh as ``epoch`` (its store lost the topic): forget what
        it held and end its subscriptions with UNSUBSCRIBED 11, so clients subscribe again
        and learn the new epoch instead of taking seq 1 for a message they already had."""
        for sub in list(t.subs):
            s = sub.session
            if isinstance(s, Session):
                self.unsubscribe(s, sub.number, ErrorCode.RESTARTED, "topic restarted")
        t.reset(epoch)

    def check_payload(self, size: int) -> None:
        """Raise ``MessageTooLarge`` for a payload of ``size`` bytes no frame could carry."""
        self.pool.check_size(size + 32)  # the PUSH header, as in publish()

    def offer(
        self, entries: list[tuple[SharedTopic, bytes]], publisher: Session | None = None
    ) -> bool:
        """Hand encoded payloads from outside the process to the intake, all of them or none.

        Returns False (nothing taken) when they do not fit: the intake is full. ``publisher``
        is the session that published, to be told the fill with FLOW.
        """
        intake = self.intake
        if not intake.room(len(entries), sum(len(p) for _, p in entries)):
            intake.refused(len(entries))
            return False
        intake.put_all(entries, publisher)
        return True

    def subscribe(
        self,
        s: Session,
        t: SharedTopic,
        req: int,
        epoch: int,
        since: int,
        last: int = 0,
        every: float = 0.0,
    ) -> Sub:
        """Subscribe ``s`` to ``t``: SUBSCRIBED now, then the snapshot or the ring replay (a
        keyed topic: ``subscribe_keyed``). ``every`` > 0: a snapshot's or a keyed topic's
        ``max_rate`` interval (callers refuse it on rings).

        With ``epoch`` equal to the topic's a ring replays what it still holds after ``since``
        (0: all of it; the cycle emits a GAP first for what it lost); ``recovered`` says
        whether that replay is complete. Without them, ``last`` > 0 starts a ring at its last
        ``last`` messages (a late joiner). A topic ``s`` already holds is repositioned the same
        way: that is how a resumed client states where it is (protocol §5, "Resume is exact").
        """
        if isinstance(t, KeyedTopic):
            keyed = self.subscribe_keyed(s, t, req, epoch, since, every)
            if self.watched:
                self._joined(s, t)
            return keyed
        sub = s.subs.get(t.number)
        if sub is None:
            self._check_room(s)
            if every and t.mode == SNAPSHOT:
                sub = RatedSub(s, t, every)
            else:
                sub = Sub(s, t, t.number, t.mode)
            s.subs[t.number] = sub
            s.names[t.name] = sub
            t.subs[sub] = None
        recovered = False
        # epoch E with since 0 is a client that holds that numbering but got nothing of it yet
        same_epoch = epoch != 0 and epoch == t.epoch and since <= t.seq
        if t.mode == SNAPSHOT:
            # conflation is not loss: the latest value is a complete recovery
            sub.cursor = since if same_epoch else 0
            recovered = same_epoch
        elif t.mode == RING:
            if same_epoch:
                sub.cursor = since + 1
                recovered = since + 1 >= t.oldest
            elif last > 0:
                sub.cursor = max(t.oldest, t.seq - last + 1)
            else:
                sub.cursor = t.seq + 1
        self.direct(
            s,
            encode(Subscribed(req, t.number, t.mode, t.codec, t.epoch, t.seq, recovered, t.name)),
        )
        if sub.has_more():
            s.pending[sub] = None
            self.scheduler.client_pending(s)
        if self.watched:
            self._joined(s, t)
        return sub

    # private topics

    def subscribe_private(
        self,
        s: Session,
        name: str,
        req: int,
        *,
        capacity: int | None = None,
        batch: int = 1,
        codec: int = Codec.JSON,
        compress_at: int | None = None,
    ) -> PrivateSub:
        """Open (or confirm) the session's own lossless topic ``name``."""
        sub = s.names.get(name)
        if sub is None:
            self._check_room(s)
            sub = PrivateSub(
                s,
                name,
                next(self._numbers),
                epoch=new_epoch(),
                capacity=capacity or self.config.private_queue,
                batch=batch,
                codec=codec,
                compress_at=compress_at,
            )
            s.subs[sub.number] = sub
            s.names[name] = sub
        if not isinstance(sub, PrivateSub):
            raise ProtocolError(f"{name!r} is not a private topic", ErrorCode.UNKNOWN)
        self.direct(
            s,
            encode(
                Subscribed(
                    req, sub.number, Mode.PRIVATE, sub.codec, sub.epoch, sub.seq, False, name
                )
            ),
        )
        return sub

    def private_for(self, s: Session, name: str) -> PrivateSub:
        sub = s.names.get(name)
        if not isinstance(sub, PrivateSub):
            # said to the client when a call's handler sends on it: the fix is on its side
            raise ProtocolError(
                f"this session is not subscribed to the private topic {name!r}: subscribe to "
                f"{name!r} before calling a method that sends on it",
                ErrorCode.UNKNOWN,
            )
        return sub

    def send_nowait(self, s: Session, q: PrivateSub, value: Any) -> int:
        """Queue one private message; raises ``QueueFull`` at capacity, never waits."""
        if s.state is SessionState.CLOSED:
            raise SessionClosed(f"session {s.id[:8]}… has ended")
        if q.full():
            raise QueueFull(f"private topic {q.name!r} is full ({q.capacity} unacknowledged)")
        payload = encode_payload(value, q.codec)
        data, compressed = self.compression.maybe_compress(payload, q.compress_at)
        self.pool.check_size(len(data) + 32)
        seq = q.put(data, compressed)
        if s.sink is not None or s.state is SessionState.DETACHED:
            s.pending[q] = None
            self.scheduler.client_pending(s)
        return seq

    def ack(self, s: Session, msg: Ack) -> None:
        """ACK: cumulative on a private topic, by tags on a queue topic; an ACK for a topic
        the session does not hold is ignored (it may have just been unsubscribed)."""
        sub = s.subs.get(msg.topic)
        if isinstance(sub, PrivateSub):
            sub.ack(msg.upto)
        elif isinstance(sub, QueueSub):
            done = sub.ack(msg.items, self.clock())
            ended = sub.queue.on_item_end
            if ended is not None:
                for item in done:
                    if item.batch_item is not None:
                        ended(item.batch_item, False)

    # unsubscribe

    def unsubscribe(self, s: Session, number: int, code: int = 0, reason: str = "") -> bool:
        """Drop one subscription and tell the client (UNSUBSCRIBED); False if unknown."""
        sub = s.subs.get(number)
        if sub is None:
            return False
        self._drop_sub(s, sub, lost=False)
        self.direct(s, encode(Unsubscribed(number, code, reason)))
        return True

    def reject(self, s: Session, req: int, code: int, reason: str) -> None:
        self.telemetry.error("rejected", code)
        self.direct(s, encode(Rejected(req, code, reason)))

    def _drop_sub(self, s: Session, sub: Sub, lost: bool) -> None:
        s.subs.pop(sub.number, None)
        if isinstance(sub, QueueSub):
            sub.live = False
            sub.queue.consumers.remove(sub)
            sub.queue.active.pop(sub, None)
            sub.give_back(lost)
            name = sub.queue.name
            if not sub.queue.consumers:
                self.lifetimes.queue_left(sub.queue)
        else:
            name = sub.topic.name if sub.topic is not None else getattr(sub, "name", "")
        if s.names.get(name) is sub:
            del s.names[name]
        s.pending.pop(sub, None)
        t = sub.topic
        if t is not None:
            t.subs.pop(sub, None)
            if not t.subs:
                self.lifetimes.left(t)
            if self.watched:
                self._left(s, t)
        if isinstance(sub, PrivateSub):
            while sub.waiters:
                sub.waiters.popleft()()

    def _check_room(self, s: Session) -> None:
        if len(s.subs) >= self.config.limits.max_subscriptions:
            raise ProtocolError(
                f"too many subscriptions (limit {self.config.limits.max_subscriptions})",
                ErrorCode.TOO_MANY,
            )


_ANONYMOUS = object()


def _holder(owner: Any, address: str) -> Any:
    """Whose cap a session counts against: its user's, or (anonymous) its address's."""
    return owner if owner is not None else (_ANONYMOUS, address)


__all__ = ["Engine"]
