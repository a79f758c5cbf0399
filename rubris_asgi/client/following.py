"""What the client follows besides plain subscriptions: the ``_Following`` mixin of Client
(``subscribe_table``, ``presence``, ``presence_count``; protocol.md section 5b)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from .presence import COUNT, PRESENCE, Presence, PresenceCount
from .stats import ClientStats
from .subscription import _Topic
from .table import Change
from .tables import TableSubscription, _body, _rate_params

__all__: list[str] = []


class _Following:
    """``subscribe_table``, ``presence`` and ``presence_count``; mixed into
    :class:`~.core.Client`, whose attributes below they use."""

    stats: ClientStats
    _check_free: Callable[[str], None]
    _subscribe: Callable[[_Topic], Coroutine[Any, Any, None]]
    _leave: Callable[[_Topic], asyncio.Future[None]]

    async def subscribe_table(
        self,
        name: str,
        on_change: Callable[[Change], Any] | None = None,
        *,
        max_rate: float | None = None,
    ) -> TableSubscription:
        """Subscribe to the keyed topic ``name`` (a live table) and wait for SUBSCRIBED.

        The entries follow, then SYNCED: ``await sub.wait_synced()`` for the whole table.
        ``on_change(change)`` (sync or async) runs in the reader, in order; without it,
        iterate the returned :class:`TableSubscription`. ``max_rate``: at most this many
        frames of this topic a second after its first state, each with every key's latest
        state (sent as SUBSCRIBE params ``{"max_rate": r}``).

        Raises:
            SubscribeRejected: the server refused (code 0: ``name`` is not a keyed topic).
            RubrisError: this client already holds a subscription to ``name``.
            ConnectionLost: the client closed first.
            ValueError: ``max_rate`` is not a finite number above 0.
        """
        params = _rate_params(max_rate)
        self._check_free(name)
        sub = TableSubscription(self.stats, name, on_change, _body(params), self._leave)
        await self._subscribe(sub)
        return sub

    async def presence(
        self,
        name: str,
        on_join: Callable[[str, Any], Any] | None = None,
        on_leave: Callable[[str, Any], Any] | None = None,
        on_update: Callable[[str, Any], Any] | None = None,
        *,
        max_rate: float | None = None,
    ) -> Presence:
        """Follow who subscribes to ``name`` (``{name}@presence``); wait for SUBSCRIBED.

        ``await p.wait_synced()`` for the members present; ``p.members``, ``p.count``; the
        callbacks are told who joins, leaves or changes (:class:`Presence`). The server
        authorises it as a subscription to ``name``.

        Raises:
            SubscribeRejected: the server refused (code 3: ``name``'s channel has no presence;
                code 4: it shows the count alone, ``presence="count"``: use
                :meth:`presence_count`; code 0: ``{name}@presence`` is a topic of another
                kind, a parameter of a channel without presence having taken the suffix).
            RubrisError: this client already follows ``name``'s presence.
            ConnectionLost: the client closed first.
            ValueError: ``max_rate`` is not a finite number above 0.
        """
        params = _rate_params(max_rate)
        self._check_free(name + PRESENCE)
        sub = Presence(self.stats, name, on_join, on_leave, on_update, _body(params), self._leave)
        await self._subscribe(sub)
        return sub

    async def presence_count(
        self,
        name: str,
        on_change: Callable[[int, int], Any] | None = None,
        *,
        max_rate: float | None = None,
    ) -> PresenceCount:
        """Follow how many subscribe to ``name`` (``{name}@count``); wait for SUBSCRIBED.

        ``c.members`` and ``c.sessions`` are the latest counts (``await c.wait_synced()`` for
        the first); ``on_change(members, sessions)`` is told each new one.

        Raises:
            SubscribeRejected: the server refused (code 3: ``name``'s channel has no presence).
            RubrisError: this client already follows ``name``'s count.
            ConnectionLost: the client closed first.
            ValueError: ``max_rate`` is not a finite number above 0.
        """
        params = _rate_params(max_rate)
        self._check_free(name + COUNT)
        sub = PresenceCount(self.stats, name, on_change, _body(params), self._leave)
        await self._subscribe(sub)
        return sub
