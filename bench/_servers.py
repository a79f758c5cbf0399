"""Serving a bench's ASGI app on uvicorn, hypercorn or granian: the server half's shared helper.

:func:`serve` runs the app on 127.0.0.1, on a free port announced as ``PORT n`` on stdout (the
bench then polls its ``/control/stats`` until it answers), with one worker process, lifespan
on, no access log, no WebSocket ping from the server and no permessage-deflate:

    uvicorn    uvloop, httptools, the ``websockets-sansio`` WebSocket implementation,
               ``ws_per_message_deflate=False``; serves the pre-bound listening socket
    hypercorn  ``hypercorn.asyncio.serve`` on a uvloop loop, bound to the pre-bound listening
               socket (``fd://N``); hypercorn (wsproto) cannot turn permessage-deflate off, it
               only agrees to it when the client offers it, and the bench's clients do not;
               max WebSocket message 64 MiB
    granian    interface ``asgi`` (with lifespan), 1 worker, websockets on, HTTP/1, uvloop, its
               default runtime threads, a backpressure (requests in flight) of 65,536 rather
               than the backlog. Granian binds its own listener (SO_REUSEPORT), so the port is
               reserved by a socket bound with SO_REUSEPORT that never listens (and so never
               takes a connection), held until granian exits. Granian has no permessage-deflate.
               It logs to stdout, so after ``PORT n`` stdout is made stderr. The app runs in
               granian's *worker*, a child process (forked), which builds it with ``make_app``:
               the CPU and RSS the app reports from there (getrusage RUSAGE_SELF) are the
               worker's, its Rust threads included, and the core this process is pinned to is
               inherited by the worker and all its threads. SIGTERM reaches granian's main
               process, which stops the worker (SIGKILL if it has not stopped after 8 s).

``make_app`` is called in the process that runs the app; for granian it must be picklable
(a module-level function or a ``functools.partial`` of one) should multiprocessing ever spawn
rather than fork.

:func:`orphan_watchdog` (run from the app's lifespan) ends the app's process when the bench
is gone: when its parent changes (uvicorn, hypercorn: the parent is the bench; granian: the
parent is granian's main process, which the worker outlives if that is killed) or when the
process named by ``RUBRIS_BENCH_PID`` (set by the bench) no longer exists. Granian's main
process then sees its worker exit and stops too.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import Callable
from typing import Any

SERVERS = ("uvicorn", "hypercorn", "granian")
BENCH_PID_ENV = "RUBRIS_BENCH_PID"
BACKLOG = 4096


def _listening_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(BACKLOG)
    return sock


def _announce(port: int) -> None:
    print(f"PORT {port}", flush=True)


def serve(make_app: Callable[[], Any], server: str = "uvicorn") -> None:
    """Serve ``make_app()`` on ``server`` (one of :data:`SERVERS`) until SIGTERM or SIGINT."""
    if server == "uvicorn":
        serve_uvicorn(make_app())
    elif server == "hypercorn":
        serve_hypercorn(make_app())
    elif server == "granian":
        serve_granian(make_app)
    else:
        raise ValueError(f"unknown server {server!r}: one of {', '.join(SERVERS)}")


def serve_uvicorn(app: Any) -> None:
    import uvicorn

    sock = _listening_socket()
    config = uvicorn.Config(
        app,
        loop="uvloop",
        http="httptools",
        ws="websockets-sansio",
        ws_per_message_deflate=False,
        ws_ping_interval=None,
        ws_ping_timeout=None,
        log_level="warning",
        lifespan="on",
        backlog=BACKLOG,
        timeout_graceful_shutdown=5,
        access_log=False,
    )
    server = uvicorn.Server(config)
    _announce(sock.getsockname()[1])
    server.run(sockets=[sock])


def serve_hypercorn(app: Any) -> None:
    import uvloop
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    sock = _listening_socket()
    port = sock.getsockname()[1]
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]  # hypercorn owns the descriptor from here on
    config.backlog = BACKLOG
    config.accesslog = None
    config.errorlog = "-"
    config.loglevel = "WARNING"
    config.websocket_ping_interval = None
    config.websocket_max_message_size = 64 * 2**20
    config.graceful_timeout = 5
    _announce(port)
    # no shutdown_trigger: hypercorn stops on SIGTERM / SIGINT itself, lifespan shutdown included
    uvloop.run(hypercorn_serve(app, config, mode="asgi"))


def serve_granian(make_app: Callable[[], Any]) -> None:
    from granian import Granian
    from granian.constants import HTTPModes, Interfaces, Loops
    from granian.log import LogLevels

    # the port: bound with SO_REUSEPORT (as granian binds its own listener) but never listening,
    # so no other process can take it and no connection lands on it; held until granian exits
    reserve = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    reserve.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    reserve.bind(("127.0.0.1", 0))
    port = reserve.getsockname()[1]
    server = Granian(
        "rubris-bench",  # not imported: the worker builds the app with make_app
        address="127.0.0.1",
        port=port,
        interface=Interfaces.ASGI,
        workers=1,
        loop=Loops.uvloop,
        http=HTTPModes.http1,
        websockets=True,
        backlog=BACKLOG,
        # requests (a WebSocket is one) handled at once by the worker; granian's default is
        # the backlog, which would stall the 5,000th client
        backpressure=65536,
        log_level=LogLevels.warning,
        log_access=False,
        workers_kill_timeout=8,  # SIGKILL a worker that has not stopped 8 s after SIGTERM
    )
    _announce(port)
    # granian logs to stdout, which the bench reads only for PORT: from here on it is stderr
    sys.stdout.flush()
    os.dup2(2, 1)
    try:
        server.serve(target_loader=make_app, wrap_loader=False)
    finally:
        reserve.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def orphan_watchdog() -> None:
    """Exit when the bench that started us is gone: a benchmark leaves nothing behind."""
    parent = os.getppid()
    bench = int(os.environ.get(BENCH_PID_ENV) or 0)
    while True:
        await asyncio.sleep(0.5)
        if os.getppid() != parent or (bench and not _alive(bench)):
            os._exit(3)
