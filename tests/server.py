"""``run_server``: a real ASGI server on 127.0.0.1 and a free port, in the test's own event loop.

Sharing the loop lets a test publish straight into the app while clients talk to it over real
sockets, and the server stops with the test. uvicorn by default; ``server="hypercorn"`` or
``"granian"`` runs the same app on those (granian's embedded server: its Rust runtime in threads
of this process, the app on this loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import socket
from collections.abc import AsyncIterator
from typing import Any

import uvicorn

from rubris_asgi import Rubris, Server
from rubris_asgi.serving import uvicorn_config

SERVERS = ["uvicorn", "hypercorn", "granian"]


@contextlib.asynccontextmanager
async def run_server(
    app: Any,
    *,
    lifespan: str = "on",
    server: str = "uvicorn",
    drain: Rubris | None = None,
    log_level: str = "warning",
    ws: str = "websockets-sansio",
    ws_per_message_deflate: bool = False,
    http: str | None = None,
) -> AsyncIterator[str]:
    """Serve ``app``; yields its base URL, e.g. ``http://127.0.0.1:41234``.

    ``drain``: uvicorn as ``rubris_asgi.serve`` runs it (``Server``), draining that rubris
    (GOODBYE 9) before uvicorn closes the connections. ``ws``, ``ws_per_message_deflate``:
    uvicorn's WebSocket implementation and whether it agrees to permessage-deflate. ``http``:
    uvicorn as ``serve()`` configures it (``uvicorn_config``: its connection timeouts, those of
    ``drain``), with that HTTP parser (``"h11"``, ``"httptools"``)."""
    if server == "hypercorn":
        async with _hypercorn(app) as base:
            yield base
        return
    if server == "granian":
        async with _granian(app) as base:
            yield base
        return
    assert server == "uvicorn", server
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and an
    # accepted socket inherits the listener's; without it a keep-alive HTTP answer written in
    # two parts waits ~40 ms for the client's delayed ACK (Nagle)
    sock = _free_socket()
    port = sock.getsockname()[1]
    if http is None:
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            ws=ws,
            ws_per_message_deflate=ws_per_message_deflate,
            log_level=log_level,
            lifespan=lifespan,
        )
    else:
        config = uvicorn_config(
            app, drain, port=port, http=http, ws=ws, log_level=log_level, lifespan=lifespan
        )
    server = uvicorn.Server(config) if drain is None else Server(config, drain)
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
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), 15)
        except asyncio.TimeoutError:
            # say what the stop waits on (the tasks' stacks), then end it
            stacks = io.StringIO()
            for t in asyncio.all_tasks():
                if t is not asyncio.current_task():
                    t.print_stack(limit=6, file=stacks)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 5)
            raise AssertionError(f"the server did not stop in 15 s:\n{stacks.getvalue()}") from None
        finally:
            sock.close()


def _free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


async def _wait_listening(port: int, task: asyncio.Task[None]) -> None:
    for _ in range(1000):
        if task.done():
            task.result()
            raise AssertionError("the server stopped while starting")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.01)
            continue
        writer.close()
        return
    raise AssertionError("the server did not start listening")


@contextlib.asynccontextmanager
async def _hypercorn(app: Any) -> AsyncIterator[str]:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    sock = _free_socket()
    port = sock.getsockname()[1]
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.loglevel = "WARNING"
    config.graceful_timeout = 5
    stop = asyncio.Event()
    task = asyncio.create_task(serve(app, config, shutdown_trigger=stop.wait))
    try:
        await _wait_listening(port, task)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        sock.detach()  # hypercorn took the descriptor and closed it


@contextlib.asynccontextmanager
async def _granian(app: Any) -> AsyncIterator[str]:
    from granian.constants import Interfaces
    from granian.server.embed import Server

    sock = _free_socket()  # a free port; granian binds it itself (SO_REUSEADDR on both)
    port = sock.getsockname()[1]
    sock.close()
    server = Server(
        app, address="127.0.0.1", port=port, interface=Interfaces.ASGI, log_enabled=False
    )
    task = asyncio.create_task(server.serve())
    try:
        await _wait_listening(port, task)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.signal_handler_interrupt()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
