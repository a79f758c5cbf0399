"""The live operations page: ``{mount}/ops``, its script and ``{mount}/ops/stats``.

Off unless ``Rubris(ops=True)``, and then behind the HTTP API's authorisation: the API token
(as ``Authorization: Bearer``, or as the password of HTTP Basic, which is what a browser can
send when it navigates to a page: the 401 asks for it, and is not counted among the refusals
when the request sent no credentials, :func:`challenge`) and the ``authorize_api`` hook, asked
with the name ``OPS`` (a name no channel can offer, so a hook that allows topics by pattern
does not open the page by accident). The stats answer is every worker's snapshot
(workers.py); the page (static/ops/ops.js and the modules beside it, no build) polls it every
second and draws the last five minutes. Its first request asks ``?history=1``: the answer then
also holds every worker's samples of the last five minutes (history.py), so the charts open
full instead of starting empty.

Every answer carries ``X-Content-Type-Options: nosniff`` and a Content-Security-Policy. The
page's (:data:`PAGE_CSP`) allows exactly what it uses: its scripts and their requests from its
own origin, no inline script; the style sheet and the legend's colour swatches ops.js writes
inline; the empty ``data:`` icon. A stats answer, being data, lets nothing run.
"""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route

from ..server.assets import Assets
from ..server.hardening import DATA_HEADERS, NOSNIFF
from ..server.http.guard import Refusal
from ..server.http.publish import HttpApi
from .workers import WorkerBoard

OPS = "$ops"
"""The name ``authorize_api`` is asked about for the ops page and its stats."""

PAGE_CSP = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",  # ops.js and its modules, loaded by the shell below; never inline
        "connect-src 'self'",  # its polls of ops/stats
        # ops.js builds its style sheet as a <style> element and sets each chart legend's
        # swatch colour as a style attribute; styles cannot run code, and with nothing else
        # allowed to load, a style cannot send anything anywhere either
        "style-src 'unsafe-inline'",
        "img-src data:",  # the empty icon that spares a /favicon.ico request
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
"""The page's Content-Security-Policy: what it loads and nothing more."""

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>rubris ops</title></head>
<body><noscript>The operations page needs JavaScript.</noscript>
<script type="module" src="{script}"></script></body></html>
"""


def challenge(request: Request, refusal: Refusal) -> bool:
    """Whether ``refusal`` is the 401 that asks a browser for credentials: the request sent
    none. A browser opening the page always asks without them first and sends them only after
    this answer brings up its login prompt, so every visit starts with one; counted, it would
    fill the Errors table of the very page the operator just opened. A request that sent
    credentials the page refused (a wrong password or token) is counted."""
    return refusal.status == 401 and "authorization" not in request.headers


class OpsPage:
    """The routes of the operations page (mounted by ``Rubris`` when ``ops=True``)."""

    def __init__(self, api: HttpApi, board: WorkerBoard, assets: Assets) -> None:
        if not api.enabled:
            raise ValueError(
                "ops=True needs api_token or authorize_api: the page is behind the HTTP API's "
                "authorisation"
            )
        self.api = api
        self.board = board
        self.assets = assets

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/ops", self.page, methods=["GET", "HEAD"]),
            Route("/ops/stats", self.stats, methods=["GET"]),
            Route("/ops/{name}.js", self.script, methods=["GET", "HEAD"]),
        ]

    async def _refused(self, request: Request) -> Response | None:
        try:
            self.api.check_token(request, basic=True)
            await self.api.check_authorised(request, [(None, OPS)], "see")
        except Refusal as r:
            headers = {"WWW-Authenticate": 'Basic realm="rubris ops"'} if r.status == 401 else {}
            if not challenge(request, r):
                self.api.engine.telemetry.api_refusals[r.status] += 1
            return Response(
                orjson.dumps({"error": r.error}),
                r.status,
                {**headers, **DATA_HEADERS, "Cache-Control": "no-store"},
                media_type="application/json",
            )
        return None

    async def page(self, request: Request) -> Response:
        refused = await self._refused(request)
        if refused is not None:
            return refused
        script = request.scope.get("root_path", "") + "/ops/ops.js"
        return HTMLResponse(
            _PAGE.format(script=script),
            headers={
                "Cache-Control": "no-store",
                "X-Frame-Options": "DENY",
                "X-Content-Type-Options": NOSNIFF,
                "Content-Security-Policy": PAGE_CSP,
            },
        )

    async def script(self, request: Request) -> Response:
        refused = await self._refused(request)
        if refused is not None:
            return refused
        return self.assets.response(request, f"ops/{request.path_params['name']}.js")

    async def stats(self, request: Request) -> Response:
        refused = await self._refused(request)
        if refused is not None:
            return refused
        workers = self.board.snapshots()
        body = {"time": workers[0]["time"], "interval": self.board.interval, "workers": workers}
        if request.query_params.get("history"):
            body["history"] = self.board.histories(workers)
        return Response(
            orjson.dumps(body),
            headers={**DATA_HEADERS, "Cache-Control": "no-store"},
            media_type="application/json",
        )
