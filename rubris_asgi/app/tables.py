"""What the application calls on a running ``Rubris`` to change its keyed topics (live tables,
protocol.md section 5b): the ``_Tables`` mixin of :class:`~.rubris.Rubris`.

Each call finds the keyed topic (made on first use from its channel, as ``publish`` does),
encodes the value once, and stores the change numbered; subscribers are sent the differences
by the next cycle. Safe from any thread, as ``publish`` is: a call from another thread than
the server's event loop is handed to it.

With a distributed broker (``RedisBroker``) the table is kept where every node changes it: a
change is decided and numbered there (cluster/redis/tables.py), so ``set`` and the others
return 0 at once, as ``publish`` does, and a refusal past ``max_keys`` is counted and logged
(``stats().broker.changes_refused``); the ``_async`` variants wait for the answer (the seq, or
``TableFull``). ``entries_async`` reads the table as Redis holds it on any node.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ..cluster import Broker
from ..engine.channels import Registry
from ..engine.engine import Engine
from ..engine.keyed.operations import check_key
from ..engine.keyed.topic import KeyedTopic
from ..engine.membership import Change
from ..engine.topics import encode_payload
from ..errors import ErrorCode, ProtocolError
from ..protocol import Codec
from ..protocol.naming import quoted
from ..server.threads import call_in_loop
from .publishing import _not_json

T = TypeVar("T")


class _Tables:
    """Set, patch, delete and replace entries of keyed topics, and read them; mixed into
    :class:`~.rubris.Rubris`, whose attributes below it uses."""

    engine: Engine
    registry: Registry
    broker: Broker
    _loop: asyncio.AbstractEventLoop | None
    _thread: int
    _on_loop: Callable[[str], None]  # the publishing mixin's: async calls on the server's loop

    def set(self, name: str, key: str, value: Any) -> int:
        """Set the entry ``key`` of the keyed topic ``name`` to ``value``; returns the change's
        seq (the key's current one when it holds ``value`` already: nothing is sent).

        Raises ``ProtocolError`` (code 3) when no keyed channel matches ``name``, ``TableFull``
        for a new key past the topic's ``max_keys``, ``MessageTooLarge`` over the writer
        pool's maximum, ``TypeError`` (naming the topic) when ``value`` is not JSON on a JSON
        topic; nothing changes then."""
        return self._in_loop(lambda: self._set(name, key, value))

    def patch(self, name: str, key: str, partial: Any) -> int:
        """Merge ``partial`` into the entry ``key`` by RFC 7386 (a member ``None`` removes
        it, an object merges into the member's object); subscribers that hold the entry get
        the patch, not the whole value, where it is at most half its size. A key not held
        starts from nothing. JSON topics only. Raises as ``set`` does."""
        return self._in_loop(lambda: self._patch(name, key, partial))

    def delete(self, name: str, key: str) -> int | None:
        """Delete the entry ``key``; returns the change's seq, None when it is not held."""
        return self._in_loop(lambda: self.engine.delete_entry(self._table(name), key))

    def replace(self, name: str, table: Mapping[str, Any]) -> int:
        """Make ``table`` (key to value) the whole of the keyed topic ``name``: keys it lacks
        are deleted, the others set; subscribers are sent the differences. All or nothing:
        a value refused leaves the table as it was. Returns the topic's seq after it."""
        return self._in_loop(lambda: self._replace(name, table))

    def entries(self, name: str) -> dict[str, Any]:
        """The entries of the keyed topic ``name`` now, key to value (decoded by its codec);
        empty when it has none, or was never made."""
        t = self.engine.topics.get(name)
        if not isinstance(t, KeyedTopic):
            self._table(name)  # an unknown name or a topic not keyed: its error
            return {}
        return t.values()

    # waiting for the answer (with a broker: once it decided and numbered the change)

    async def set_async(self, name: str, key: str, value: Any) -> int:
        """``set``, returning the change's seq once it is numbered: at once alone; with a
        ``RedisBroker`` once Redis decided it (the same seq on every node). Raises as ``set``
        does, ``TableFull`` as decided where every node's changes meet, ``BrokerUnavailable``
        while Redis cannot take it."""
        self._on_loop("set_async")
        t = self._table(name)
        check_key(t, key)
        if not self.broker.distributed:
            return self._set(name, key, value)
        try:
            change = self.engine.set_change(t, key, value)
        except TypeError as exc:
            _not_json("set an entry of", name, exc, value, t.codec)
        return await self.broker.numbered_change(t, change)

    async def patch_async(self, name: str, key: str, partial: Any) -> int:
        """``patch``, returning the change's seq once it is numbered (as ``set_async``). With
        a ``RedisBroker`` the merge is made on the value Redis holds (made again if another
        node changed the key meanwhile), so patches of one key from several nodes all take
        effect."""
        self._on_loop("patch_async")
        t = self._table(name)
        check_key(t, key)
        if not self.broker.distributed:
            return self._patch(name, key, partial)
        change = self._prepared(name, t, partial, lambda: self.engine.patch_change(t, key, partial))
        return await self.broker.numbered_change(t, change)

    async def delete_async(self, name: str, key: str) -> int | None:
        """``delete``, returning the change's seq once it is numbered; None when the key was
        not held (with a ``RedisBroker``, by any node)."""
        self._on_loop("delete_async")
        t = self._table(name)
        if not self.broker.distributed:
            return self.engine.delete_entry(t, key)
        seq = await self.broker.numbered_change(t, self.engine.delete_change(t, key))
        return seq or None

    async def replace_async(self, name: str, table: Mapping[str, Any]) -> int:
        """``replace``, returning the topic's seq after it once numbered (with a
        ``RedisBroker``, replaced in Redis all at once)."""
        self._on_loop("replace_async")
        t = self._table(name)
        for key in table:
            check_key(t, key)
        if not self.broker.distributed:
            return self._replace(name, table)
        try:
            change = self.engine.replace_change(t, table)
        except TypeError as exc:
            bad = next((v for v in table.values() if not _encodes(v, t.codec)), None)
            _not_json("replace the table of", name, exc, bad, t.codec)
        return await self.broker.numbered_change(t, change)

    async def entries_async(self, name: str) -> dict[str, Any]:
        """``entries``, as Redis holds them with a ``RedisBroker`` (this node then follows
        the topic, for as long as a subscriber would keep it; ``BrokerUnavailable`` while
        Redis cannot be read); alone, ``entries``."""
        self._on_loop("entries_async")
        t = self._table(name)
        if self.broker.distributed:
            await self.broker.follow(t)
        return t.values()

    def _prepared(
        self, name: str, t: KeyedTopic, partial: Any, prepare: Callable[[], Change]
    ) -> Change:
        if t.codec != Codec.JSON:
            raise TypeError(f"patch needs a JSON topic; {quoted(name)} is not one: use set")
        try:
            return prepare()
        except TypeError as exc:
            _not_json("patch an entry of", name, exc, partial, t.codec)

    # the key (and a patch's topic) are checked first: a TypeError of the engine's is then
    # the encoder's, said again with the topic and the fix

    def _set(self, name: str, key: str, value: Any) -> int:
        t = self._table(name)
        check_key(t, key)
        try:
            return self.engine.set_entry(t, key, value)
        except TypeError as exc:
            _not_json("set an entry of", name, exc, value, t.codec)

    def _patch(self, name: str, key: str, partial: Any) -> int:
        t = self._table(name)
        check_key(t, key)
        if t.codec != Codec.JSON:
            raise TypeError(f"patch needs a JSON topic; {quoted(name)} is not one: use set")
        try:
            return self.engine.patch_entry(t, key, partial)
        except TypeError as exc:
            _not_json("patch an entry of", name, exc, partial, t.codec)

    def _replace(self, name: str, table: Mapping[str, Any]) -> int:
        t = self._table(name)
        for key in table:
            check_key(t, key)
        try:
            return self.engine.replace_table(t, table)
        except TypeError as exc:
            bad = next((v for v in table.values() if not _encodes(v, t.codec)), None)
            _not_json("replace the table of", name, exc, bad, t.codec)

    def _table(self, name: str) -> KeyedTopic:
        t = self.engine.shared_named(name, self.registry)
        if not isinstance(t, KeyedTopic):
            raise ProtocolError(
                f"{quoted(name)} is not a keyed topic (its channel is not keyed=True): use publish",
                ErrorCode.UNKNOWN,
            )
        return t

    def _in_loop(self, call: Callable[[], T]) -> T:
        if self._thread and self._thread != threading.get_ident():
            return call_in_loop(self._loop, call)
        return call()


def _encodes(value: Any, codec: int) -> bool:
    try:
        encode_payload(value, codec)
    except TypeError:
        return False
    return True
