"""Calls from other threads: handed to the server's event loop, the caller waiting.

Every engine structure belongs to the event loop's thread. ``Rubris.publish``, ``enqueue`` and
``send_nowait`` called from another thread (a Django sync view, a thread pool) go through
``call_in_loop``: the call is scheduled with ``call_soon_threadsafe`` and the thread waits for
it, so calls from one thread keep their order, and what the call returns or raises (a seq,
``QueueFull``, an unknown topic) reaches the caller. One round trip through the loop a call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

R = TypeVar("R")


def call_in_loop(loop: asyncio.AbstractEventLoop | None, fn: Callable[..., R], *args: Any) -> R:
    """Run ``fn(*args)`` on ``loop`` (running in another thread) and return its result."""
    if loop is None or loop.is_closed():
        raise RuntimeError("rubris is not running: start it before calling it from a thread")
    done: concurrent.futures.Future[R] = concurrent.futures.Future()

    def run() -> None:
        if not done.set_running_or_notify_cancel():
            return
        try:
            done.set_result(fn(*args))
        except BaseException as exc:  # handed to the calling thread, which raises it
            done.set_exception(exc)

    loop.call_soon_threadsafe(run)
    while True:
        try:
            return done.result(timeout=1.0)
        except concurrent.futures.TimeoutError:
            # a busy loop is waited for; a stopped one would never answer
            if loop.is_closed() or not loop.is_running():
                done.cancel()
                raise RuntimeError(
                    "the server's event loop stopped before taking the call"
                ) from None


async def wait_for_room(waiters: deque[Callable[[], None]]) -> None:
    """Wait until the queue owning ``waiters`` calls us back because room freed (a private
    queue's ACK, a work queue's deal), or it is given up (the session ended)."""
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake() -> None:
        if not fut.done():
            fut.set_result(None)

    waiters.append(wake)
    try:
        await fut
    finally:
        with contextlib.suppress(ValueError):
            waiters.remove(wake)
