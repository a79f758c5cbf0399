"""Running under uvicorn with a graceful shutdown that reaches every client.

uvicorn's shutdown closes open WebSockets (code 1012) before it runs the app's lifespan
shutdown, so a GOODBYE sent from the lifespan would never arrive. ``Server`` drains the rubris
instances first: every session gets GOODBYE 9 and its in-flight frames, then uvicorn carries on.

>>> from rubris_asgi import serve
>>> serve(app, rubris, port=8000)  # doctest: +SKIP
"""

from __future__ import annotations

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
        await super().shutdown(sockets)


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
    Server(config, rubris).run()
