"""Starlette with rubris added as middleware.

Run it from the repository root::

    uvicorn docs.examples.frameworks.starlette_app:app --ws-per-message-deflate false

Subscribe to ``prices.AAPL`` (``/rubris/ws``, ``/rubris/lp``, or ``/rubris/client.js`` in a
page), then publish through the app's own route::

    curl -X POST 127.0.0.1:8000/price/AAPL -d '{"price": 189.5}'

``python3 -m docs.examples.frameworks.starlette_app`` serves it with ``rubris_asgi.serve``, which
also says GOODBYE (code 9) to every client on Ctrl-C before uvicorn closes the connections.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

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


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    SEEN["startup"] = rubris.started  # the middleware started rubris first
    rubris.publish("market", {"open": True})
    yield
    SEEN["shutdown"] = rubris.started  # rubris stops after this


class ServedBy(BaseHTTPMiddleware):
    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await call_next(request)
        response.headers["x-served-by"] = "starlette"
        return response


async def set_price(request: Request) -> JSONResponse:
    symbol, price = request.path_params["symbol"], float((await request.json())["price"])
    seq = rubris.publish(f"prices.{symbol}", {"symbol": symbol, "price": price})
    return JSONResponse({"seq": seq})


app = Starlette(
    routes=[Route("/price/{symbol}", set_price, methods=["POST"])],
    middleware=[Middleware(ServedBy)],
    lifespan=lifespan,
)
# Added last, so outermost: /rubris/... skips ServedBy. (Mounting still works too:
# Mount("/rubris", rubris) in routes, with `async with rubris:` around the lifespan's yield.)
app.add_middleware(RubrisMiddleware, rubris=rubris)

if __name__ == "__main__":
    serve(app, rubris, port=8000)
