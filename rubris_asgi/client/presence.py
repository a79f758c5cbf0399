"""Presence as the client holds it (protocol.md section 5b): who subscribes to a topic.

A channel registered with ``presence=True`` offers ``{topic}@presence``, a keyed topic with an
entry per member (a user, however many sessions it has), and ``{topic}@count``, a snapshot of
``{"members": m, "sessions": n}``; with ``presence="count"`` only the latter. Both are
authorised as ``{topic}`` itself. :class:`Presence` follows the first (a table whose changes
become joins, leaves and updates), :class:`PresenceCount` the second.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from ..protocol import EntryOp
from .concurrency import _invoke, _within
from .errors import _copy
from .stats import ClientStats
from .subscription import PushInfo, Subscription
from .tables import _Leave, _Table

__all__ = ["Presence", "PresenceCount"]

PRESENCE = "@presence"
"""The suffix of a topic's members (a keyed topic), as the server names it."""
COUNT = "@count"
"""The suffix of a topic's member and session counts (a snapshot topic)."""

_MISSING: Any = object()


class Presence(_Table):
    """Who subscribes to a topic: the keyed topic ``{watched}@presence``, subscribed.

    :attr:`members` is a read-only mapping of member (the user's identity as a string; an
    anonymous session is a member of its own, ``"anon:…"``) to its value,
    ``{"sessions": n, "info": …}`` (``n`` the member's sessions subscribed, on every node;
    ``info`` what the server's ``presence_info`` said of it, None by default); :attr:`count` is
    how many. A user with several tabs is one member; a resume is neither a leave nor a join.
    Being a member takes a subscription to the watched topic itself, not to its presence.

    The callbacks (sync or async, in the reader, in the order of the wire; ``members`` already
    holds the change) are ``on_join(member, value)``, ``on_leave(member, value)`` (the value it
    had) and ``on_update(member, value)`` (its sessions or info changed). They describe whole
    states: the members of the first state are joins, told when it is complete (SYNCED, when
    :meth:`wait_synced` returns); a RESET (the server could not tell what changed) is not
    everyone leaving and coming back: once the new state is whole, the callbacks are told the
    differences only.
    """

    def __init__(
        self,
        stats: ClientStats,
        watched: str,
        on_join: Callable[[str, Any], Any] | None,
        on_leave: Callable[[str, Any], Any] | None,
        on_update: Callable[[str, Any], Any] | None,
        params: bytes,
        leave: _Leave,
    ) -> None:
        super().__init__(stats, watched + PRESENCE, params, leave)
        self.watched = watched
        """The topic whose subscribers these are."""
        self._on_join = on_join
        self._on_leave = on_leave
        self._on_update = on_update
        # the members as of the last whole state, while the next whole state is coming (the
        # first one: nobody; after a RESET: who was there): the callbacks are told the
        # differences at its SYNCED. None while live: each change is told as it comes.
        self._before: dict[str, Any] | None = {}

    @property
    def members(self) -> Mapping[str, Any]:
        """Member to ``{"sessions": n, "info": …}``, live (the :class:`Table` itself)."""
        return self.table

    @property
    def count(self) -> int:
        """How many members."""
        return len(self.table)

    async def _entry(self, seq: int, op: int, key: str, value: Any) -> int:
        table = self.table
        if op == EntryOp.RESET and self._before is None:
            self._before = table.snapshot()
        old = table.get(key, _MISSING) if key else _MISSING
        change = table.apply(seq, op, key, value)
        if change is None:
            return 0
        self._wake.set()  # wait_synced()
        if self._before is not None:
            if change.op == "synced":
                before, self._before = self._before, None
                await self._differences(before)
            return 0
        if change.op == "delete":
            await self._tell(self._on_leave, key, change.value)
        elif change.op in ("set", "patch"):
            if old is _MISSING:
                await self._tell(self._on_join, key, change.value)
            elif old != change.value:
                await self._tell(self._on_update, key, change.value)
        return 0

    async def _differences(self, before: dict[str, Any]) -> None:
        now = self.table.snapshot()  # a callback may close the client: walk a copy
        for member, value in before.items():
            if member not in now:
                await self._tell(self._on_leave, member, value)
        for member, value in now.items():
            old = before.get(member, _MISSING)
            if old is _MISSING:
                await self._tell(self._on_join, member, value)
            elif old != value:
                await self._tell(self._on_update, member, value)

    async def _tell(self, fn: Callable[[str, Any], Any] | None, member: str, value: Any) -> None:
        if fn is not None:
            await _invoke(fn, member, value, what=f"presence callback of {self.watched!r}")


class PresenceCount(Subscription):
    """How many subscribe to a topic: the snapshot topic ``{watched}@count``, subscribed.

    :attr:`members` and :attr:`sessions` are the latest counts (0 until the first value, which
    the server sends at once: :meth:`wait_synced` waits for it). ``on_change(members,
    sessions)`` (sync or async, in the reader) is told each new count. Without it, it is a
    :class:`Subscription` like any: iterate ``(value, PushInfo)``, the value
    ``{"members": m, "sessions": n}`` (a count that is not iterated never NAKs the server: its
    values are few, and the attributes hold the latest). Offered by channels with
    ``presence=True`` and ``presence="count"`` alike.
    """

    def __init__(
        self,
        stats: ClientStats,
        watched: str,
        on_change: Callable[[int, int], Any] | None,
        params: bytes,
        leave: _Leave,
    ) -> None:
        self._on_count = on_change  # before the base takes _took as its callback
        super().__init__(
            stats, watched + COUNT, None if on_change is None else self._took, params, None
        )
        self.watched = watched
        """The topic whose subscribers these are."""
        self.members = 0
        self.sessions = 0
        self._counted = False
        self._leave = leave

    async def wait_synced(self, timeout: float | None = None) -> None:
        """Return once the first count has come (at once if it has).

        Raises ``asyncio.TimeoutError``, ``SubscriptionEnded`` and ``ConnectionLost`` as
        :meth:`TableSubscription.wait_synced` does."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self._counted:
            if self._ended is not None:
                raise _copy(self._ended)
            self._wake.clear()
            if deadline is None:
                await self._wake.wait()
            else:
                await _within(self._wake.wait(), max(0.0, deadline - loop.time()))

    async def unsubscribe(self) -> None:
        """UNSUBSCRIBE and wait for UNSUBSCRIBED (``client.unsubscribe(count)`` does the same)."""
        if not self.ended:
            await asyncio.shield(self._leave(self))

    def _count(self, value: Any) -> None:
        if isinstance(value, dict):
            members, sessions = value.get("members"), value.get("sessions")
            if isinstance(members, int) and isinstance(sessions, int):
                self.members, self.sessions = members, sessions
        self._counted = True
        self._wake.set()

    async def _took(self, value: Any, info: PushInfo) -> None:
        self._count(value)
        if self._on_count is not None:
            await _invoke(
                self._on_count, self.members, self.sessions, what=f"on_change of {self.name!r}"
            )

    def _put(self, value: Any, info: PushInfo) -> int:
        self._count(value)
        super()._put(value, info)
        return 0
