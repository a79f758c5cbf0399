"""Litestar with rubris in front of it.

Litestar's own middleware only wraps its route handlers (no lifespan, no unknown paths), so
rubris wraps the whole app instead. Run it from the repository root::

    uvicorn docs.examples.frameworks.litestar_app:app --ws-per-message-deflate false

Subscribe to ``prices.AAPL`` (``/rubris/ws``, ``/rubris/lp``, or ``/rubris/client.js`` in a
page), then publish through the app's own route::

    curl -X POST 127.0.0.1:8000/price/AAPL -d '{"price": 189.5}'

``python3 -m docs.examples.frameworks.litestar_app`` serves it with ``rubris_asgi.serve``, which
also says GOODBYE (code 9) to every client on Ctrl-C before uvicorn closes the connections.
"""

from __future__ import annotations

from dataclasses import dataclass

from litestar import Litestar, post
from litestar.datastructures import MutableScopeHeaders
from litestar.middleware import ASGIMiddleware
from litestar.params import FromPath, JSONBody
from litestar.types import ASGIApp, Message, Receive, Scope, Send

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


async def on_startup() -> None:
    SEEN["startup"] = rubris.started  # the middleware started rubris first
    rubris.publish("market", {"open": True})


async def on_shutdown() -> None:
    SEEN["shutdown"] = rubris.started  # rubris stops after this


class ServedBy(ASGIMiddleware):
    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        async def send_marked(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableScopeHeaders.from_message(message)["x-served-by"] = "litestar"
            await send(message)

        await next_app(scope, receive, send_marked)


@dataclass
class Price:
    price: float


@post("/price/{symbol:str}", status_code=200)
async def set_price(symbol: FromPath[str], data: JSONBody[Price]) -> dict[str, int]:
    return {"seq": rubris.publish(f"prices.{symbol}", {"symbol": symbol, "price": data.price})}


api = Litestar(
    route_handlers=[set_price],
    middleware=[ServedBy()],
    on_startup=[on_startup],
    on_shutdown=[on_shutdown],
)
app = RubrisMiddleware(api, rubris=rubris)

if __name__ == "__main__":
    serve(app, rubris, port=8000)
