"""The app tests/test_restarts.py stops and starts under each ASGI server, in both forms.

``app``: rubris mounted in Starlette with its lifespan; ``wrapped``: ``RubrisMiddleware`` in
front of a plain ASGI app (the form Django, Litestar and Quart use). Channels: ``ticks`` (a
shared topic clients publish to), ``jobs`` (a work queue clients enqueue to), and the demo's
``reprice`` queue and ``reprice.results`` topic, so that example_app/worker.py works its jobs.
``python3 -m tests.restart_app PORT`` serves ``app`` with ``rubris_asgi.serve``.
"""

from __future__ import annotations

import sys
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.types import Receive, Scope, Send

from rubris_asgi import Rubris, RubrisMiddleware, Session, serve


def make() -> Rubris:
    rubris = Rubris()

    @rubris.shared("ticks", client_publish=True)
    async def ticks(session: Session) -> None:
        return None

    @rubris.shared("reprice.results", client_publish=True)
    async def results(session: Session) -> None:
        return None

    @rubris.queue("jobs", client_publish=True)
    async def jobs(session: Session) -> None:
        return None

    @rubris.queue("reprice", client_publish=True)
    async def reprice(session: Session) -> None:
        return None

    return rubris


rubris = make()
app = Starlette(routes=[Mount("/rubris", app=rubris)], lifespan=rubris.lifespan)


async def _plain(scope: Scope, receive: Receive, send: Send) -> None:
    """The wrapped app: it answers every request of its own with 204."""
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


_wrapped_rubris = make()
wrapped: Any = RubrisMiddleware(_plain, rubris=_wrapped_rubris, path="/rubris")

if __name__ == "__main__":
    serve(app, rubris, port=int(sys.argv[1]), log_level="info")
