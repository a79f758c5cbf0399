"""The ASGI lifespan protocol, spoken for an app that has ``start`` and ``stop``.

``Rubris`` mounted as the whole ASGI app (or as a sub-app whose server sends it lifespan
events) starts on ``lifespan.startup`` and stops on ``lifespan.shutdown``; a start that fails
answers ``lifespan.startup.failed`` with the reason, and the server does not serve.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.types import Receive, Send


async def lifespan_protocol(
    receive: Receive,
    send: Send,
    start: Callable[[], Awaitable[None]],
    stop: Callable[[], Awaitable[None]],
) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            try:
                await start()
            except Exception as exc:
                await send({"type": "lifespan.startup.failed", "message": str(exc)})
                return
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await stop()
            await send({"type": "lifespan.shutdown.complete"})
            return
