"""FastAPI with rubris added as middleware.

Run it from the repository root::

    uvicorn docs.examples.frameworks.fastapi_app:app --ws-per-message-deflate false

Subscribe to ``prices.AAPL`` (``/rubris/ws``, ``/rubris/lp``, or ``/rubris/client.js`` in a
page), then publish through the app's own route::

    curl -X POST 127.0.0.1:8000/price/AAPL -H 'Content-Type: application/json' \
        -d '{"price": 189.5}'

``python3 -m docs.examples.frameworks.fastapi_app`` serves it with ``rubris_asgi.serve``, which
also says GOODBYE (code 9) to every client on Ctrl-C before uvicorn closes the connections.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from pydantic import BaseModel

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
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    SEEN["startup"] = rubris.started  # the middleware started rubris first
    rubris.publish("market", {"open": True})
    yield
    SEEN["shutdown"] = rubris.started  # rubris stops after this


app = FastAPI(lifespan=lifespan)
Endpoint = Callable[[Request], Awaitable[Response]]


@app.middleware("http")
async def served_by(request: Request, call_next: Endpoint) -> Response:
    response = await call_next(request)
    response.headers["x-served-by"] = "fastapi"
    return response


class Price(BaseModel):
    price: float


@app.post("/price/{symbol}")
async def set_price(symbol: str, body: Price) -> dict[str, int]:
    return {"seq": rubris.publish(f"prices.{symbol}", {"symbol": symbol, "price": body.price})}


# Added last, so outermost: /rubris/... skips the middleware above. (Mounting still works too:
# app.mount("/rubris", rubris), with `async with rubris:` around the lifespan's yield.)
app.add_middleware(RubrisMiddleware, rubris=rubris)

if __name__ == "__main__":
    serve(app, rubris, port=8000)
