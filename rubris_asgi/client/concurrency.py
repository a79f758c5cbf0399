"""Awaiting with a timeout that never loses a cancellation; running application callbacks."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

log = logging.getLogger("rubris_asgi.client")

T = TypeVar("T")


async def _within(aw: Awaitable[T], timeout: float | None) -> T:
    """``asyncio.wait_for`` without its Python < 3.12 flaw: when the awaited thing finishes just
    as the caller is cancelled, ``wait_for`` returns and the cancellation is lost (this made
    ``close()`` hang during a reconnect). ``asyncio.wait`` never loses it."""
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise
    if not done:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise asyncio.TimeoutError
    return task.result()


async def _invoke(fn: Callable[..., Any], *args: Any, what: str) -> None:
    """Run an application callback, sync or async; its errors are logged, never raised."""
    try:
        result = fn(*args)
        if inspect.isawaitable(result):
            await result
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("%s failed", what)
