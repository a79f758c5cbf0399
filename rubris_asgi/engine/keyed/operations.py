"""The engine's operations on keyed topics (mode 5), as a part of ``Engine``.

Set, patch, delete and replace entries (each change numbered and its ENTRY messages built
once, keyed/topic.py), subscribe with recovery, and the tombstones' sweep. Like the queue
operations, ``Engine`` takes them as a base class; the attributes of the engine they use are
declared below.

With a distributed broker (``table_relay``, membership.py) a change is only *prepared* here
(``set_change`` and the others: encoded, its PATCH diffed against this node's copy, deflated)
and handed to the broker, which decides what depends on the table as every node changed it
and numbers it; it comes back through ``apply_entries`` to every node that follows the topic.
Nothing is decided on this node's copy then (it may be behind): not the no-op of a value held,
not the delete of a key not held, not ``max_keys``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from ...errors import ErrorCode, ProtocolError, TableFull
from ...protocol import Codec, Subscribed, encode
from ...protocol import patch as merge
from ...protocol.deflate import inflate
from ..membership import Change, Heard, TableRelay
from ..topics import encode_payload, trimmed
from .topic import KeyedSub, KeyedTopic, KeyEntry, reset_message

if TYPE_CHECKING:
    from ...config import Config
    from ...protocol.deflate import Compression
    from ..buffers import WriterPool
    from ..scheduler import Scheduler
    from ..session import Session
    from ..topics import SharedTopic

JSON = int(Codec.JSON)
MAX_KEY = 1024
"""A key's bytes at most (UTF-8)."""
ENTRY_HEADER = 48
"""An ENTRY's bytes besides its key and payload, at most: kind, length, topic, seq, op."""

Prepared = tuple[bytes, tuple[bytes, bool], tuple[bytes, bool] | None]
"""A change ready to store: the value, its SET payload (compressed?), its PATCH payload."""


class TableOperations:
    """Change and subscribe to keyed topics: ``Engine``'s methods for mode 5."""

    # the engine's, used here (engine.py sets them in its constructor)
    config: Config
    clock: Callable[[], float]
    pool: WriterPool
    compression: Compression
    scheduler: Scheduler
    topics: dict[str, SharedTopic]
    tables: dict[str, KeyedTopic]
    table_relay: TableRelay | None
    """A distributed broker's (``Engine.join``): where changes go to be numbered."""

    def direct(self, s: Session, msg: bytes) -> None:
        raise NotImplementedError  # Engine's

    def _check_room(self, s: Session) -> None:
        raise NotImplementedError  # Engine's

    # changes

    def set_entry(self, t: KeyedTopic, key: str, value: Any) -> int:
        """Set ``key`` of ``t`` to ``value``; returns the change's seq (the key's current one
        when ``value`` is what it holds already: nothing changes, nothing is sent).

        ``TableFull`` for a new key past ``max_keys``, ``MessageTooLarge`` over the pool's
        maximum, ``TypeError`` for a value the topic's codec cannot carry: nothing changed.
        With a broker: 0, the change being the broker's to decide and number (a refusal past
        ``max_keys`` is counted and logged there; ``set_change`` for one to wait on)."""
        relay = self.table_relay
        if relay is not None:
            relay(t, self.set_change(t, key, value))
            return 0
        ready = self._prepare_set(t, key, value)
        if ready is None:
            return t.entries[key].seq
        self._room_for(t, key)
        return self._store(t, key, ready)

    def patch_entry(self, t: KeyedTopic, key: str, partial: Any) -> int:
        """Merge ``partial`` into the value of ``key`` by RFC 7386 (a key not held starts from
        nothing); the wire carries ``partial`` as a PATCH where the 50 % rule allows. JSON
        topics only (``TypeError`` otherwise). With a broker: 0, as ``set_entry``."""
        relay = self.table_relay
        if relay is not None:
            relay(t, self.patch_change(t, key, partial))
            return 0
        check_key(t, key)
        if t.codec != JSON:
            raise TypeError(f"patch needs a JSON topic; {t.name!r} is not one: use set")
        e = t.entries.get(key)
        old = None if e is None or e.value is None else orjson.loads(e.value)
        payload = orjson.dumps(merge.apply(old, partial))
        if e is not None and e.value == payload:
            return e.seq
        self._room_for(t, key)
        patch = None
        if isinstance(old, dict) and isinstance(partial, dict):
            wire = orjson.dumps(partial)
            if 2 * len(wire) <= len(payload):
                patch = wire
        return self._store(t, key, self._packed(t, key, payload, patch))

    def delete_entry(self, t: KeyedTopic, key: str) -> int | None:
        """Delete ``key`` (a tombstone stays, ``Timing.tombstones``); returns the change's seq,
        None when ``t`` does not hold it. With a broker: 0, as ``set_entry``."""
        relay = self.table_relay
        if relay is not None:
            relay(t, self.delete_change(t, key))
            return 0
        check_key(t, key)
        e = t.entries.get(key)
        if e is None or e.value is None:
            return None
        return t.change(key, None, b"", False, None, self.clock())

    def replace_table(self, t: KeyedTopic, table: Mapping[str, Any]) -> int:
        """Make ``table`` the whole of ``t``: keys it lacks deleted, the others set; each
        subscriber sees the differences. All or nothing: every value is encoded and checked
        (``TableFull``, ``MessageTooLarge``, ``TypeError``) before anything changes. Returns
        the topic's seq after it. With a broker: 0, as ``set_entry`` (the table is replaced
        there all at once, in one script)."""
        relay = self.table_relay
        if relay is not None:
            relay(t, self.replace_change(t, table))
            return 0
        _fits(t, table)
        ready = [(key, self._prepare_set(t, key, value)) for key, value in table.items()]
        gone = [k for k, e in t.entries.items() if e.value is not None and k not in table]
        now = self.clock()
        for key in gone:
            t.change(key, None, b"", False, None, now)
        for key, r in ready:
            if r is not None:
                self._store(t, key, r)
        return t.seq

    def _prepare_set(self, t: KeyedTopic, key: str, value: Any) -> Prepared | None:
        """``value`` encoded for ``t`` with its PATCH where one pays; None: ``key`` holds it."""
        check_key(t, key)
        payload = encode_payload(value, t.codec)
        e = t.entries.get(key)
        if e is None or e.value is None:
            return self._packed(t, key, payload, None)
        if e.value == payload:
            return None
        return self._packed(t, key, payload, _diffed(t, e.value, value, payload))

    def _packed(self, t: KeyedTopic, key: str, payload: bytes, patch: bytes | None) -> Prepared:
        payload = trimmed(payload)  # kept for as long as the key lives
        compress = self.compression.maybe_compress
        data = compress(payload, t.compress_at)
        self.pool.check_size(len(data[0]) + len(key) * 4 + ENTRY_HEADER)
        return payload, data, None if patch is None else compress(patch, t.compress_at)

    def _room_for(self, t: KeyedTopic, key: str) -> None:
        e = t.entries.get(key)
        if (e is None or e.value is None) and t.live >= t.max_keys:
            raise TableFull(
                f"keyed topic {t.name!r} holds {t.live} keys, its max_keys: {key!r} not added"
            )

    def _store(self, t: KeyedTopic, key: str, ready: Prepared) -> int:
        payload, (data, compressed), patch = ready
        return t.change(key, payload, data, compressed, patch, self.clock())

    # changes prepared for a broker (membership.py's Change), decided and numbered there

    def set_change(self, t: KeyedTopic, key: str, value: Any) -> Change:
        """``set_entry`` prepared for the broker: its PATCH made against this node's copy
        of the key, which the broker keeps only if that copy is the key's latest change.
        Raises as ``set_entry`` does, but ``TableFull`` (the broker's to decide)."""
        check_key(t, key)
        payload = encode_payload(value, t.codec)
        e = t.entries.get(key)
        patch = None
        if e is not None and e.value is not None and e.value != payload:
            patch = _diffed(t, e.value, value, payload)
        _, (data, compressed), wire = self._packed(t, key, payload, patch)
        return Change("S", key, data, compressed, wire, _seq(e), t.epoch)

    def patch_change(self, t: KeyedTopic, key: str, partial: Any) -> Change:
        """``patch_entry`` prepared for the broker: the merge made on this node's copy of the
        key, stored only if that copy is the key's latest change there; else the broker
        answers the latest and the merge is made again on it (``Change.rebase``)."""
        check_key(t, key)
        if t.codec != JSON:
            raise TypeError(f"patch needs a JSON topic; {t.name!r} is not one: use set")
        # kept until the broker takes it, perhaps merged again: the application's object
        # may change meanwhile (and a value JSON cannot carry fails here, not later)
        partial = orjson.loads(orjson.dumps(partial))

        def rebase(current: bytes | None) -> tuple[bytes, bool, tuple[bytes, bool] | None]:
            old = None if current is None else orjson.loads(current)
            payload = orjson.dumps(merge.apply(old, partial))
            wire = None
            if isinstance(old, dict) and isinstance(partial, dict):
                wire = orjson.dumps(partial)
                if 2 * len(wire) > len(payload):  # the 50 % rule
                    wire = None
            _, (data, compressed), patch = self._packed(t, key, payload, wire)
            return data, compressed, patch

        e = t.entries.get(key)
        data, compressed, patch = rebase(None if e is None else e.value)
        return Change("M", key, data, compressed, patch, _seq(e), t.epoch, rebase)

    def delete_change(self, t: KeyedTopic, key: str) -> Change:
        """``delete_entry`` prepared for the broker (which knows whether the key is held)."""
        check_key(t, key)
        return Change("D", key, prev=_seq(t.entries.get(key)), epoch=t.epoch)

    def replace_change(self, t: KeyedTopic, table: Mapping[str, Any]) -> Change:
        """``replace_table`` prepared for the broker: ``TableFull`` at once for a table past
        ``max_keys`` (the others' changes cannot make it fit), a set of every key."""
        _fits(t, table)
        sets = [self.set_change(t, k, v) for k, v in table.items()]
        return Change("R", epoch=t.epoch, table=sets)

    def apply_entries(
        self, t: KeyedTopic, head: int, changes: Sequence[Heard], forgotten: int | None = None
    ) -> None:
        """Store changes a broker numbered (``EngineEvents.apply_entries``, membership.py).

        A change's PATCH is kept only where this node holds the key at the change the broker
        made it from (it may not: a node reading the table again gets each key's latest
        change alone, the ones between skipped); else subscribers get the SET."""
        if forgotten is not None:
            # every subscriber starts its table again (each is at or before the head it had,
            # before every delete this node never heard of)
            t.restart(max(forgotten, min(t.seq + 1, head)))
        now = self.clock()
        limit = self.config.pool.max_size * 64  # a deflated value's own size, bounded
        entries = t.entries
        for seq, key, prev, data, compressed, patch in changes:
            if data is None:
                t.change(key, None, b"", False, None, now, seq)
                continue
            value = inflate(data, limit) if compressed else data
            if patch is not None:
                e = entries.get(key)
                if e is None or e.seq != prev:
                    patch = None
            t.change(key, value, data, compressed, patch, now, seq)
        t.advance(head)

    # subscribers

    def subscribe_keyed(
        self, s: Session, t: KeyedTopic, req: int, epoch: int, since: int, every: float = 0.0
    ) -> KeyedSub:
        """Subscribe ``s`` to ``t``: SUBSCRIBED, then each key's latest state and SYNCED.

        With ``epoch`` equal to the topic's and every delete after ``since`` still known, only
        the keys changed after ``since`` (``recovered``); with another epoch, or a delete
        forgotten, RESET and the whole table. A topic ``s`` holds already is repositioned the
        same way (a resumed client restating where it is), keeping the ``max_rate`` it was made
        with."""
        sub = s.subs.get(t.number)
        if not isinstance(sub, KeyedSub):
            self._check_room(s)
            sub = KeyedSub(s, t, every)
            s.subs[t.number] = sub
            s.names[t.name] = sub
            t.subs[sub] = None
        recovered = epoch != 0 and epoch == t.epoch and t.forgotten <= since <= t.seq
        self.direct(
            s, encode(Subscribed(req, t.number, t.mode, t.codec, t.epoch, t.seq, recovered, t.name))
        )
        if recovered:
            sub.cursor = since
            sub.synced = 0
            sub.base = since
        else:
            if epoch != 0:  # it holds a table this one does not continue: drop it first
                self.direct(s, reset_message(t))
            sub.start(0)
        s.pending[sub] = None
        self.scheduler.client_pending(s)
        return sub

    def forget_tombstones(self, now: float) -> int:
        """Forget the tombstones older than ``Timing.tombstones`` (and a topic's beyond its
        max_keys); returns how many went. Topics forgotten meanwhile leave ``tables``."""
        before = now - self.config.timing.tombstones
        n = 0
        for name, t in list(self.tables.items()):
            if self.topics.get(name) is not t:
                del self.tables[name]
            elif t.tombstones:
                n += t.forget(before)
        return n


def _fits(t: KeyedTopic, table: Mapping[str, Any]) -> None:
    if len(table) > t.max_keys:
        raise TableFull(
            f"keyed topic {t.name!r}: a table of {len(table)} keys is past its max_keys "
            f"({t.max_keys})"
        )


def _seq(e: KeyEntry | None) -> int:
    """The seq of the key's change this node holds (0: none): what a change made on it
    names as its ``prev``."""
    return 0 if e is None else e.seq


def _diffed(t: KeyedTopic, held: bytes, value: Any, payload: bytes) -> bytes | None:
    """The PATCH from the value ``held`` to ``value`` (encoded ``payload``), where both are
    JSON objects and it is at most half the new value's bytes (the 50 % rule); else None."""
    if t.codec != JSON or payload[:1] != b"{" or held[:1] != b"{":
        return None
    new = value if isinstance(value, dict) else orjson.loads(payload)
    d = merge.diff(orjson.loads(held), new)
    if d is None:
        return None
    wire = orjson.dumps(d)
    return wire if 2 * len(wire) <= len(payload) else None


def check_key(t: KeyedTopic, key: str) -> None:
    """``TypeError`` for a key that is not a non-empty str, ``ProtocolError`` 5 past
    ``MAX_KEY`` bytes."""
    if not isinstance(key, str) or not key:
        raise TypeError(f"keyed topic {t.name!r}: a key is a non-empty str, got {key!r}")
    if len(key) > MAX_KEY // 4 and len(key.encode()) > MAX_KEY:
        raise ProtocolError(
            f"keyed topic {t.name!r}: key of {len(key.encode())} bytes, at most {MAX_KEY}",
            ErrorCode.TOO_LARGE,
        )


__all__ = ["MAX_KEY", "TableOperations", "check_key"]
