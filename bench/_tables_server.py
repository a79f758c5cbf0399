"""The server half of bench/tables.py's CPU figure: the demo's order book, one topic, applied
step by step by the server itself; its CPU measured around the steps.

Started by bench/tables.py as a subprocess (``--mode snapshot|keyed``), prints ``PORT n``.
``POST /control/run?steps=N&rate=R`` applies the first N steps of the book's stream at R steps
a second, waits for the cycles to deliver them, and answers ``{"cpu": seconds, "steps": N}``
(user + system CPU of this process from the first step to the last delivery). ``GET
/control/subscribers`` answers how many sessions subscribe to the book.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _servers import orphan_watchdog, serve_uvicorn  # noqa: E402
from tables import stream  # noqa: E402

from rubris_asgi import Rubris  # noqa: E402

NAME = "book.AAPL"


def cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def make_app(keyed: bool, steps: int) -> Starlette:
    first, changes, snapshots = stream(steps)
    rubris = Rubris(compress_at=256)  # the demo's book channel had compress_at=256
    if keyed:

        @rubris.shared("book.{symbol}", keyed=True)
        def book_keyed(session: Any, symbol: str) -> Any:
            return first.table()

    else:

        @rubris.shared("book.{symbol}", snapshot=True)
        def book_snapshot(session: Any, symbol: str) -> Any:
            return first.snapshot()

    async def run(request: Request) -> Response:
        n = int(request.query_params["steps"])
        rate = float(request.query_params["rate"])
        start = time.monotonic()
        used = cpu()
        for i in range(n):
            if keyed:
                for op, key, level in changes[i]:
                    if op == "set":
                        rubris.set(NAME, key, level)
                    else:
                        rubris.delete(NAME, key)
            else:
                rubris.publish(NAME, snapshots[i])
            await asyncio.sleep(max(0.0, start + (i + 1) / rate - time.monotonic()))
        await asyncio.sleep(0.2)  # the last step's deliveries
        return Response(orjson.dumps({"cpu": cpu() - used, "steps": n}))

    async def subscribers(request: Request) -> Response:
        t = rubris.engine.topics.get(NAME)
        return Response(orjson.dumps(len(t.subs) if t is not None else 0))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with rubris:
            watchdog = asyncio.create_task(orphan_watchdog())
            yield
            watchdog.cancel()

    return Starlette(
        routes=[
            Route("/control/run", run, methods=["POST"]),
            Route("/control/subscribers", subscribers),
            Mount("/rubris", rubris),
        ],
        lifespan=lifespan,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("snapshot", "keyed"), required=True)
    ap.add_argument("--steps", type=int, default=600)
    args = ap.parse_args()
    serve_uvicorn(make_app(args.mode == "keyed", args.steps))


if __name__ == "__main__":
    main()
