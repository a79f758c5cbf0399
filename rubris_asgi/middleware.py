"""``RubrisMiddleware``: rubris in front of any ASGI app, its lifespan driven for you.

Django, Litestar, Quart or a plain ASGI callable cannot ``Mount`` rubris the Starlette way, and an
app with its own lifespan would have to compose rubris's by hand. The middleware wraps the app:
requests under ``path`` go to rubris (WebSocket, long-poll, client.js, and the HTTP API, metrics
and ops page where enabled), every other HTTP, WebSocket and lifespan event goes to the app
untouched.

Lifespan: rubris starts on ``lifespan.startup`` *before* the app's own startup (so the app's
startup code may publish) and stops *after* the app's shutdown (``Rubris.stop``). An app that
does not speak the lifespan protocol (Django's ``ASGIHandler`` raises for it) is left out of it;
a server that sends no lifespan at all (daphne, or uvicorn with ``--lifespan off``) gets rubris
started by the first request, once (a rubris stopped by the app is not started again).

A start-up failure of rubris's own (``StartupError``: Redis out of reach, a batch store that
cannot be opened, ...) is logged as one ERROR line that says what to do, not a traceback, and
the server is told the startup failed (with no message of its own to log again).

Servers close their connections before they send ``lifespan.shutdown``, so the GOODBYE 9 of that
stop reaches no client: ``rubris_asgi.serve`` / ``Server`` drain rubris first (uvicorn).

>>> from rubris_asgi import Rubris, RubrisMiddleware
>>> rubris = Rubris()
>>> async def app(scope, receive, send): ...
>>> app = RubrisMiddleware(app, rubris=rubris, path="/rubris")
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .app import Rubris
from .errors import StartupError

log = logging.getLogger("rubris_asgi")


class RubrisMiddleware:
    """Serve ``rubris`` under ``path`` in front of ``app``; drive rubris's lifespan.

    Also usable as ``app.add_middleware(RubrisMiddleware, rubris=rubris)`` in Starlette or
    FastAPI (lifespan events pass through their middleware, so this one sees them).

    Args:
        app: the wrapped ASGI app; it gets every event outside ``path``.
        rubris: the engine to serve.
        path: where rubris's endpoints live (``{path}/ws``, ``{path}/lp``, ...): starts with
            ``/``, does not end with one, and is not ``/`` alone (rubris would hide the app).
        metrics: a path to serve Prometheus metrics at (``Metrics(rubris)``, the ``[metrics]``
            extra), e.g. ``"/metrics"``, for frameworks that cannot mount an ASGI endpoint
            themselves; None (the default) serves none.
    """

    def __init__(
        self,
        app: Callable[..., Awaitable[None]],
        *,
        rubris: Rubris,
        path: str = "/rubris",
        metrics: str | None = None,
    ) -> None:
        for name, value in (("path", path), ("metrics", metrics)):
            if value is not None and (
                not value.startswith("/") or value.endswith("/") or "//" in value
            ):
                raise ValueError(
                    f"{name} must look like '/rubris' (no trailing '/'), got {value!r}"
                )
        self.app = app
        self.rubris = rubris
        self.path = path
        self._prefix = path + "/"
        self.metrics_path = metrics
        self._metrics: ASGIApp | None = None
        if metrics is not None:
            from .ops.metrics import Metrics  # the [metrics] extra, only when asked for

            self._metrics = Metrics(rubris)
        self._lifespan = False
        """Whether the server ran the lifespan protocol: if not, the first request starts."""
        self._started_lazily = False
        self._starting: asyncio.Lock | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan_protocol(scope, receive, send)
            return
        if not self._lifespan and not self._started_lazily and kind in ("http", "websocket"):
            await self._start_on_first_request()
        if kind in ("http", "websocket"):
            root = scope.get("root_path", "")
            path: str = scope["path"]
            # the path the app routes on, as Starlette's Mount computes it: root_path is a
            # prefix of path when a proxy or an outer mount set it
            route = path[len(root) :] if root and path.startswith(root) else path
            if route == self.metrics_path and self._metrics is not None:
                await self._metrics(scope, receive, send)
                return
            if route.startswith(self._prefix):
                child = dict(scope)
                child["app_root_path"] = scope.get("app_root_path", root)
                child["root_path"] = root + self.path
                if not (root and path.startswith(root)):
                    # a server that gives path without root_path in it: put it in, so the
                    # rubris router strips exactly ``root + self.path``
                    child["path"] = root + path
                await self.rubris(child, receive, send)
                return
        await self.app(scope, receive, send)

    async def _start_on_first_request(self) -> None:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if not self._started_lazily:
                if not self.rubris.started:
                    log.info("rubris: no ASGI lifespan from the server: the first request starts")
                    await self.rubris.start()
                self._started_lazily = True

    async def _lifespan_protocol(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Speak lifespan to the server and to the app: rubris first up and last down."""
        self._lifespan = True
        to_app: asyncio.Queue[Message] = asyncio.Queue()
        from_app: asyncio.Queue[Message] = asyncio.Queue()
        took_startup = False

        async def app_receive() -> Message:
            nonlocal took_startup
            took_startup = True
            return await to_app.get()

        async def app_send(message: Message) -> None:
            await from_app.put(message)

        message = await receive()
        if message["type"] != "lifespan.startup":
            return  # not the protocol; nothing started, nothing to stop
        try:
            await self.rubris.start()
        except StartupError as exc:
            # what failed and what to do, in one line (its traceback at DEBUG: Rubris.start);
            # told here, whatever the server logs, so the message it would log again is empty
            log.error("rubris: %s", exc)
            await send({"type": "lifespan.startup.failed", "message": ""})
            return
        except Exception as exc:
            log.exception("rubris failed to start")
            await send({"type": "lifespan.startup.failed", "message": f"rubris: {exc}"})
            return

        async def run_app() -> None:
            await self.app(scope, app_receive, app_send)

        app_task: asyncio.Task[None] | None = asyncio.get_running_loop().create_task(
            run_app(), name="rubris-wrapped-lifespan"
        )
        assert app_task is not None
        await to_app.put(message)
        reply = await _reply(from_app, app_task)
        if reply is None:
            if took_startup:  # it took the startup event, then failed without saying so
                await self.rubris.stop()
                await send({"type": "lifespan.startup.failed", "message": _failure(app_task)})
                return
            # raised (or returned) before reading anything: an app without lifespan support,
            # as Django's; rubris carries on alone, as uvicorn's "auto" mode does for the app
            why = _failure(app_task)
            log.info("rubris: the wrapped app does not speak ASGI lifespan (%s)", why)
            app_task = None
        elif reply["type"] == "lifespan.startup.failed":
            await self.rubris.stop()
            await send(reply)
            await _finish(app_task)
            return
        await send({"type": "lifespan.startup.complete"})

        message = await receive()  # lifespan.shutdown
        failed: Message | None = None
        if app_task is not None:
            await to_app.put(message)
            reply = await _reply(from_app, app_task)
            if reply is None:
                failed = {"type": "lifespan.shutdown.failed", "message": _failure(app_task)}
            elif reply["type"] == "lifespan.shutdown.failed":
                failed = reply
            await _finish(app_task)
        await self.rubris.stop()
        await send(failed or {"type": "lifespan.shutdown.complete"})


async def _reply(replies: asyncio.Queue[Message], task: asyncio.Task[Any]) -> Message | None:
    """The app's next lifespan message, or None when its lifespan call ended without one."""
    if not replies.empty():
        return replies.get_nowait()
    getter = asyncio.ensure_future(replies.get())
    try:
        await asyncio.wait((getter, task), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not getter.done():
            getter.cancel()
    if getter.done() and not getter.cancelled():
        return getter.result()
    if not replies.empty():
        return replies.get_nowait()
    return None


def _failure(task: asyncio.Task[Any]) -> str:
    if not task.done() or task.cancelled():
        return "the app's lifespan ended"
    exc = task.exception()
    if exc is None:
        return "the app's lifespan returned without answering"
    return f"{type(exc).__name__}: {exc}"


async def _finish(task: asyncio.Task[Any] | None) -> None:
    """Let the app's lifespan call end (it should, after its last reply); don't hang on it."""
    if task is None:
        return
    try:
        await asyncio.wait_for(asyncio.shield(task), 5.0)
    except asyncio.TimeoutError:
        task.cancel()
    except Exception:  # its failure was reported through the protocol or logged by us
        pass
    if task.done() and not task.cancelled():
        task.exception()  # retrieved: no "exception was never retrieved" at exit
