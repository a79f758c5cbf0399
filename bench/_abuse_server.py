"""The server half of bench/abuse.py: the app under attack, served by ``rubris_asgi.serve``.

Started by bench/abuse.py as a subprocess (``--port`` chosen by the bench, ``--dir`` a scratch
directory for the batch store); not meant to be run by hand, though
``python3 bench/_abuse_server.py --port 8000 --dir /tmp`` works. Everything is on 127.0.0.1.

``Rubris()`` with the default ``Config`` (no limit or timing changed), served by
``rubris_asgi.serve`` (which sets uvicorn's timeouts) with uvicorn's log at ``warning``:

    authenticate    the user is the ``X-User`` header (absent: anonymous, user None); a user in
                    the revoked set is refused (``Reject``)
    authorize_api   trusts a cookie ``user=alice`` (what a browser sends whatever page asks: the
                    CSRF scenario); no ``api_token``
    chat.{room}     ring, ``client_publish=True``; room "staff" only for alice
    trades.{symbol} ring, any symbol (topic creation as an attack surface)
    orders.{user}   ring, only for that user

Control routes (the bench's; not under the Rubris mount):

    POST /control/revoke/{user}   add ``user`` to the revoked set and
                                  ``await rubris.disconnect(user=user, reason="revoked")``;
                                  answers ``{"ended": n}``
    GET  /control/topics[?prefix=p]
                                  ``{"topics": n, "sessions": n, "seqs": n}``: the engine's
                                  shared topics and sessions; ``seqs`` the messages the topics
                                  named ``p...`` hold numbered (their seqs summed)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import HTTPConnection, Request
from starlette.responses import Response
from starlette.routing import Mount, Route

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _servers import orphan_watchdog  # noqa: E402

from rubris_asgi import ErrorCode, Reject, Rubris, Session, serve  # noqa: E402

REVOKED: set[str] = set()


def authenticate(conn: HTTPConnection) -> str | None:
    """The ``X-User`` header; none: anonymous. A revoked user is refused."""
    user = conn.headers.get("x-user") or None
    if user is not None and user in REVOKED:
        raise Reject("revoked")
    return user


def authorize_api(request: Request, name: str) -> bool:
    """A hook that trusts a cookie: what makes a cross-site request dangerous."""
    return request.cookies.get("user") == "alice"


def build(batches_path: str) -> tuple[Starlette, Rubris]:
    rubris = Rubris(
        authenticate=authenticate,
        authorize_api=authorize_api,
        batches=batches_path,  # the default store, in the bench's scratch directory
    )

    @rubris.shared("chat.{room}", client_publish=True)
    def chat(session: Session, room: str) -> None:
        if room == "staff" and session.user != "alice":
            raise Reject("staff only", ErrorCode.NOT_AUTHORISED)

    @rubris.shared("trades.{symbol}")
    def trades(session: Session, symbol: str) -> None:
        return None

    @rubris.shared("orders.{user}")
    def orders(session: Session, user: str) -> None:
        if session.user != user:
            raise Reject("not yours", ErrorCode.NOT_AUTHORISED)

    async def revoke(request: Request) -> Response:
        user = request.path_params["user"]
        REVOKED.add(user)
        ended = await rubris.disconnect(user=user, reason="revoked")
        return Response(orjson.dumps({"ended": ended}), media_type="application/json")

    async def topics(request: Request) -> Response:
        engine = rubris.engine
        prefix = request.query_params.get("prefix")
        seqs = 0
        if prefix:
            seqs = sum(t.seq for name, t in engine.topics.items() if name.startswith(prefix))
        body = {"topics": len(engine.topics), "sessions": len(engine.sessions), "seqs": seqs}
        return Response(orjson.dumps(body), media_type="application/json")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with rubris.lifespan(app):
            watchdog = asyncio.create_task(orphan_watchdog())  # gone with the bench
            try:
                yield
            finally:
                watchdog.cancel()

    app = Starlette(
        routes=[
            Route("/control/revoke/{user}", revoke, methods=["POST"]),
            Route("/control/topics", topics, methods=["GET"]),
            Mount("/rubris", app=rubris),
        ],
        lifespan=lifespan,
    )
    return app, rubris


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--dir", required=True, help="scratch directory (the batch store)")
    args = ap.parse_args()
    app, rubris = build(os.path.join(args.dir, "batches.sqlite3"))
    options: dict[str, Any] = {"log_level": "warning"}
    serve(app, rubris, host="127.0.0.1", port=args.port, **options)


if __name__ == "__main__":
    main()
