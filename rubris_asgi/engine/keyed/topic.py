"""Keyed topics: a live table whose entries change one by one (protocol.md section 5b).

A ``KeyedTopic`` keeps, per key, its latest state (a value, or a tombstone once deleted) and the
``seq`` of that change, with the ENTRY messages of that change built once: the SET (or DELETE),
and the PATCH against the key's previous change where one is at most half the bytes. Every
subscriber shares those bytes, as a snapshot topic's subscribers share its PUSH.

The *log* is the keys in the order of their latest change (``log_seq``, ``log_key``: appended at
each change, so a key that changed again leaves a dead line behind, compacted once the dead
outnumber the live). A subscriber is two numbers and a mark, whatever the table or the update
rate: ``cursor``, the log position it has read to (every line up to it handled), ``synced``,
the head the last time it had read everything (then its table equalled the topic's), and
``base``, the head when its table began (SUBSCRIBE, RESET), until SYNCED is sent.

Why those suffice. Reading the log in order and sending each key's *current* state conflates
per key: a key that changed twice since the subscriber last read it is sent once, as it is now,
in the place of its latest change. A key whose latest change is at or before the cursor is up to
date in the subscriber's table. A PATCH from change ``a`` to ``b`` of a key is only right for a
subscriber that holds ``a``; one whose ``synced`` is at least ``a`` held the whole table as of a
head at or past ``a`` (so ``a`` itself, ``a`` being the key's change before ``b``) and cannot
have been sent anything newer of that key but ``b``: it holds ``a``. Anyone else gets the SET.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from typing import Any

import orjson

from ...protocol import Codec, EntryOp, Mode, entry_message
from ..topics import SharedTopic, Sub

KEYED = int(Mode.KEYED)
SET = int(EntryOp.SET)
PATCH = int(EntryOp.PATCH)
DELETE = int(EntryOp.DELETE)
RESET = int(EntryOp.RESET)
SYNCED = int(EntryOp.SYNCED)


class KeyEntry:
    """One key's latest change: its value (None once deleted) and the messages saying so."""

    __slots__ = ("seq", "prev", "value", "msg", "patch", "gone")

    def __init__(self, seq: int, prev: int, value: bytes | None, msg: bytes) -> None:
        self.seq = seq
        self.prev = prev
        """The seq of the key's change before this one (0: none), what a PATCH applies to."""
        self.value = value
        """The value's payload, uncompressed (None: a tombstone)."""
        self.msg = msg
        """The SET (or, for a tombstone, the DELETE) message of this change."""
        self.patch: bytes | None = None
        """The PATCH message of this change, for subscribers that hold ``prev``."""
        self.gone = 0.0
        """When a tombstone was made (the engine's clock)."""


class KeyedTopic(SharedTopic):
    """A shared topic of mode 5: entries under keys, changed, added and deleted one by one."""

    __slots__ = (
        "entries",
        "log_seq",
        "log_key",
        "live",
        "forgotten",
        "tombstones",
        "max_keys",
        "batch",
        "memo",
    )

    def __init__(
        self,
        name: str,
        number: int,
        *,
        epoch: int,
        codec: int,
        compress_at: int | None,
        on_dirty: Callable[[SharedTopic], None],
        max_keys: int,
        batch: int = 64,
    ) -> None:
        super().__init__(
            name,
            number,
            KEYED,
            epoch=epoch,
            codec=codec,
            compress_at=compress_at,
            on_dirty=on_dirty,
        )
        if max_keys < 1 or batch < 1:
            raise ValueError("a keyed topic's max_keys and batch must be >= 1")
        # in the order of each key's latest change: pop and insert again moves a key to the end
        self.entries: dict[str, KeyEntry] = {}
        self.log_seq: list[int] = []
        self.log_key: list[str] = []
        self.live = 0
        """Keys with a value (tombstones not counted): what ``max_keys`` bounds."""
        self.forgotten = 0
        """The latest seq of a tombstone forgotten: a subscriber behind it missed a delete."""
        self.tombstones: deque[tuple[float, str, int]] = deque()
        """(when, key, seq) of each delete, oldest first: what ``forget`` walks."""
        self.max_keys = max_keys
        self.batch = batch
        """ENTRY messages a frame carries at most for one subscriber (then other topics)."""
        self.memo: tuple[int, int, int, bytes, int, int] | None = None
        """What the frame builder took last for a subscriber past its first state: (cursor,
        synced, head, the messages joined, their bytes, the cursor after): the next one at the
        same place, the same head, takes the same bytes object (frames.py), one part of its
        frame, so that a frame of it alone is the same object for all (server/direct.py
        frames a WebSocket message once per object)."""

    def publish(self, payload: bytes, compressed: bool, stamp: float) -> int:
        raise TypeError(
            f"{self.name!r} is a keyed topic: change it with set, patch, delete or replace"
        )

    # changes (the caller encoded the value and checked its size and max_keys)

    def change(
        self,
        key: str,
        value: bytes | None,
        data: bytes,
        compressed: bool,
        patch: tuple[bytes, bool] | None,
        stamp: float,
        seq: int = 0,
    ) -> int:
        """Store the key's next state: ``value`` (None: delete), its SET payload ``data`` and,
        where the caller made one, its PATCH payload (from the key's change held now); returns
        the change's seq: ``seq`` when given (numbered by a broker, after every seq the log
        holds), else the head's next."""
        if not seq:
            seq = self.seq + 1
        self.seq = seq
        entries = self.entries
        old = entries.pop(key, None)
        raw = key.encode()
        if value is None:
            e = KeyEntry(
                seq, old.seq if old else 0, None, entry_message(self.number, seq, DELETE, raw, b"")
            )
            e.gone = stamp
            self.tombstones.append((stamp, key, seq))
            if old is not None and old.value is not None:
                self.live -= 1
        else:
            e = KeyEntry(
                seq,
                old.seq if old else 0,
                value,
                entry_message(self.number, seq, SET, raw, data, compressed),
            )
            if patch is not None:
                e.patch = entry_message(self.number, seq, PATCH, raw, patch[0], patch[1])
            if old is None or old.value is None:
                self.live += 1
        entries[key] = e
        self.log_seq.append(seq)
        self.log_key.append(key)
        self.stamp = stamp
        if len(self.log_seq) > 2 * len(entries) + 64:
            self.compact()
        if not self.dirty and self.subs:
            self.dirty = True
            self._on_dirty(self)
        return seq

    def compact(self) -> None:
        """Drop the log's dead lines: O(table), once per as many changes."""
        entries = self.entries
        self.log_seq = [e.seq for e in entries.values()]
        self.log_key = list(entries)

    def forget(self, before: float) -> int:
        """Forget tombstones made before ``before``, and the oldest beyond ``max_keys`` of
        them; returns how many. A subscriber whose cursor is behind one forgotten is sent RESET
        and the whole table (it cannot be told of that delete any more)."""
        tombs = self.tombstones
        entries = self.entries
        n = 0
        while tombs and (tombs[0][0] < before or len(tombs) > self.max_keys):
            _, key, seq = tombs.popleft()
            e = entries.get(key)
            if e is not None and e.seq == seq:  # still the key's latest change: a tombstone
                del entries[key]
                n += 1
                if seq > self.forgotten:
                    self.forgotten = seq
                    self.memo = None  # built for a cursor that may be behind it now
        return n

    def advance(self, head: int) -> None:
        """Take ``head`` (numbered by a broker) for the head: a change this node will never
        hold (a delete forgotten before it read it) still moves every subscriber past it."""
        if head > self.seq:
            self.seq = head
            self._touched()

    def restart(self, forgotten: int) -> None:
        """Drop every entry to read the table again whole, under the same numbering: the
        deletes up to ``forgotten`` are no longer known where it is read from. Subscribers
        keep their places: each is behind ``forgotten`` and gets RESET and the whole table
        (the frame builder's rule for a forgotten delete); the head stays until the table's
        changes are stored again."""
        self.entries = {}
        self.log_seq = []
        self.log_key = []
        self.live = 0
        self.tombstones.clear()
        self.memo = None
        self.forgotten = max(self.forgotten, forgotten)
        self._touched()

    def _touched(self) -> None:
        if not self.dirty and self.subs:
            self.dirty = True
            self._on_dirty(self)

    def value_of(self, key: str) -> bytes | None:
        e = self.entries.get(key)
        return None if e is None else e.value

    def items(self) -> list[tuple[str, bytes]]:
        """The live entries in the order of their latest change: (key, payload)."""
        return [(k, e.value) for k, e in self.entries.items() if e.value is not None]

    def values(self) -> dict[str, Any]:
        """The live entries decoded by the topic's codec (JSON values, ``str``, ``bytes``)."""
        if self.codec == Codec.JSON:
            return {k: orjson.loads(v) for k, v in self.items()}
        if self.codec == Codec.TEXT:
            return {k: v.decode() for k, v in self.items()}
        return dict(self.items())

    def after(self, since: int) -> list[tuple[str, KeyEntry]]:
        """Each key whose latest change is after ``since``, tombstones included, in seq order."""
        i = bisect_right(self.log_seq, since)
        entries = self.entries
        out = []
        for seq, key in zip(self.log_seq[i:], self.log_key[i:], strict=True):
            e = entries.get(key)
            if e is not None and e.seq == seq:
                out.append((key, e))
        return out

    def reset(self, epoch: int) -> None:
        """Number afresh under ``epoch``: an empty table (its subscribers are gone first)."""
        super().reset(epoch)
        self.entries = {}
        self.log_seq = []
        self.log_key = []
        self.live = 0
        self.forgotten = 0
        self.tombstones.clear()

    def __repr__(self) -> str:
        return f"<KeyedTopic {self.name!r} #{self.number} keys={self.live} seq={self.seq}>"


class KeyedSub(Sub):
    """One session's subscription to a keyed topic: where it has read to, and since when its
    table is whole (see the module's docstring). ``every`` > 0: its ``max_rate``'s interval."""

    __slots__ = ("synced", "base", "every", "due", "waiting")

    def __init__(self, session: object, topic: KeyedTopic, every: float = 0.0) -> None:
        super().__init__(session, topic, topic.number, KEYED)
        self.synced = 0
        self.base = 0
        """The head when its table began, until SYNCED is sent (-1 after): tombstones at or
        before it are of keys the client never held, and are not sent."""
        self.every = every
        self.due = 0.0
        """Not before this (the engine's clock) may its next frame carry this topic."""
        self.waiting = False
        """A timer of the scheduler's will put it back in its session's pending set."""

    def start(self, cursor: int) -> None:
        """Its table begins (anew) at ``cursor``: no PATCH until it has read to a head."""
        t: KeyedTopic = self.topic  # type: ignore[assignment]
        self.cursor = cursor
        self.synced = 0
        self.base = t.seq

    def has_more(self) -> bool:
        t = self.topic
        if t is None:
            return False
        return self.cursor < t.seq or (self.base >= 0 and self.cursor == t.seq)


def reset_message(t: KeyedTopic) -> bytes:
    return entry_message(t.number, t.seq, RESET, b"", b"")


def synced_message(t: KeyedTopic) -> bytes:
    return entry_message(t.number, t.seq, SYNCED, b"", b"")


__all__ = ["KEYED", "KeyEntry", "KeyedSub", "KeyedTopic", "reset_message", "synced_message"]
