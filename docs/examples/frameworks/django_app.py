"""A one-module Django project with rubris in front of it.

Django's ``ASGIHandler`` speaks no lifespan, so the middleware runs rubris's alone: it starts
before the first request and stops (GOODBYE 9, drain) when the server shuts down. Run it from
the repository root::

    uvicorn docs.examples.frameworks.django_app:application --ws-per-message-deflate false

Subscribe to ``prices.AAPL`` (``/rubris/ws``, ``/rubris/lp``, or ``/rubris/client.js`` in a
page), then publish through either view::

    curl -X POST 127.0.0.1:8000/price/AAPL -d '{"price": 189.5}'        # the sync view
    curl -X POST 127.0.0.1:8000/async/price/AAPL -d '{"price": 189.6}'  # the async one

``python3 -m docs.examples.frameworks.django_app`` serves it with ``rubris_asgi.serve``, which
also says GOODBYE (code 9) to every client on Ctrl-C before uvicorn closes the connections.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from django.conf import settings

settings.configure(
    DEBUG=False,
    SECRET_KEY="only-for-this-example",
    ALLOWED_HOSTS=["127.0.0.1", "localhost"],
    ROOT_URLCONF=__name__,
    MIDDLEWARE=[f"{__name__}.ServedBy"],
)

from django.core.asgi import get_asgi_application  # noqa: E402 (after settings)
from django.http import HttpRequest, HttpResponse, JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.http import require_POST  # noqa: E402

from rubris_asgi import Rubris, RubrisMiddleware, Session, serve  # noqa: E402

rubris = Rubris()


@rubris.shared("prices.{symbol}", snapshot=True)
async def prices(session: Session, symbol: str) -> None:
    return None  # no price yet: a subscriber gets the first one published


class ServedBy:
    """A Django middleware of the app's own: it runs for the views, not for /rubris."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response["X-Served-By"] = "django"
        return response


@require_POST
def set_price(request: HttpRequest, symbol: str) -> JsonResponse:
    # a sync view runs in a worker thread: publish hands the call to the server's event loop
    price = float(json.loads(request.body)["price"])
    seq = rubris.publish(f"prices.{symbol}", {"symbol": symbol, "price": price})
    return JsonResponse({"seq": seq})


@require_POST
async def set_price_async(request: HttpRequest, symbol: str) -> JsonResponse:
    price = float(json.loads(request.body)["price"])
    seq = rubris.publish(f"prices.{symbol}", {"symbol": symbol, "price": price})
    return JsonResponse({"seq": seq})


urlpatterns = [
    path("price/<str:symbol>", set_price),
    path("async/price/<str:symbol>", set_price_async),
]

application = RubrisMiddleware(get_asgi_application(), rubris=rubris)

if __name__ == "__main__":
    serve(application, rubris, port=8000)
