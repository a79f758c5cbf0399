"""``run_server``: a real uvicorn on 127.0.0.1 and a free port, in the test's own event loop.

Sharing the loop lets a test publish straight into the app while clients talk to it over real
sockets, and the server stops with the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import uvicorn


@contextlib.asynccontextmanager
async def run_server(app: Any, *, lifespan: str = "on") -> AsyncIterator[str]:
    """Serve ``app``; yields its base URL, e.g. ``http://127.0.0.1:41234``."""
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and an
    # accepted socket inherits the listener's; without it a keep-alive HTTP answer written in
    # two parts waits ~40 ms for the client's delayed ACK (Nagle)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        ws="websockets-sansio",
        ws_per_message_deflate=False,
        log_level="warning",
        lifespan=lifespan,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        for _ in range(500):
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        if task.done():
            task.result()
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        sock.close()
