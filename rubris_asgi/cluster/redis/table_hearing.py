"""``TableHearing``: how a node hears the keyed topics it follows in Redis (tables.py changes
them).

A node follows a keyed topic while it has subscribers (broker.py's ``follow``, whose channel and
state of hearing, follow.py, keyed topics share with the others); every change comes on the
topic's channel with its seq and is stored in seq order (``EngineEvents.apply_entries``).
Catching up (a follow, a reconnection, a hole in the seqs) reads every key whose latest change
is after the node's head (``tables_lua.READ``, by pages): per-key conflation makes that exact,
and bounded by the table however long the node was away, with no history kept but the
tombstones.

- When Redis no longer knows every delete after that head (it forgot tombstones), the table is
  read whole and replaces this node's, under the same epoch: its subscribers keep their
  subscriptions and get RESET and the whole table (``KeyedTopic.restart``), ending exact.
- When the topic's epoch changed (Redis lost the topic, or found it had numbered changes
  twice), the topic restarts: subscribers get UNSUBSCRIBED 11 and subscribe again. A RESET
  would leave them the void epoch of their SUBSCRIBED, which a resume restates: every resume
  would then cost the whole table; a new SUBSCRIBED tells them the epoch.

Bounds: a read holds at most the table (its live keys and tombstones), read a page at a time;
what is heard while catching up, at most ``follow.HELD_KEYED`` changes (beyond, the oldest go
and the hole they leave is read again).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ...engine.keyed.topic import SET, KeyedTopic
from ...engine.membership import EngineEvents, Heard
from ...engine.topics import new_epoch
from ...protocol import entry_message
from ..base import BrokerStats
from . import tables_lua
from .follow import JOINING, LIVE, Follow
from .reach import Reach, end_if_cancelled

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger("rubris_asgi.broker")

PAGE = 1000
"""Changes one read answers at most (a script holds Redis for well under a millisecond)."""
PAGE_BYTES = 1 << 20
"""About the bytes one read answers at most."""


class Carrier(Protocol):
    """What keyed topics need of their broker (``RedisBroker``)."""

    prefix: str
    node: str
    ttl_ms: str
    counters: BrokerStats
    reach: Reach

    @property
    def redis(self) -> Redis: ...

    def unavailable(self) -> str | None: ...

    def background(self, coro: Any) -> None: ...

    async def repair(self, f: Follow) -> None: ...


class TableHearing:
    """The keyed topics one node follows, heard and caught up."""

    def __init__(self, broker: Carrier, following: Mapping[str, Follow]) -> None:
        self.broker = broker
        self.prefix = broker.prefix
        self._following = following
        self._events: EngineEvents | None = None
        self._scripts: dict[str, Any] = {}

    def start(self, events: EngineEvents) -> None:
        redis = self.broker.redis
        for name in ("READ", "RENUMBER"):
            self._scripts[name] = redis.register_script(getattr(tables_lua, name))
        self._events = events

    @property
    def events(self) -> EngineEvents:
        assert self._events is not None, "the broker is not started"
        return self._events

    def heard(self, f: Follow, data: bytes) -> None:
        """One change on a followed keyed topic's channel."""
        if f.state != LIVE:
            f.held.append(data)
            return
        t = f.topic
        assert isinstance(t, KeyedTopic)
        epoch, change = parse(data)
        if epoch == t.epoch:
            seq = change[0]
            if seq <= t.seq:  # read already, unless Redis lost and renumbered
                if _renumbered(t, change):
                    f.state = JOINING  # what comes meanwhile waits for the new epoch
                    self.broker.background(self._renumber(f))
                return
            if seq == t.seq + 1:
                self._store(t, change)
                return
        # a hole (or another epoch): read what is missing, holding what arrives meanwhile
        f.held.append(data)
        f.state = JOINING
        self.broker.background(self.broker.repair(f))

    def _store(self, t: KeyedTopic, change: Heard) -> None:
        self.events.apply_entries(t, change[0], (change,))
        self.broker.counters.received += 1

    async def catch_up(self, follows: Sequence[Follow]) -> None:
        """Read what each keyed topic missed, then what arrived meanwhile, and make it live.
        Raises what Redis raises (the caller decides)."""
        for f in follows:
            while not await self._catch_up(f):
                pass

    async def _catch_up(self, f: Follow) -> bool:
        """One read of ``f``'s topic and the changes held; False if a hole remains."""
        t = f.topic
        assert isinstance(t, KeyedTopic)
        f.state = JOINING
        epoch, head, forgotten, whole, changes = await self._read(t)
        events = self.events
        if epoch != t.epoch:
            self._restart(t, epoch)
            events.apply_entries(t, head, changes)
        elif whole:
            self.broker.counters.tables_reset += 1
            events.apply_entries(t, head, changes, forgotten)
        else:
            events.apply_entries(t, head, [c for c in changes if c[0] > t.seq])
        self.broker.counters.fetched += len(changes)
        held = f.held
        while held:
            data = held.popleft()
            epoch, change = parse(data)
            if epoch != t.epoch:
                continue  # of an epoch the read left behind (a newer one: its next repairs)
            seq = change[0]
            if seq <= t.seq:
                if _renumbered(t, change):
                    self.broker.background(self._renumber(f))  # holding on until it is done
                    return True
                continue
            if seq != t.seq + 1:
                held.appendleft(data)
                return False
            self._store(t, change)
        f.state = LIVE
        return True

    async def _read(self, t: KeyedTopic) -> tuple[int, int, int, bool, list[Heard]]:
        """What ``t`` misses of Redis's table, page by page: (epoch, head, forgotten, whole,
        changes). ``whole``: the changes are the whole table (the epoch differs, or a delete
        after ``t.seq`` was forgotten). The pages end exact as of the last one's head: a key
        changed between two pages comes again, at its new seq, in a later one."""
        known, check, after, whole = t.epoch, t.seq, t.seq, False
        floor = 0
        changes: list[Heard] = []
        script = self._scripts["READ"]
        while True:
            args = [
                self.prefix,
                self.broker.ttl_ms,
                str(new_epoch()),
                t.name,
                str(known),
                check,
                after,
                int(whole),
                PAGE,
                PAGE_BYTES,
            ]
            answer = await script(args=args)
            epoch, head, forgotten = int(answer[0]), int(answer[1]), int(answer[2])
            check = 0  # Redis behind this node's head: looked for once, in the first page
            if epoch != known:
                if whole or changes:  # renumbered between two pages: read it all again
                    known, after, whole, changes = epoch, 0, True, []
                    floor = forgotten
                    continue
                known = epoch
            if int(answer[3]) and not whole:  # read whole from here (from its first key)
                whole, changes, floor = True, [], forgotten
            elif whole and forgotten > max(floor, after):
                # a delete forgotten while the pages were read, of a key not read yet: it
                # may be one read alive before; read it all again
                after, changes, floor = 0, [], forgotten
                continue
            page = answer[5:]
            for k in range(0, len(page) - 1, 2):
                changes.append(record(page[k].decode(), page[k + 1]))
            if changes:
                after = changes[-1][0]
            if not int(answer[4]):
                return epoch, head, forgotten, whole, changes

    def _restart(self, t: KeyedTopic, epoch: int) -> None:
        if t.seq or t.subs:
            self.broker.counters.restarted += 1
            log.warning("keyed topic %s numbered afresh by Redis (epoch %d)", t.name, epoch)
        self.events.restart_topic(t, epoch)

    async def _renumber(self, f: Follow) -> None:
        """``f``'s topic was renumbered under its epoch (``_renumbered``): it goes on under a
        new one, in Redis (unless another node did it first) and here, its subscribers told
        (UNSUBSCRIBED 11, then the whole table); then it is read again."""
        t = f.topic
        assert isinstance(t, KeyedTopic)
        old = t.epoch
        try:
            epoch = await self.broker.reach.until_answered(
                lambda: self._scripts["RENUMBER"](
                    args=[self.prefix, t.name, str(old), str(new_epoch())]
                ),
                "reader",
            )
        except Exception:
            end_if_cancelled()
            log.exception("cannot renumber %s", t.name)
            return
        if self._following.get(t.name) is not f:
            return
        log.warning("keyed topic %s: Redis lost changes it had numbered; numbered afresh", t.name)
        if epoch and t.epoch == old:
            self._restart(t, int(epoch))
        f.held.clear()
        await self.broker.repair(f)


def record(key: str, rec: bytes) -> Heard:
    """A key's change as Redis keeps it (``tables_lua``'s record)."""
    seq, prev, op, flag, plen, pflag, body = rec.split(b":", 6)
    n = int(plen)
    if op == b"3":
        return int(seq), key, int(prev), None, False, None
    patch = (body[:n], pflag == b"1") if n else None
    return int(seq), key, int(prev), body[n:], flag == b"1", patch


def parse(data: bytes) -> tuple[int, Heard]:
    """A change heard on a keyed topic's channel: its epoch, and the change."""
    epoch, size, rest = data.split(b":", 2)
    n = int(size)
    return int(epoch), record(rest[:n].decode(), rest[n:])


def _renumbered(t: KeyedTopic, change: Heard) -> bool:
    """A change of ``t``'s epoch at or below its head that contradicts what this node holds:
    Redis numbered it again, having lost what it had numbered there (a failover to a replica
    that had not received it). This node holds every change up to its head, so the key's
    change here is that one or a later one; an older one, or other bytes under that seq, mean
    the seq was given twice."""
    seq, key, _, data, compressed, _ = change
    e = t.entries.get(key)
    if e is None:
        return seq > t.forgotten  # its tombstone forgotten here: nothing to compare
    if e.seq != seq:
        return e.seq < seq
    if data is None:
        return e.value is not None
    return e.value is None or e.msg != entry_message(
        t.number, seq, SET, key.encode(), data, compressed
    )


__all__ = ["TableHearing", "parse", "record"]
