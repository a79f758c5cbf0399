"""Running under uvicorn with a graceful shutdown that reaches every client.

uvicorn's shutdown closes open WebSockets (code 1012) before it runs the app's lifespan
shutdown, so a GOODBYE sent from the lifespan would never arrive. ``Server`` drains the rubris
instances first: every session gets GOODBYE 9 and its in-flight frames, then uvicorn carries on,
and a connection whose peer stopped reading (which uvicorn would wait for forever) is cut after
``Timing.shutdown_drain``.

>>> from rubris_asgi import serve
>>> serve(app, rubris, port=8000)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterable
from typing import Any

import uvicorn

from .app import Rubris


class Server(uvicorn.Server):
    """``uvicorn.Server`` that drains ``rubris`` before closing connections."""

    def __init__(self, config: uvicorn.Config, rubris: Rubris | Iterable[Rubris]) -> None:
        super().__init__(config)
        self.rubris = [rubris] if isinstance(rubris, Rubris) else list(rubris)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for r in self.rubris:
            await r.drain()
        # uvicorn now closes every connection and waits until each is gone, but a closing
        # transport first flushes what it holds, which a peer that stopped reading never lets
        # happen: uvicorn would wait for it forever. Every session has had its GOODBYE, or
        # shutdown_drain to take it; a connection still stuck after as long again is cut.
        grace = max((r.config.timing.shutdown_drain for r in self.rubris), default=5.0)
        timer = asyncio.get_running_loop().call_later(grace, self._cut_stuck)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()

    def _cut_stuck(self) -> None:
        for conn in list(self.server_state.connections):
            transport: Any = getattr(conn, "transport", None)
            if transport is not None and transport.is_closing():
                if transport.get_write_buffer_size():
                    transport.abort()


def serve(
    app: Any,
    rubris: Rubris | Iterable[Rubris],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    **uvicorn_options: Any,
) -> None:
    """Run ``app`` on uvicorn until interrupted, draining ``rubris`` on the way out.

    Per-message deflate at the WebSocket layer is off by default: rubris deflates each message
    itself, and compressing twice costs CPU for nothing.
    """
    uvicorn_options.setdefault("ws_per_message_deflate", False)
    config = uvicorn.Config(app, host=host, port=port, **uvicorn_options)
    # uvicorn re-raises the Ctrl-C it handled gracefully; the shutdown is over by then
    with contextlib.suppress(KeyboardInterrupt):
        Server(config, rubris).run()
