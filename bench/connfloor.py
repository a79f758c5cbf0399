"""The server's own floor: what a WebSocket connection costs uvicorn with an app that does nothing.

    python3 bench/connfloor.py [--n 5000]

Not a test. The app is raw ASGI, no Starlette and no rubris: it accepts the connection and
waits for its end (and answers any HTTP request with its process's RSS after ``gc.collect()``).
It runs under uvicorn as every bench serves it (bench/_servers.py: uvloop, httptools,
``websockets-sansio``, no permessage-deflate; pinned to core 0), the clients in this process
(``websockets.asyncio.client``, pinned to core 1). After a warm-up of 200 connections opened and
closed, RSS is read, N connections are opened, and RSS is read again: the difference over N is
what the server and the interpreter keep per connection before any application runs (uvicorn's
protocol object, its receive queue and event, the ``websockets`` parser, the uvloop transport,
the ASGI scope). bench/connmem.py measures rubris and the plain loop above it.

Last line: ``floor_kib_per_conn=N``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import resource
import subprocess
import sys
import urllib.request
from typing import Any

from websockets.asyncio.client import connect

HERE = os.path.dirname(os.path.abspath(__file__))
WARMUP = 200


def own_rss() -> int:
    """This process's resident set after a full collection, in bytes."""
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Accept and wait; an HTTP request answers with the RSS after a collection."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(own_rss()).encode()})
        return
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    while (await receive())["type"] != "websocket.disconnect":
        pass


def raise_nofile() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def serve() -> None:
    """The server process: this module's ``app`` under uvicorn, pinned to core 0; it prints
    ``PORT n`` once listening (bench/_servers.py)."""
    raise_nofile()
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {0})
    sys.path.insert(0, HERE)
    from _servers import serve_uvicorn

    serve_uvicorn(app)


def rss(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as r:
        return int(r.read())


async def measure(port: int, n: int) -> float:
    url = f"ws://127.0.0.1:{port}/"

    async def one(sem: asyncio.Semaphore) -> Any:
        async with sem:
            return await connect(url, compression=None, open_timeout=60, ping_interval=None)

    sem = asyncio.Semaphore(200)
    for ws in await asyncio.gather(*(one(sem) for _ in range(WARMUP))):
        await ws.close()
    await asyncio.sleep(0.5)
    before = rss(port)
    conns = await asyncio.gather(*(one(sem) for _ in range(n)))
    await asyncio.sleep(1.0)
    after = rss(port)
    for ws in conns:
        ws.transport.abort()
    return (after - before) / n / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve()
        return
    raise_nofile()
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if not line.startswith("PORT "):
            raise SystemExit(f"the server did not start: {line!r}")
        kib = asyncio.run(measure(int(line.split()[1]), args.n))
    finally:
        server.terminate()
        server.wait(10)
    print(f"cores={os.cpu_count()} uvicorn, a raw ASGI app that accepts and waits, {args.n} conns")
    print(f"floor_kib_per_conn={kib:.2f}")


if __name__ == "__main__":
    main()
