"""The engine's operations on keyed topics (mode 5), as a part of ``Engine``.

Set, patch, delete and replace entries (each change numbered and its ENTRY messages built
once, keyed/topic.py), subscribe with recovery, and the tombstones' sweep. Like the queue
operations, ``Engine`` takes them as a base class; the attributes of the engine they use are
declared below.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from ...errors import ErrorCode, ProtocolError, TableFull
from ...protocol import Codec, Subscribed, encode
from ...protocol import patch as merge
from ..topics import encode_payload, trimmed
from .topic import KeyedSub, KeyedTopic, reset_message

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

    def direct(self, s: Session, msg: bytes) -> None:
        raise NotImplementedError  # Engine's

    def _check_room(self, s: Session) -> None:
        raise NotImplementedError  # Engine's

    # changes

    def set_entry(self, t: KeyedTopic, key: str, value: Any) -> int:
        """Set ``key`` of ``t`` to ``value``; returns the change's seq (the key's current one
        when ``value`` is what it holds already: nothing changes, nothing is sent).

        ``TableFull`` for a new key past ``max_keys``, ``MessageTooLarge`` over the pool's
        maximum, ``TypeError`` for a value the topic's codec cannot carry: nothing changed."""
        ready = self._prepare_set(t, key, value)
        if ready is None:
            return t.entries[key].seq
        self._room_for(t, key)
        return self._store(t, key, ready)

    def patch_entry(self, t: KeyedTopic, key: str, partial: Any) -> int:
        """Merge ``partial`` into the value of ``key`` by RFC 7386 (a key not held starts from
        nothing); the wire carries ``partial`` as a PATCH where the 50 % rule allows. JSON
        topics only (``TypeError`` otherwise)."""
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
        None when ``t`` does not hold it."""
        check_key(t, key)
        e = t.entries.get(key)
        if e is None or e.value is None:
            return None
        return t.change(key, None, b"", False, None, self.clock())

    def replace_table(self, t: KeyedTopic, table: Mapping[str, Any]) -> int:
        """Make ``table`` the whole of ``t``: keys it lacks deleted, the others set; each
        subscriber sees the differences. All or nothing: every value is encoded and checked
        (``TableFull``, ``MessageTooLarge``, ``TypeError``) before anything changes. Returns
        the topic's seq after it."""
        if len(table) > t.max_keys:
            raise TableFull(
                f"keyed topic {t.name!r}: a table of {len(table)} keys is past its max_keys "
                f"({t.max_keys})"
            )
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
        patch = None
        if t.codec == JSON and payload[:1] == b"{" and e.value[:1] == b"{":
            new = value if isinstance(value, dict) else orjson.loads(payload)
            d = merge.diff(orjson.loads(e.value), new)
            if d is not None:
                wire = orjson.dumps(d)
                if 2 * len(wire) <= len(payload):  # the 50 % rule
                    patch = wire
        return self._packed(t, key, payload, patch)

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
