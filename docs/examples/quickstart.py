"""Quick start: a server with three kinds of channel and an RPC, and a client that uses them.

Run it: ``python3 docs/examples/quickstart.py`` (it serves on a free port of 127.0.0.1, talks to
itself over a real WebSocket and long-poll, prints what it sees, and stops).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn
from fastapi import FastAPI

from rubris_asgi import Reject, Rubris, Server, Session
from rubris_asgi.client import Client, SubscribeRejected

rubris = Rubris(compress_at=512)
LATEST = {"AAPL": {"symbol": "AAPL", "bid": 189.1, "ask": 189.2}}


@rubris.shared("prices.{symbol}", snapshot=True)
async def prices(session: Session, symbol: str) -> Any:
    if symbol not in LATEST:
        raise Reject(f"unknown symbol {symbol!r}")
    return LATEST[symbol]  # what a new subscriber gets at once


@rubris.shared("trades", ring=64)
async def trades(session: Session) -> None:
    return None


@rubris.private("fills", queue=1024, batch=5)
async def fills(session: Session) -> None:
    return None


@rubris.rpc("place_order")
async def place_order(session: Session, order: Any) -> dict[str, Any]:
    if not isinstance(order, dict) or order.get("qty", 0) <= 0:
        raise Reject("qty must be positive")
    await rubris.send(session, "fills", {"symbol": order["symbol"], "qty": order["qty"]})
    return {"status": "accepted"}


@rubris.rpc("countdown")
async def countdown(session: Session, n: Any) -> Any:
    for i in range(int(n), 0, -1):  # an async generator: a streamed reply
        yield i


app = FastAPI(lifespan=rubris.lifespan)
app.mount("/rubris", rubris)


async def client_side(url: str, transport: str) -> None:
    async with Client(url, transport=transport) as client:  # type: ignore[arg-type]
        price = await client.subscribe("prices.AAPL")
        value, info = await price.get(timeout=5)
        print(f"[{transport}] snapshot #{info.seq}: {value}")

        rubris.publish("prices.AAPL", {"symbol": "AAPL", "bid": 189.3, "ask": 189.4})
        value, info = await price.get(timeout=5)
        print(f"[{transport}] update   #{info.seq}: {value}")

        try:
            await client.subscribe("prices.NOPE")
        except SubscribeRejected as exc:
            print(f"[{transport}] refused: code {exc.code}, {exc.reason}")

        my_fills = await client.subscribe("fills")
        order = await client.call("place_order", {"symbol": "AAPL", "qty": 5})
        print(f"[{transport}] order:", order)
        fill, _ = await my_fills.get(timeout=5)
        print(f"[{transport}] fill:", fill)
        print(f"[{transport}] stream:", [x async for x in client.stream("countdown", 3)])


async def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, ws_per_message_deflate=False, log_level="warning")
    server = Server(config, rubris)  # drains rubris (GOODBYE 9) before uvicorn closes sockets
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 (uvicorn offers no "started" event)
        await asyncio.sleep(0.01)
    try:
        for transport in ("websocket", "longpoll"):
            await client_side(f"http://127.0.0.1:{port}/rubris", transport)
    finally:
        server.should_exit = True
        await task


if __name__ == "__main__":
    asyncio.run(main())
