"""Watching a batch (protocol.md 8c): ``watch_batch``, what :meth:`Client.watch_batch` runs.

A batch's state is the snapshot topic ``batch.{id}``: a subscriber gets the current state at
once and every change after it (the seal, ends of items, expiry), each a dict ``{"state":
"open"|"sealed"|"complete"|"expired", "total": t, "done": d, "failed": f, "completed":
bool}``. The state is final at ``"complete"`` or ``"expired"``. Being a snapshot, the topic
conflates: a watcher that falls behind may skip intermediate states, never the latest one.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol

from .concurrency import _within
from .subscription import Subscription

__all__ = ["FINAL_STATES", "watch_batch"]

FINAL_STATES = frozenset({"complete", "expired"})
"""The states after which a batch changes no more."""


class _Subscriber(Protocol):
    """What ``watch_batch`` needs of a :class:`~.core.Client` (typed so, not imported: core
    imports this module for ``Client.watch_batch``)."""

    async def subscribe(self, name: str) -> Subscription: ...

    async def unsubscribe(self, sub: Subscription) -> None: ...


async def watch_batch(
    client: _Subscriber,
    batch: str,
    *,
    on_update: Callable[[dict[str, Any]], Any] | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Follow ``batch`` until it completes or expires; returns that final state.

    Subscribes to ``batch.{batch}`` with ``client.subscribe``, calls ``on_update(state)`` (sync
    or async, awaited before the next state is taken) for every state received, the first and
    the final one included, and unsubscribes however it ends (final state, timeout, error,
    cancellation). An exception of ``on_update`` ends the watch and propagates.

    Raises:
        SubscribeRejected: the server refused: code 3 for an unknown (or forgotten) batch, 4
            when the application's ``authorize_batch`` said no.
        asyncio.TimeoutError: no final state within ``timeout`` seconds (None: no limit).
        SubscriptionEnded: the server ended the subscription first.
        ConnectionLost: the client closed or lost its session for good first.
        RubrisError: this client already subscribes to ``batch.{batch}``.
    """
    sub: Subscription | None = None

    async def follow() -> dict[str, Any]:
        nonlocal sub
        sub = await client.subscribe(f"batch.{batch}")
        while True:
            state, _info = await sub.get()
            if on_update is not None:
                result = on_update(state)
                if inspect.isawaitable(result):
                    await result
            if isinstance(state, dict) and state.get("state") in FINAL_STATES:
                return state

    try:
        return await _within(follow(), timeout)
    finally:
        # a subscribe cut short by the timeout or a cancellation is given back by the client
        # itself (its SUBSCRIBED, should one still come, is answered with UNSUBSCRIBE)
        if sub is not None:
            await client.unsubscribe(sub)
