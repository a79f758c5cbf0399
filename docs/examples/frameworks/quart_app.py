"""Quart with rubris in front of it.

Run it from the repository root::

    uvicorn docs.examples.frameworks.quart_app:app --ws-per-message-deflate false

Subscribe to ``prices.AAPL`` (``/rubris/ws``, ``/rubris/lp``, or ``/rubris/client.js`` in a
page), then publish through the app's own route::

    curl -X POST 127.0.0.1:8000/price/AAPL -H 'Content-Type: application/json' \
        -d '{"price": 189.5}'

``python3 -m docs.examples.frameworks.quart_app`` serves it with ``rubris_asgi.serve``, which
also says GOODBYE (code 9) to every client on Ctrl-C before uvicorn closes the connections.
"""

from __future__ import annotations

from quart import Quart, Response, request

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


quart_app = Quart(__name__)


@quart_app.before_serving
async def startup() -> None:
    SEEN["startup"] = rubris.started  # the middleware started rubris first
    rubris.publish("market", {"open": True})


@quart_app.after_serving
async def shutdown() -> None:
    SEEN["shutdown"] = rubris.started  # rubris stops after this


@quart_app.after_request
async def served_by(response: Response) -> Response:
    response.headers["X-Served-By"] = "quart"
    return response


@quart_app.post("/price/<symbol>")
async def set_price(symbol: str) -> dict[str, int]:
    price = float((await request.get_json())["price"])
    return {"seq": rubris.publish(f"prices.{symbol}", {"symbol": symbol, "price": price})}


app = RubrisMiddleware(quart_app, rubris=rubris)

if __name__ == "__main__":
    serve(app, rubris, port=8000)
