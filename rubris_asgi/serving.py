"""Running under uvicorn with a graceful shutdown that reaches every client.

uvicorn's shutdown closes open WebSockets (code 1012) before it runs the app's lifespan
shutdown, so a GOODBYE sent from the lifespan would never arrive. ``Server`` drains the rubris
instances first: every session gets GOODBYE 9 and its in-flight frames, then uvicorn carries on,
and a connection whose peer stopped reading (which uvicorn would wait for forever) is cut after
``Timing.shutdown_drain``.

A start-up failure of rubris's own (``StartupError``: Redis out of reach or not durable,
several workers without a broker, ...) is told in one ERROR line that says what to do, instead
of uvicorn's traceback (:class:`StartupLifespan`; the traceback is logged at DEBUG), and the
process exits with code 3, uvicorn's for a failed start; with ``workers=N`` the supervisor
tells each distinct line once.

``serve()`` also bounds what a connection may hold before rubris sees a request: an idle
kept-alive connection is closed after ``Timing.idle_timeout`` (uvicorn's ``timeout_keep_alive``)
and a request's head (request line and headers) must arrive within ``Timing.header_timeout``
(:class:`HeadDeadline`, which uvicorn lacks), so a client that connects and sends nothing, or a
header byte now and then, does not keep a socket for ever (docs/operations.md, "Security
model"). Bodies are bounded by rubris itself (server/hardening.py).

>>> from rubris_asgi import serve
>>> serve(app, rubris, port=8000)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.lifespan.on import LifespanOn
from uvicorn.protocols.http.h11_impl import H11Protocol

from .app import Rubris
from .cluster import WORKERS_ENV
from .config import Timing
from .errors import StartupError

if TYPE_CHECKING:
    from multiprocessing.queues import SimpleQueue

    from uvicorn.lifespan.on import LifespanSendMessage

log = logging.getLogger("rubris_asgi")
uvicorn_log = logging.getLogger("uvicorn.error")
"""Where uvicorn logs its start-up failures: rubris's one line goes there too, alike."""


RESPAWN_PAUSE = 1.0
"""Seconds between a worker's death and its replacement (a crash loop costs little)."""
STARTUP_GRACE = 10.0
"""A worker that dies this soon after it was started failed to start: all of them stop, as
uvicorn alone does when its startup fails (a wrong setting would fail every replacement)."""


_STARTUP_FAILED = "Application startup failed. Exiting."
"""What uvicorn's lifespan logs after any failed start: a second line, with nothing to add to
rubris's own."""


class _Without(logging.Filter):
    """Drops the records whose message is ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != self.text


class StartupLifespan(LifespanOn):
    """uvicorn's lifespan (``lifespan="on"`` or ``"auto"``) where a start-up failure of rubris's
    own (``StartupError``) is told in one line, ``rubris: {error}``, through ``tell`` (uvicorn's
    error log by default), instead of the traceback the app's framework sends and the line
    uvicorn adds; ``failure`` keeps it. Any other failure is a bug: its traceback stays."""

    def __init__(self, config: uvicorn.Config, tell: Callable[[str], None] | None = None) -> None:
        super().__init__(config)
        self.tell = tell or uvicorn_log.error
        self.failure: StartupError | None = None
        self._quiet = _Without(_STARTUP_FAILED)

    async def startup(self) -> None:
        try:
            await super().startup()
        finally:
            self.logger.removeFilter(self._quiet)

    async def send(self, message: LifespanSendMessage) -> None:
        if message["type"] == "lifespan.startup.failed":
            # Starlette (and RubrisMiddleware) send this while handling the exception, of
            # which the message has only the text
            error = sys.exc_info()[1]
            if isinstance(error, StartupError):
                self.failure = error
                if message.get("message"):  # empty: told already, by RubrisMiddleware
                    self.tell(f"rubris: {error}")
                self.logger.addFilter(self._quiet)
                message = {"type": "lifespan.startup.failed", "message": ""}
        await super().send(message)


class Server(uvicorn.Server):
    """``uvicorn.Server`` that drains ``rubris`` before closing connections (every ``Rubris``
    started in this process when none is given: what a worker of ``serve(workers=N)`` does),
    and tells a start-up failure of rubris's own in one line (:class:`StartupLifespan`, through
    ``tell``: uvicorn's error log by default)."""

    def __init__(
        self,
        config: uvicorn.Config,
        rubris: Rubris | Iterable[Rubris] | None = None,
        *,
        tell: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(config)
        if rubris is None:
            rubris = ()
        self.rubris = [rubris] if isinstance(rubris, Rubris) else list(rubris)
        self.tell = tell

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn made its own from the config (lifespan "off" has nothing to tell)
        if type(self.lifespan) is LifespanOn:
            self.lifespan = StartupLifespan(self.config, self.tell)
        await super().startup(sockets)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        targets = self.rubris or list(Rubris.running)
        for r in targets:
            await r.drain()
        # uvicorn now closes every connection and waits until each is gone, but a closing
        # transport first flushes what it holds, which a peer that stopped reading never lets
        # happen: uvicorn would wait for it forever. Every session has had its GOODBYE, or
        # shutdown_drain to take it; a connection still stuck after as long again is cut.
        grace = max((r.config.timing.shutdown_drain for r in targets), default=5.0)
        timer = asyncio.get_running_loop().call_later(grace, self._cut_stuck)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()

    def _cut_stuck(self) -> None:
        for conn in list(self.server_state.connections):
            transport: Any = getattr(conn, "transport", None)
            if transport is not None and transport.is_closing():
                if transport.get_write_buffer_size():
                    transport.abort()


def serve(
    app: Any,
    rubris: Rubris | Iterable[Rubris] | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    **uvicorn_options: Any,
) -> None:
    """Run ``app`` on uvicorn until interrupted, draining ``rubris`` on the way out.

    ``workers``: processes sharing the port. More than one needs ``app`` as an import string
    (``"myapp:app"``: each worker imports it and builds its own ``Rubris``, which it drains)
    and a broker that shares their topics (``RUBRIS_REDIS_URL``, or ``Rubris(broker=...)``);
    a worker that dies is replaced. ``uvicorn_options`` go to ``uvicorn.Config`` over the
    defaults of :func:`uvicorn_config` (the connection timeouts, no per-message deflate).
    """
    if workers > 1:
        if not isinstance(app, str):
            raise ValueError('serve(workers=N): pass the app as an import string ("module:app")')
        if rubris is not None:
            raise ValueError("serve(workers=N): each worker drains its own Rubris; pass none")
        _serve_workers(uvicorn_config(app, host=host, port=port, **uvicorn_options), workers)
        return
    if rubris is None and not isinstance(app, str):
        raise ValueError("serve(app, rubris): the Rubris to drain on the way out is missing")
    given = _given(rubris)  # read once: an iterator would be empty the second time
    config = uvicorn_config(app, given, host=host, port=port, **uvicorn_options)
    server = Server(config, given)
    # uvicorn re-raises the Ctrl-C it handled gracefully; the shutdown is over by then
    with contextlib.suppress(KeyboardInterrupt):
        server.run()  # recent uvicorn exits with code 3 itself where its startup failed
    if not server.started:
        raise SystemExit(STARTUP_FAILURE)


def uvicorn_config(
    app: Any,
    rubris: Rubris | Iterable[Rubris] | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    **uvicorn_options: Any,
) -> uvicorn.Config:
    """The ``uvicorn.Config`` that ``serve()`` runs ``app`` with; the caller's options win.

    - ``timeout_keep_alive``: ``Timing.idle_timeout``, how long a kept-alive connection may
      wait for its next request;
    - ``http``: uvicorn's own HTTP/1.1 protocol (``"auto"``, ``"h11"`` or ``"httptools"``, as
      asked) with :class:`HeadDeadline`: a request's head must arrive within
      ``Timing.header_timeout``. A protocol class, or another name (``"zttp"``, HTTP/2), is
      used as given, without it;
    - ``ws_per_message_deflate``: off, as rubris deflates each message itself and compressing
      twice costs CPU for nothing.

    The timings are those of ``rubris`` (the strictest, for several); without one (an import
    string, ``workers=N``) those of the ``Rubris`` running in the process when a connection
    comes, which a worker has started by then.
    """
    deadlines = Deadlines(_given(rubris), idle_chosen="timeout_keep_alive" in uvicorn_options)
    options: dict[str, Any] = {
        "ws_per_message_deflate": False,
        "timeout_keep_alive": deadlines.timeouts()[1],  # None only when the caller chose
        **uvicorn_options,
    }
    http = options.get("http", "auto")
    if isinstance(http, str) and http in DEADLINE_PROTOCOLS:
        options["http"] = DEADLINE_PROTOCOLS[http]
    config = uvicorn.Config(app, host=host, port=port, **options)
    setattr(config, _DEADLINES, deadlines)  # what each connection's protocol reads
    return config


def _given(rubris: Rubris | Iterable[Rubris] | None) -> tuple[Rubris, ...]:
    if rubris is None:
        return ()
    return (rubris,) if isinstance(rubris, Rubris) else tuple(rubris)


# The deadline on a request's head, which uvicorn lacks

_DEADLINES = "rubris_deadlines"
"""The attribute of a ``uvicorn.Config`` that holds its ``Deadlines`` (a worker's copy of the
config carries it across the process boundary)."""
_DEFAULT_TIMING = Timing()


@dataclass(frozen=True)
class Deadlines:
    """Where a connection's timeouts come from: the ``Timing`` of the ``rubris`` served, else
    of those running in the process (a worker's, read at each connection: it is started by the
    time connections are taken), else the defaults."""

    rubris: tuple[Rubris, ...] = ()
    idle_chosen: bool = False
    """The caller set uvicorn's ``timeout_keep_alive``: leave it."""

    def timeouts(self) -> tuple[float, float | None]:
        """(header timeout, idle timeout or None to keep uvicorn's): the strictest of the
        timings, as one server's connections serve every app in it."""
        timings = [r.config.timing for r in self.rubris or Rubris.running] or [_DEFAULT_TIMING]
        idle = None if self.idle_chosen else min(t.idle_timeout for t in timings)
        return min(t.header_timeout for t in timings), idle


_OUTSIDE_SERVE = Deadlines(idle_chosen=True)


class HeadDeadline(asyncio.Protocol):
    """Mixed into uvicorn's HTTP/1.1 protocols: a request's head (its request line and headers)
    must arrive whole within ``Timing.header_timeout`` of the connection's start or, for a later
    request on a kept-alive connection, of its first byte; else the connection is closed.

    uvicorn bounds the wait between requests (``timeout_keep_alive``), not the head itself: a
    client that connects and sends nothing, or a header byte every few seconds (slowloris),
    would hold its socket and protocol for ever, and a few thousand hold the server. A head is
    complete when uvicorn shows it the way both its protocols do: a new request cycle
    (``cycle``), or the transport handed to the WebSocket protocol. From there the body
    (``Timing.body_timeout``, for the bodies rubris reads), the response and a WebSocket (its
    pings) have their own bounds. A connection kept by bytes that follow a complete answer (the
    rest of a body it refused) counts as a head that is not complete: it is closed too.
    """

    # uvicorn's, declared for the type checker
    transport: asyncio.Transport
    cycle: Any
    config: uvicorn.Config
    loop: asyncio.AbstractEventLoop

    _head_seconds = _DEFAULT_TIMING.header_timeout
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # a config serve() did not build (``uvicorn --http rubris_asgi.serving:...``): the
        # caller's own timeout_keep_alive stays; the head's comes from the running Rubris
        deadlines = getattr(self.config, _DEADLINES, None) or _OUTSIDE_SERVE
        self._head_seconds, idle = deadlines.timeouts()
        if idle is not None:
            # uvicorn copied the config's, typed int: a float works as well (a call_later)
            setattr(self, "timeout_keep_alive", idle)  # noqa: B010
        self._arm()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        super().data_received(data)
        transport = self.transport
        if (
            self.cycle is not cycle
            or transport.is_closing()
            or transport.get_protocol() is not self
        ):
            self._disarm()  # a head complete, or the connection done with HTTP/1.1
        elif cycle is None or cycle.response_complete:
            self._arm()  # bytes of a head not complete yet (armed already: the same deadline)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self._head_seconds, self._head_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        transport = self.transport
        if transport.get_protocol() is self and not transport.is_closing():
            transport.close()


class H11HeadDeadline(HeadDeadline, H11Protocol):
    """uvicorn's h11 protocol with :class:`HeadDeadline`."""


DEADLINE_PROTOCOLS: dict[str, type[asyncio.Protocol]] = {
    "h11": H11HeadDeadline,
    "auto": H11HeadDeadline,
}
"""uvicorn's protocol names, each with :class:`HeadDeadline`: ``"auto"`` is httptools when it
is installed, as in uvicorn."""

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # uvicorn without its [standard] extra: h11 only
    pass
else:

    class HttpToolsHeadDeadline(HeadDeadline, HttpToolsProtocol):
        """uvicorn's httptools protocol with :class:`HeadDeadline`."""

    DEADLINE_PROTOCOLS["httptools"] = DEADLINE_PROTOCOLS["auto"] = HttpToolsHeadDeadline


def _serve_workers(config: uvicorn.Config, workers: int) -> None:
    """Our own supervisor, as uvicorn's runs its plain ``Server`` in the workers (no drain).

    A worker whose start failed for a reason of rubris's own sends its one line here instead of
    logging it: every worker fails alike (one setting), and the line is told once."""
    os.environ[WORKERS_ENV] = str(workers)  # the workers inherit it
    sock = config.bind_socket()
    ctx = multiprocessing.get_context("spawn")
    stopping = threading.Event()
    failures: SimpleQueue[tuple[int, str]] = ctx.SimpleQueue()
    told: set[str] = set()
    reported: set[int] = set()

    def start() -> multiprocessing.process.BaseProcess:
        p = ctx.Process(target=_worker, args=(config, sock, failures), name="rubris-worker")
        p.start()
        return p

    def tell() -> None:
        """Log each line the workers sent that was not told yet."""
        while not failures.empty():
            pid, line = failures.get()
            reported.add(pid)
            if line not in told:
                told.add(line)
                uvicorn_log.error(line)

    def stop(signum: int, frame: object) -> None:
        stopping.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    procs = [start() for _ in range(workers)]
    log.info("%d workers started (pids %s)", workers, ", ".join(str(p.pid) for p in procs))
    born = [time.monotonic()] * workers
    failed = False
    try:
        while not stopping.wait(0.5):
            for i, p in enumerate(procs):
                if p.is_alive() or stopping.is_set():
                    continue
                tell()  # what it sent before it died (a pipe: in it by now)
                # it could not even start: its one line said why, or its traceback did
                if p.pid in reported or time.monotonic() - born[i] < STARTUP_GRACE:
                    if p.pid not in reported:
                        log.error(
                            "rubris: worker %s could not start (exit code %s, see above): "
                            "stopping the workers; exit code 3",
                            p.pid,
                            p.exitcode,
                        )
                    failed = True
                    stopping.set()
                    break
                log.error("worker %s exited with code %s: starting another", p.pid, p.exitcode)
                stopping.wait(RESPAWN_PAUSE)
                procs[i] = start()
                born[i] = time.monotonic()
    finally:
        for p in procs:
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGTERM)  # each drains, then exits
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
        sock.close()
        tell()  # the others' lines, where one failed otherwise
    if failed:
        raise SystemExit(STARTUP_FAILURE)


def _worker(
    config: uvicorn.Config, sock: socket.socket, failures: SimpleQueue[tuple[int, str]]
) -> None:
    config.configure_logging()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor says when (SIGTERM)
    server = Server(config, tell=lambda line: failures.put((os.getpid(), line)))
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock])
    if not server.started:
        raise SystemExit(STARTUP_FAILURE)
