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
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any

import uvicorn

from .app import Rubris
from .cluster import WORKERS_ENV

log = logging.getLogger("rubris_asgi")


RESPAWN_PAUSE = 1.0
"""Seconds between a worker's death and its replacement (a crash loop costs little)."""
STARTUP_GRACE = 10.0
"""A worker that dies this soon after it was started failed to start: all of them stop, as
uvicorn alone does when its startup fails (a wrong setting would fail every replacement)."""


class Server(uvicorn.Server):
    """``uvicorn.Server`` that drains ``rubris`` before closing connections (every ``Rubris``
    started in this process when none is given: what a worker of ``serve(workers=N)`` does)."""

    def __init__(
        self, config: uvicorn.Config, rubris: Rubris | Iterable[Rubris] | None = None
    ) -> None:
        super().__init__(config)
        if rubris is None:
            rubris = ()
        self.rubris = [rubris] if isinstance(rubris, Rubris) else list(rubris)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        targets = self.rubris or list(Rubris.running)
        for r in targets:
            await r.drain()
        # uvicorn now closes every connection and waits until each is gone, but a closing
        # transport first flushes what it holds, which a peer that stopped reading never lets
        # happen: uvicorn would wait for it forever. Every session has had its GOODBYE, or
        # shutdown_drain to take it; a connection still stuck after as long again is cut.
        grace = max((r.config.timing.shutdown_drain for r in targets), default=5.0)
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
    rubris: Rubris | Iterable[Rubris] | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    **uvicorn_options: Any,
) -> None:
    """Run ``app`` on uvicorn until interrupted, draining ``rubris`` on the way out.

    ``workers``: processes sharing the port. More than one needs ``app`` as an import string
    (``"myapp:app"``: each worker imports it and builds its own ``Rubris``, which it drains)
    and a broker that shares their topics (``RUBRIS_REDIS_URL``, or ``Rubris(broker=...)``);
    a worker that dies is replaced. Per-message deflate at the WebSocket layer is off by
    default: rubris deflates each message itself, and compressing twice costs CPU for nothing.
    """
    uvicorn_options.setdefault("ws_per_message_deflate", False)
    if workers > 1:
        if not isinstance(app, str):
            raise ValueError('serve(workers=N): pass the app as an import string ("module:app")')
        if rubris is not None:
            raise ValueError("serve(workers=N): each worker drains its own Rubris; pass none")
        _serve_workers(uvicorn.Config(app, host=host, port=port, **uvicorn_options), workers)
        return
    if rubris is None and not isinstance(app, str):
        raise ValueError("serve(app, rubris): the Rubris to drain on the way out is missing")
    config = uvicorn.Config(app, host=host, port=port, **uvicorn_options)
    # uvicorn re-raises the Ctrl-C it handled gracefully; the shutdown is over by then
    with contextlib.suppress(KeyboardInterrupt):
        Server(config, rubris).run()


def _serve_workers(config: uvicorn.Config, workers: int) -> None:
    """Our own supervisor, as uvicorn's runs its plain ``Server`` in the workers (no drain)."""
    os.environ[WORKERS_ENV] = str(workers)  # the workers inherit it
    sock = config.bind_socket()
    ctx = multiprocessing.get_context("spawn")
    stopping = threading.Event()

    def start() -> multiprocessing.process.BaseProcess:
        p = ctx.Process(target=_worker, args=(config, sock), name="rubris-worker")
        p.start()
        return p

    def stop(signum: int, frame: object) -> None:
        stopping.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    procs = [start() for _ in range(workers)]
    log.info("%d workers started (pids %s)", workers, ", ".join(str(p.pid) for p in procs))
    born = [time.monotonic()] * workers
    failed = False
    try:
        while not stopping.wait(0.5):
            for i, p in enumerate(procs):
                if p.is_alive() or stopping.is_set():
                    continue
                if time.monotonic() - born[i] < STARTUP_GRACE:  # it could not even start
                    log.error("worker %s failed to start (exit code %s)", p.pid, p.exitcode)
                    failed = True
                    stopping.set()
                    break
                log.error("worker %s exited with code %s: starting another", p.pid, p.exitcode)
                stopping.wait(RESPAWN_PAUSE)
                procs[i] = start()
                born[i] = time.monotonic()
    finally:
        for p in procs:
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGTERM)  # each drains, then exits
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
        sock.close()
    if failed:
        raise SystemExit(3)  # uvicorn's code for a failed startup


def _worker(config: uvicorn.Config, sock: socket.socket) -> None:
    config.configure_logging()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor says when (SIGTERM)
    with contextlib.suppress(KeyboardInterrupt):
        Server(config).run(sockets=[sock])
