"""Drain as soon as plain uvicorn is told to stop, not after it waited for every request.

Under ``uvicorn app:app`` the app hears of a shutdown only through the lifespan, which uvicorn
runs *after* it waited for every in-flight HTTP request: a long-poll waiting on the server held
Ctrl-C for its whole ``poll_timeout`` (25 s), and WebSocket clients got a bare 1012 instead of
GOODBYE 9. uvicorn has no hook before that wait, but it catches SIGINT and SIGTERM with
``signal.signal`` (``Server.capture_signals``) around the app's whole life, so at the app's
start its handler is installed: we put ours in front of it, which starts ``rubris.drain()``
(GOODBYE 9 to every session, waiting polls answered at once) and then hands the signal on to
uvicorn unchanged. ``rubris_asgi.serve`` drains before closing connections by itself, and so do
other servers' hooks; nothing is chained there.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _plain_uvicorn(handler: Any) -> bool:
    """``handler`` is the ``handle_exit`` of uvicorn's own ``Server`` (not a subclass that
    drains by itself, as ``rubris_asgi.serving.Server`` does)."""
    owner = getattr(handler, "__self__", None)
    return (
        getattr(handler, "__name__", "") == "handle_exit"
        and owner is not None
        and type(owner).__module__ == "uvicorn.server"
    )


def drain_on_exit_signal(
    loop: asyncio.AbstractEventLoop, drain: Callable[[], Any]
) -> Callable[[], None]:
    """When plain uvicorn handles SIGINT/SIGTERM, run ``drain()`` (a coroutine function) on
    ``loop`` first; returns the function that puts uvicorn's handlers back (a no-op when
    nothing was chained: not the main thread, or not plain uvicorn)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    chained: dict[int, Any] = {}
    tasks: set[asyncio.Task[Any]] = set()

    def start_drain() -> None:
        task = loop.create_task(drain(), name="rubris-drain-on-signal")
        tasks.add(task)  # held until done: a task nobody references may be collected
        task.add_done_callback(tasks.discard)

    def on_signal(sig: int, frame: FrameType | None) -> None:
        # a signal handler runs between two bytecodes of the main thread, maybe inside the
        # loop's own code: only schedule here
        loop.call_soon_threadsafe(start_drain)
        chained[sig](sig, frame)

    for sig in _SIGNALS:
        current = signal.getsignal(sig)
        if _plain_uvicorn(current):
            chained[sig] = current
            signal.signal(sig, on_signal)

    def restore() -> None:
        for sig, handler in chained.items():
            if signal.getsignal(sig) is on_signal:  # still ours: nobody came after us
                signal.signal(sig, handler)
        chained.clear()

    return restore
