"""The HTTP API's guard: who may use it, how much they may send, and how it says no.

Every route under ``{mount}/api`` (publish.py, topics.py, batches.py) and the operations page
(ops/page.py) meet the same checks and answer in the same shape. The API is ``enabled`` only
when the application configured who may use it: a bearer token (``Rubris(api_token=...)``), an
authorisation hook (``Rubris(authorize_api=f)``) or both. A request meets, in this order:

- :meth:`Guard.admit`, before anything of its body is read, so that a stranger costs no more
  than its headers: 503 while shutting down; :meth:`Guard.check_origin`, 403 for a browser page
  of another site (CSRF: a cookie the hook trusts is sent by the browser whatever page asks);
  :meth:`Guard.check_token`, 401 without the token (the ops page also takes it as the password
  of HTTP Basic, what a browser can send); and for a request whose body names what it touches
  (publish, enqueue, the batches' open, ack and fail) :meth:`Guard.check_caller`: the hook
  asked with :data:`API`, 403 unless it lets this caller send the API a body at all;
- :meth:`Guard.read_body`: 413 for a body over ``Limits.api_body``, 408 for one not arrived
  whole within ``Timing.body_timeout`` (server/hardening.py);
- :meth:`Guard.check_authorised`: the hook, asked once per name (``f(request, name) -> bool``,
  may be async): 403 when it says no or raises ``Reject``;
- a check that fails raises :class:`Refusal`; :meth:`Guard.refusal` turns it into the JSON
  answer ``{"error", "index", "fill"}``, counted by status, that every answer of the API
  carries with ``Rubris-Fill`` (:data:`FILL_HEADER`), the fill publishers pace themselves by,
  and ``X-Content-Type-Options: nosniff`` with a Content-Security-Policy that lets nothing run
  (:func:`answer_headers`). A 408 closes the connection (RFC 9110: the server stopped waiting).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ...config import Config
from ...engine.engine import Engine
from ...engine.queues import QueueTopic
from ...errors import Reject
from ..hardening import DATA_HEADERS, BodyTimeout, BodyTooLarge, receive_body

AuthorizeApi = Callable[[Request, str], "bool | Awaitable[bool]"]
"""The ``authorize_api`` hook: may ``request`` use the topic (or batch ``batch.{id}``, or page
``$ops``) ``name``? Asked first with :data:`API` when the names are in the request's body."""

OriginAllowed = Callable[[str, "str | None"], bool]
"""Whether a browser page of ``origin`` may use the API of the host ``host`` (the gateway's
``origin_allowed``, which the WebSocket and long-poll transports use too)."""

API = "$api"
"""The name the ``authorize_api`` hook is asked about before a body that names topics or
batches is read: may this request send the API a body at all? Like the ops page's ``$ops``, a
name no channel can offer, so a hook that allows topics by pattern does not let a stranger's
body in by accident."""

FILL_HEADER = "Rubris-Fill"
_JSON = "application/json"


def answer_headers(status: int, fill: int) -> dict[str, str]:
    """The headers of every API answer: its fill, nosniff and a policy that lets nothing in it
    run; ``WWW-Authenticate`` on a 401; ``Connection: close`` on a 408.

    Only the 408 closes: the client is too slow for its body to be waited for. Other refusals
    before the body is read (401, 403, 413) leave the connection as it is, so that a client
    still sending its body reads the answer instead of a reset; the server discards the rest
    (``serve()`` bounds how long that may take: serving.py, ``HeadDeadline``)."""
    headers = {FILL_HEADER: str(fill), **DATA_HEADERS}
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    elif status == 408:
        headers["Connection"] = "close"
    return headers


def same_origin(origin: str, host: str | None) -> bool:
    """The rule without an allow-list: a page of the host's own origin."""
    return host is not None and urlsplit(origin).netloc == host


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
    accepting: bool
    _token: bytes | None
    _authorize: AuthorizeApi | None
    _origin_allowed: OriginAllowed

    @property
    def enabled(self) -> bool:
        return self._token is not None or self._authorize is not None

    async def admit(self, request: Request, *, body: bool) -> None:
        """The checks a request meets before anything of it is read (the module's docstring):
        shutting down, origin, token, and with ``body`` (the names it touches are in it) the
        hook's :data:`API` question."""
        if not self.accepting:
            raise Refusal(503, "server shutting down")
        self.check_origin(request)
        self.check_token(request)
        if body:
            await self.check_caller(request)

    def check_origin(self, request: Request) -> None:
        """403 for a browser page of a foreign origin: neither the host's own nor allowed by
        ``Rubris(allowed_origins=...)``. No ``Origin``: not a browser's cross-site request, and
        no CSRF. ``Origin: null`` (a sandboxed frame, a file, a redirect across sites) names no
        site to allow, so it is refused even under ``"*"``."""
        origin = request.headers.get("origin")
        if origin is None:
            return
        if origin == "null" or not self._origin_allowed(origin, request.headers.get("host")):
            raise Refusal(403, "origin not allowed")

    async def check_caller(self, request: Request) -> None:
        """Ask the hook with :data:`API` whether this request may send the API a body at all:
        403 before any byte of it is read. Without a hook the token, checked before, decides."""
        if self._authorize is not None and not await self._ask(request, API):
            raise Refusal(403, "not allowed to use the API")

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
        """The body: 413 over ``Limits.api_body``, 408 when it has not all come within
        ``Timing.body_timeout``. Call it after :meth:`admit`."""
        try:
            return await receive_body(
                request, self.config.limits.api_body, self.config.timing.body_timeout
            )
        except BodyTooLarge as exc:
            raise Refusal(413, str(exc)) from None
        except BodyTimeout as exc:
            raise Refusal(exc.status, str(exc)) from None

    async def check_authorised(
        self, request: Request, names: Sequence[tuple[int | None, str]], verb: str = "publish to"
    ) -> None:
        """Ask the hook once per topic ``name`` (403 naming the entry ``index`` at fault;
        ``verb`` says what was refused)."""
        if self._authorize is None:
            return
        asked: set[str] = set()
        for index, name in names:
            if name in asked:
                continue
            asked.add(name)
            try:
                allowed = await self._ask(request, name)
            except Refusal as r:
                raise Refusal(r.status, r.error, index) from None
            if not allowed:
                raise Refusal(403, f"not allowed to {verb} {name!r}", index)

    async def _ask(self, request: Request, name: str) -> bool:
        """The hook's answer for ``name``; a ``Reject`` is a 403 with its reason."""
        assert self._authorize is not None
        try:
            allowed = self._authorize(request, name)
            if inspect.isawaitable(allowed):
                allowed = await allowed
        except Reject as r:
            raise Refusal(403, r.reason) from None
        return bool(allowed)

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
        all_headers = {**answer_headers(status, fill), **(headers or {})}
        return Response(orjson.dumps(body), status, all_headers, media_type=_JSON)

    def refusal(self, r: Refusal, queues: list[QueueTopic] | None = None) -> Response:
        body: dict[str, Any] = {"error": r.error, "index": r.index}
        return self._answer(body, r.status, None, queues)


def json_body(body: bytes) -> Any:
    """A request body's JSON value; 400 when it is not JSON."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise Refusal(400, f"the body is not JSON: {exc}") from None
