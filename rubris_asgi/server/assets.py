"""The browser files the plugin serves: ``client.js`` and the ES modules it imports.

Every ``.js`` file under ``static/`` is read once, at construction, into memory with a strong
ETag (a hash of its bytes). Requests are looked up by name in that table, so nothing outside it
is ever served (no path is joined from the URL). Responses carry ``Cache-Control: no-cache``
with the ETag: a browser keeps its copy and revalidates it on each page load, getting a
bodiless 304 while the file is unchanged and the new file right after an upgrade. Long-lived
``immutable`` caching would need hashed file names, which means a build step, and the client
is deliberately buildless. Every answer carries ``X-Content-Type-Options: nosniff`` (a browser
runs the file as the script it says it is, never sniffs it into something else) and a
Content-Security-Policy (hardening.py: ``SCRIPT_CSP``, ``DATA_CSP`` for the 404's text).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from .hardening import DATA_HEADERS, NOSNIFF, SCRIPT_CSP

STATIC = Path(__file__).resolve().parent.parent / "static"
_JS = "text/javascript; charset=utf-8"


@dataclass(frozen=True)
class Asset:
    body: bytes
    etag: str


class Assets:
    """A read-only table of the files under ``root``, keyed by their path relative to it."""

    def __init__(self, root: Path = STATIC) -> None:
        self.files: dict[str, Asset] = {}
        for path in sorted(root.rglob("*.js")):
            body = path.read_bytes()
            etag = '"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'
            self.files[path.relative_to(root).as_posix()] = Asset(body, etag)

    def routes(self) -> list[Route]:
        """``{mount}/client.js`` and the modules it imports, ``{mount}/client/<path>``."""
        return [
            Route("/client.js", self._client_js, methods=["GET", "HEAD"]),
            Route("/client/{name:path}", self._client_module, methods=["GET", "HEAD"]),
        ]

    async def _client_js(self, request: Request) -> Response:
        return self.response(request, "client.js")

    async def _client_module(self, request: Request) -> Response:
        return self.response(request, "client/" + request.path_params["name"])

    def response(self, request: Request, name: str) -> Response:
        asset = self.files.get(name)
        if asset is None:
            return PlainTextResponse(f"no such file: {name[:80]}", 404, DATA_HEADERS)
        headers = {
            "ETag": asset.etag,
            "Cache-Control": "no-cache",
            "X-Content-Type-Options": NOSNIFF,
            "Content-Security-Policy": SCRIPT_CSP,
        }
        if _matches(request.headers.get("if-none-match"), asset.etag):
            return Response(status_code=304, headers=headers)
        body = b"" if request.method == "HEAD" else asset.body
        headers["Content-Length"] = str(len(asset.body))
        return Response(body, media_type=_JS, headers=headers)


def _matches(header: str | None, etag: str) -> bool:
    """RFC 9110 If-None-Match: ``*`` or a list holding ``etag`` (weak comparison)."""
    if not header:
        return False
    if header.strip() == "*":
        return True
    return any(tag.strip().removeprefix("W/") == etag for tag in header.split(","))
