"""The HTTP API's guard: who may use it, how much they may send, and how it says no.

Every route under ``{mount}/api`` (publish.py, topics.py, batches.py) and the operations page
(ops/page.py) meet the same checks and answer in the same shape:

- the API is ``enabled`` only when the application configured who may use it: a bearer token
  (``Rubris(api_token=...)``), an authorisation hook (``Rubris(authorize_api=f)``) or both;
- :meth:`Guard.check_token`: 401 without the token (the ops page also takes it as the password
  of HTTP Basic, what a browser can send);
- :meth:`Guard.read_body`: 413 for a body over ``Limits.api_body``, counted as it streams in;
- :meth:`Guard.check_authorised`: the hook, asked once per name (``f(request, name) -> bool``,
  may be async): 403 when it says no or raises ``Reject``;
- a check that fails raises :class:`Refusal`; :meth:`Guard.refusal` turns it into the JSON
  answer ``{"error", "index", "fill"}``, counted by status, that every answer of the API
  carries with ``Rubris-Fill`` (:data:`FILL_HEADER`), the fill publishers pace themselves by.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ...config import Config
from ...engine.engine import Engine
from ...engine.queues import QueueTopic
from ...errors import Reject

AuthorizeApi = Callable[[Request, str], "bool | Awaitable[bool]"]
"""The ``authorize_api`` hook: may ``request`` use the topic (or batch, or page) ``name``?"""

FILL_HEADER = "Rubris-Fill"
_JSON = "application/json"


class Refusal(Exception):
    """One answer other than 200: its status, reason and the index of the entry at fault."""

    def __init__(self, status: int, error: str, index: int | None = None) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.index = index


class Guard:
    """The checks and answers of the API; :class:`~.publish.HttpApi` is one.

    The routes beside it (topics.py, batches.py, ops/page.py) use them through the ``HttpApi``
    they are given. The attributes below are ``HttpApi``'s, declared here for the type checker.
    """

    engine: Engine
    config: Config
    _token: bytes | None
    _authorize: AuthorizeApi | None

    @property
    def enabled(self) -> bool:
        return self._token is not None or self._authorize is not None

    def check_token(self, request: Request, *, basic: bool = False) -> None:
        """401 unless the request carries the token as ``Bearer``, or with ``basic`` also as
        the password of HTTP Basic (any user name): what a browser can send to a page."""
        if self._token is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        scheme = scheme.lower()
        if basic and scheme == "basic":
            try:
                given = base64.b64decode(given, validate=True).decode().partition(":")[2]
            except (binascii.Error, UnicodeDecodeError):
                given = ""
            scheme = "bearer"
        if scheme != "bearer" or not hmac.compare_digest(given.encode(), self._token):
            raise Refusal(401, "a valid bearer token is required")

    async def read_body(self, request: Request) -> bytes:
        limit = self.config.limits.api_body
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise Refusal(413, f"the body is over the limit of {limit} bytes")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise Refusal(413, f"the body is over the limit of {limit} bytes")
        return bytes(body)

    async def check_authorised(
        self, request: Request, names: Sequence[tuple[int | None, str]], verb: str = "publish to"
    ) -> None:
        """Ask the hook once per topic ``name`` (403 naming the entry ``index`` at fault;
        ``verb`` says what was refused)."""
        authorize = self._authorize
        if authorize is None:
            return
        asked: set[str] = set()
        for index, name in names:
            if name in asked:
                continue
            asked.add(name)
            try:
                allowed = authorize(request, name)
                if inspect.isawaitable(allowed):
                    allowed = await allowed
            except Reject as r:
                raise Refusal(403, r.reason, index) from None
            if not allowed:
                raise Refusal(403, f"not allowed to {verb} {name!r}", index)

    def _answer(
        self,
        body: dict[str, Any],
        status: int = 200,
        headers: dict[str, str] | None = None,
        queues: list[QueueTopic] | None = None,
    ) -> Response:
        if status >= 400:
            self.engine.telemetry.api_refusals[status] += 1
        fill = self.engine.intake.fill
        for q in queues or ():
            fill = max(fill, min(100, len(q.ready) * 100 // q.settings.max_length))
        body["fill"] = fill
        all_headers = {FILL_HEADER: str(fill), **(headers or {})}
        return Response(orjson.dumps(body), status, all_headers, media_type=_JSON)

    def refusal(self, r: Refusal, queues: list[QueueTopic] | None = None) -> Response:
        body: dict[str, Any] = {"error": r.error, "index": r.index}
        headers = {"WWW-Authenticate": "Bearer"} if r.status == 401 else None
        return self._answer(body, r.status, headers, queues)


def json_body(body: bytes) -> Any:
    """A request body's JSON value; 400 when it is not JSON."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise Refusal(400, f"the body is not JSON: {exc}") from None
