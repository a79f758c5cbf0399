"""rubris in front of a bare ASGI callable: no framework, a lifespan of its own.

Run it from the repository root::

    uvicorn docs.examples.frameworks.plain_asgi:app --ws-per-message-deflate false

Subscribe to ``prices.AAPL`` (``/rubris/ws``, ``/rubris/lp``, or ``/rubris/client.js`` in a
page), then publish through the app's own route::

    curl -X POST 127.0.0.1:8000/price/AAPL -d '{"price": 189.5}'

``python3 -m docs.examples.frameworks.plain_asgi`` serves it with ``rubris_asgi.serve``, which
also says GOODBYE (code 9) to every client on Ctrl-C before uvicorn closes the connections.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Receive, Scope, Send

from rubris_asgi import Rubris, RubrisMiddleware, Session, serve

rubris = Rubris()
SEEN: dict[str, bool] = {}
"""``rubris.started`` as the app's startup and shutdown saw it (True both times)."""


@rubris.shared("prices.{symbol}", snapshot=True)
async def prices(session: Session, symbol: str) -> None:
    return None  # no price yet: a subscriber gets the first one published


@rubris.shared("market", snapshot=True)
async def market(session: Session) -> None:
    return None


async def lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            SEEN["startup"] = rubris.started  # the middleware started rubris first
            rubris.publish("market", {"open": True})
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            SEEN["shutdown"] = rubris.started  # rubris stops after this
            await send({"type": "lifespan.shutdown.complete"})
            return


async def respond(send: Send, status: int, body: Any) -> None:
    headers = [(b"content-type", b"application/json"), (b"x-served-by", b"plain-asgi")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


async def asgi_app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    if scope["type"] != "http":  # a WebSocket outside /rubris: this app has none
        await send({"type": "websocket.close", "code": 1000})
        return
    route = scope["path"].split("/")  # "/price/AAPL" -> ["", "price", "AAPL"]
    if scope["method"] != "POST" or len(route) != 3 or route[1] != "price":
        await respond(send, 404, {"error": "not found"})
        return
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    symbol, price = route[2], float(json.loads(body)["price"])
    seq = rubris.publish(f"prices.{symbol}", {"symbol": symbol, "price": price})
    await respond(send, 200, {"seq": seq})


app = RubrisMiddleware(asgi_app, rubris=rubris, path="/rubris")

if __name__ == "__main__":
    serve(app, rubris, port=8000)
