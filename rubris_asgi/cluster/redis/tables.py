"""``RedisTables``: keyed topics (live tables) kept in Redis, changed by every node.

A change (set, merge, delete, replace) is prepared on the node where it is made
(engine/keyed/operations.py: encoded, its PATCH diffed against this node's copy, deflated) and
joins this node's table outbox; one task sends it in batches, each batch one script
(``tables_lua.CHANGE``) that decides against the table as every node left it and numbers each
change once: a set of the value held changes nothing, a delete of a key not held neither, a new
key past ``max_keys`` is refused (``TableFull`` to who waits; counted and logged otherwise), a
PATCH is kept only if it was made from the key's latest change. A batch whose answer was lost
is sent again under its id and answered from its first run.

A merge (``patch``) needs the value it merges into, which only Redis holds for sure: it is made
here on this node's copy and taken only if that copy is the key's latest change; else Redis
answers the latest, the merge is made again on it and sent again at once, and what this node
changed of that topic after it waits behind it (so two nodes patching one key both take effect,
and one node's changes keep their order). A node's merges of one key in one batch are made one
on the other before they go (``_chain``): one call for all of them, not one each.

How the nodes hear these changes is table_hearing.py's.

Bounds: the table outbox holds at most the broker's ``outbox_messages`` changes and
``outbox_bytes`` (a change beyond is refused with ``BrokerUnavailable``); a merge is made again
at most ``MERGE_TRIES`` times.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ...engine.keyed.topic import KeyedTopic
from ...engine.membership import Change, EngineEvents
from ...engine.topics import new_epoch
from ...errors import BrokerUnavailable, TableFull
from ...protocol.deflate import inflate
from . import tables_lua
from .follow import Follow
from .outbox import Entry, Outbox
from .table_hearing import Carrier, TableHearing

log = logging.getLogger("rubris_asgi.broker")

MERGE_TRIES = 8
"""Times a merge is made again on the latest value before it is given up (other nodes kept
changing the key faster than a round trip)."""


class _Change(Entry):
    """A change in the table outbox."""

    __slots__ = ("change", "tries")

    def __init__(self, t: KeyedTopic, change: Change, done: asyncio.Future[int] | None) -> None:
        super().__init__(t, b"", False, 0, done)
        self.change = change
        self.nbytes = change.size
        self.tries = 0


class RedisTables:
    """Every keyed topic of one node that shares a Redis with others."""

    def __init__(
        self,
        broker: Carrier,
        following: Mapping[str, Follow],
        messages: int,
        nbytes: int,
        app_share: float,
    ) -> None:
        self.broker = broker
        self.prefix = broker.prefix
        self.hearing = TableHearing(broker, following)
        """How this node hears the keyed topics it follows (table_hearing.py)."""
        self.outbox = Outbox(messages, nbytes, broker.counters, app_share)
        """The changes on their way to Redis."""
        self._events: EngineEvents | None = None
        self._scripts: dict[str, Any] = {}
        self._task: asyncio.Task[None] | None = None
        self._limit = 1 << 24
        """A deflated value's own size at most, read back (a merge's base)."""

    # life

    async def start(self, events: EngineEvents) -> None:
        self._scripts["CHANGE"] = self.broker.redis.register_script(tables_lua.CHANGE)
        self.hearing.start(events)
        self._events = events
        self._limit = events.config.pool.max_size * 64
        self._task = asyncio.create_task(
            self.outbox.run(self._send, self.broker.node + ":k", lambda: None),
            name="rubris-tables-writer",
        )

    async def stop(self, flush: float) -> None:
        """Send what waits, for at most ``flush`` seconds, then stop."""
        await self.outbox.flush(flush)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.outbox.fail_all(BrokerUnavailable("the broker stopped before this change was made"))

    @property
    def events(self) -> EngineEvents:
        assert self._events is not None, "the broker is not started"
        return self._events

    # changing

    def relay(self, t: KeyedTopic, change: Change) -> None:
        """The engine's table relay (``Membership.tables``): into the outbox, or
        ``BrokerUnavailable`` while Redis is away or the outbox is full."""
        self._admit(change)
        self.outbox.put(_Change(t, change, None))

    async def numbered(self, t: KeyedTopic, change: Change) -> int:
        """``relay``, waiting for Redis's answer: the change's seq (a set of the value held:
        the key's; a delete of a key not held: 0; a replace: the head after it). Raises
        ``TableFull`` past ``max_keys``, ``BrokerUnavailable``."""
        self._admit(change)
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.outbox.put(_Change(t, change, done))
        return await done

    def _admit(self, change: Change) -> None:
        if not self.broker.reach.up or not self.outbox.room(1, change.size):
            self.outbox.refuse(self.broker.unavailable(), 1)

    async def _send(self, batch: Sequence[Entry], batch_id: str) -> list[int]:
        """Number ``batch`` (of ``_Change``) in Redis: one script call, and one more for the
        merges it sent back (made again on the latest) and what it held back after them,
        until every change is answered. The seqs, 0 for what failed (its waiter told)."""
        changes: list[_Change] = [e for e in batch if isinstance(e, _Change)]
        seqs = [0] * len(changes)
        todo = list(range(len(changes)))
        made: dict[tuple[str, str], int] = {}
        """The seq of the latest change of a key made by this call's rounds."""
        for attempt in itertools.count():
            sent = self._chain(changes, todo, made)
            if not sent:
                return seqs
            answer = await self._run(changes, sent, f"{batch_id}.{attempt}")
            again: list[int] = []
            unknown: list[int] = []
            for i, a in zip(sent, answer, strict=True):
                entry = changes[i]
                if isinstance(a, bytes):  # a merge on a base that is no longer the latest
                    epoch_b, _, latest = a.partition(b":")
                    if self._rebased(entry, int(epoch_b), latest):
                        again.append(i)
                elif a == -2:  # the same, answered from a first run: the latest is read
                    unknown.append(i)
                    again.append(i)
                elif a == -3:  # held back behind a merge sent again
                    again.append(i)
                elif a == -1:
                    self._refused(entry)
                else:
                    seqs[i] = int(a)
                    if a > 0 and entry.change.op != "R":
                        made[(entry.topic.name, entry.change.key)] = int(a)
            for i in unknown:
                entry = changes[i]
                epoch, latest = await self._latest(entry)
                if not self._rebased(entry, epoch, latest):
                    again.remove(i)
            todo = again
            if not todo:
                return seqs
        raise AssertionError("unreachable")

    def _chain(
        self, changes: list[_Change], todo: list[int], made: dict[tuple[str, str], int]
    ) -> list[int]:
        """Make each merge of ``todo`` that follows another change of its key there again on
        that change's value (prev -1 in the script: right if that one is made), so that a
        node's merges of one key go in one call, not one call each. A merge whose change
        before was made in an earlier round goes on from that change's seq. The changes to
        send (a merge that cannot be made again is dropped, its waiter told)."""
        values: dict[tuple[str, str], tuple[bytes, bool] | None] = {}
        """(topic, key) → the value after the latest change of ``todo`` before (None: none)."""
        replaced: set[str] = set()
        """Topics replaced before in ``todo``: a key not in ``values`` is gone there."""
        sent = []
        for i in todo:
            entry = changes[i]
            c = entry.change
            name = entry.topic.name
            k = (name, c.key)
            if c.op == "M":
                if k in values or name in replaced:
                    held = values.get(k)
                    base = None
                    if held is not None:
                        base = inflate(held[0], self._limit) if held[1] else held[0]
                    assert c.rebase is not None
                    try:
                        c.data, c.compressed, c.patch = c.rebase(base)
                    except Exception as exc:  # too large merged, say: this change only
                        self._failed(entry, exc)
                        continue
                    c.prev = -1
                elif c.prev == -1:  # chained in an earlier round: that change was made since
                    c.prev = made.get(k, -1)
            sent.append(i)
            if c.op in ("S", "M"):
                values[k] = (c.data, c.compressed)
            elif c.op == "D":
                values[k] = None
            elif c.op == "R":
                replaced.add(name)
                for key in [key for key in values if key[0] == name]:
                    values[key] = None
                for s in c.table:
                    values[(name, s.key)] = (s.data, s.compressed)
        return sent

    async def _run(self, changes: list[_Change], todo: list[int], batch_id: str) -> list[Any]:
        events = self.events
        window = int(events.config.timing.tombstones * 1000)
        args: list[Any] = [self.prefix, self.broker.ttl_ms, str(new_epoch()), batch_id, window]
        for (t, epoch), run in itertools.groupby(
            todo, lambda i: (changes[i].topic, changes[i].change.epoch)
        ):
            idx = list(run)
            assert isinstance(t, KeyedTopic)
            args += (t.name, t.max_keys, str(epoch), len(idx))
            for i in idx:
                c = changes[i].change
                args += _fields(c)
                for s in c.table:
                    args += _fields(s)
        answer: list[Any] = await self.broker.reach.until_answered(
            lambda: self._scripts["CHANGE"](args=args), "tables"
        )
        return answer

    def _rebased(self, entry: _Change, epoch: int, record: bytes) -> bool:
        """Make a merge again on the latest value (``record``, b"" none); False when it is
        given up (too many tries, or it cannot be made: its waiter is told)."""
        c = entry.change
        entry.tries += 1
        if entry.tries > MERGE_TRIES or c.rebase is None:
            self._failed(
                entry,
                BrokerUnavailable(
                    f"keyed topic {entry.topic.name!r}: {c.key!r} changed on other nodes "
                    f"{MERGE_TRIES} times while this patch was merged: try again"
                ),
            )
            return False
        prev, value = 0, None
        if record:
            seq, _, op, flag, plen, _, body = record.split(b":", 6)
            prev = int(seq)
            if op == b"1":
                value = body[int(plen) :]
                if flag == b"1":
                    value = inflate(value, self._limit)
        try:
            c.data, c.compressed, c.patch = c.rebase(value)
        except Exception as exc:  # too large merged, say: this change only
            self._failed(entry, exc)
            return False
        c.prev, c.epoch = prev, epoch
        return True

    async def _latest(self, entry: _Change) -> tuple[int, bytes]:
        """The epoch and the key's record (b"" none) as Redis holds them now."""
        name, key = entry.topic.name, entry.change.key
        redis = self.broker.redis

        async def read() -> list[Any]:
            pipe = redis.pipeline(transaction=True)
            pipe.hget(self.prefix + "t:" + name, "e")
            pipe.hget(self.prefix + "kv:" + name, key)
            got: list[Any] = await pipe.execute()
            return got

        epoch, record = await self.broker.reach.until_answered(read, "tables")
        return int(epoch or 0), record or b""

    def _refused(self, entry: _Change) -> None:
        t = entry.topic
        assert isinstance(t, KeyedTopic)
        what = "a table" if entry.change.op == "R" else repr(entry.change.key)
        exc = TableFull(
            f"keyed topic {t.name!r} holds its max_keys ({t.max_keys}): {what} not added"
        )
        self._failed(entry, exc)

    def _failed(self, entry: _Change, exc: BaseException) -> None:
        """A change Redis did not make: its waiter is told; with none, it is counted and
        logged (never lost silently)."""
        done = entry.done
        if done is not None and not done.done():
            done.set_exception(exc)
            return
        self.broker.counters.changes_refused += 1
        log.warning("a change of %s was not made: %s", entry.topic.name, exc)

    # hearing (broker.py hands keyed topics here): table_hearing.py

    def heard(self, f: Follow, data: bytes) -> None:
        """One change on a followed keyed topic's channel."""
        self.hearing.heard(f, data)

    async def catch_up(self, follows: Sequence[Follow]) -> None:
        """Read what each keyed topic missed, then what arrived meanwhile, and make it live."""
        await self.hearing.catch_up(follows)


def _fields(c: Change) -> tuple[Any, ...]:
    """A change's 7 fields in the CHANGE script's arguments."""
    p = c.patch
    prev = len(c.table) if c.op == "R" else c.prev
    return (
        c.op,
        c.key,
        prev,
        int(c.compressed),
        c.data,
        0 if p is None else int(p[1]),
        b"" if p is None else p[0],
    )


__all__ = ["RedisTables"]
