"""``Rubris``: the ASGI app users mount, its registration, routes and lifespan.

What the application calls on it to publish and send is the ``_Publishing`` mixin of
:mod:`.publishing`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, Router, WebSocketRoute
from starlette.types import Receive, Scope, Send

from ..batches import BatchStore
from ..batches.service import Batches
from ..batches.watch import AuthorizeBatch, BatchTopics
from ..cluster import WORKERS_ENV, Broker, cluster_from
from ..cluster.ends import SessionEnds
from ..cluster.sends import RemoteSends
from ..config import Config
from ..engine.channels import _UNSET, PublishRule, Registry
from ..engine.engine import Engine
from ..engine.queues import QueueSettings
from ..engine.session import Session
from ..errors import StartupError
from ..ops.observer import Observer
from ..ops.page import OpsPage
from ..ops.workers import WorkerBoard
from ..ops.workers import stats_dir as _stats_dir
from ..protocol import Codec, Mode
from ..protocol.deflate import Compressor, Decompressor
from ..server.assets import Assets
from ..server.dispatch import Dispatcher
from ..server.drain import Drain
from ..server.exit_signal import drain_on_exit_signal
from ..server.gateway import Authenticate, Gateway
from ..server.http.batches import BatchApi
from ..server.http.publish import AuthorizeApi, HttpApi
from ..server.http.topics import TopicApi
from ..server.lifespan import lifespan_protocol
from ..server.longpoll import LongPollTransport
from ..server.quiet_log import QuietPolls
from ..server.refusals import RESTARTING, RETRY_AFTER, TRY_AGAIN_LATER, not_now
from ..server.relay import Relays
from ..server.runtime import housekeeping, queue_ticks, reauthentication, run_scheduler
from ..server.websocket import WebSocketTransport
from .publishing import _Publishing
from .tables import _Tables

log = logging.getLogger("rubris_asgi")

F = TypeVar("F", bound=Callable[..., Any])


class Rubris(_Publishing, _Tables):
    """A push-messaging engine as an ASGI app: mount it, register channels, publish.

    Args:
        config: every limit and timing (``Config``); the keyword arguments below override it.
        compress_at: default payload size from which channels try deflate (None: never).
        authenticate: ``f(conn) -> user`` (may be async) run for every connection and poll;
            raise ``Reject`` to refuse (WebSocket close 1008 / HTTP 403). Without it the user is
            Starlette's ``scope["user"]`` when an AuthenticationMiddleware set one, else None.
        allowed_origins: browser origins allowed to open a WebSocket or long-poll session,
            besides the page's own origin; ``["*"]`` allows any. Cross-site WebSocket hijacking
            is refused by default.
        compressor / decompressor: replace raw deflate (level 1) with your own.
        clock: a monotonic clock; tests inject a fake one.
        api_token: turns on the HTTP API (``{mount}/api/...``) for requests that carry
            ``Authorization: Bearer <api_token>``; others get 401.
        authorize_api: ``f(request, topic) -> bool`` (may be async; ``Reject`` refuses with its
            reason): turns on the HTTP API and decides per topic (403 when it says no); asked
            first with ``"$api"`` before a body naming topics or batches is read. With
            neither, the API's paths do not exist.
        batches: batch tracking (``Rubris.batches``, ``{mount}/api/batches``, ``batch.{id}``):
            a ``BatchStore`` (``SQLiteBatchStore``, ``RedisBatchStore``, ...), a SQLite file's
            path, a ready ``Batches``, True (the default: ``rubris-batches.sqlite3`` in the
            working directory, created when the first batch is opened; with a Redis broker,
            that Redis) or False (off).
        authorize_batch: ``f(session, batch) -> bool`` (may be async), asked when a session
            subscribes to ``batch.{id}``; without it, knowing the (random) id is enough.
        ops: serve the live operations page at ``{mount}/ops`` and its JSON at
            ``{mount}/ops/stats``, behind the HTTP API's authorisation (so it needs
            ``api_token`` or ``authorize_api``). docs/operations.md, "Metrics".
        stats_dir: a directory the workers of one host share so that any of them answers the
            ops page and ``/metrics`` for all (workers.py); default ``$RUBRIS_STATS_DIR``, then
            ``$PROMETHEUS_MULTIPROC_DIR``; without one a worker shows only itself.
        broker: how several workers and hosts share the shared topics: a ``Broker``
            (``RedisBroker(url, ...)``), a Redis URL, or None: ``$RUBRIS_REDIS_URL`` when set,
            else this process alone. docs/operations.md, "Several workers and hosts".
        quiet_polls: leave long-poll requests that succeed out of uvicorn's access log, with
            a summary line a minute in its log instead (True, the default: one long-poll tab
            makes a hundred requests a minute); False logs every one.
    """

    running: ClassVar[weakref.WeakSet[Rubris]] = weakref.WeakSet()
    """The started instances of this process (what a worker of ``serve(workers=N)`` drains)."""

    def __init__(
        self,
        config: Config | None = None,
        *,
        compress_at: int | None = _UNSET,
        authenticate: Authenticate | None = None,
        allowed_origins: Sequence[str] = (),
        compressor: Compressor | None = None,
        decompressor: Decompressor | None = None,
        clock: Callable[[], float] | None = None,
        api_token: str | None = None,
        authorize_api: AuthorizeApi | None = None,
        batches: Batches | BatchStore | str | bool = True,
        authorize_batch: AuthorizeBatch | None = None,
        ops: bool = False,
        stats_dir: str | None = None,
        broker: Broker | str | None = None,
        quiet_polls: bool = True,
    ) -> None:
        config = config or Config()
        if compress_at is not _UNSET:
            config = replace(config, compress_at=compress_at)
        self.config = config
        cluster = cluster_from(broker)
        self.broker = cluster.broker
        """Where shared publishes are numbered: this process (``LocalBroker``) or Redis."""
        if batches is True and cluster.batch_store is not None:  # every node sees every batch
            batches = cluster.batch_store
        elif batches is True and cluster.broker.distributed:
            raise ValueError(
                "batches=True (the default) needs a batch store every node shares, which "
                "this broker has not (a Redis Cluster keeps no batches yet): pass "
                "batches=False, or batches=RedisBatchStore(url) on a standalone Redis"
            )
        self._batches = Batches.from_spec(batches, config)
        self.engine = Engine(
            config,
            compressor=compressor,
            on_session_end=self._session_ended,
            on_item_end=None if self._batches is None else self._batches.item_ended,
            wake=self._wake_scheduler,
            **({"clock": clock} if clock else {}),
        )
        self.registry = Registry(
            compress_at=config.compress_at,
            keep=config.timing.topic_keep,
            max_topics=config.limits.max_topics_per_channel,
        )
        self.dispatcher = Dispatcher(self.engine, self.registry, config, decompressor, self.broker)
        self.gateway = Gateway(
            self.engine,
            self.dispatcher,
            config,
            broker=self.broker,
            nodes=cluster.nodes,
            authenticate=authenticate,
            allowed_origins=allowed_origins,
        )
        self.relays = Relays(self.gateway)
        """WebSockets carried to and from other nodes' sessions (several nodes)."""
        self.websocket = WebSocketTransport(self.gateway, self.relays)
        # a long-poll tab's requests would fill uvicorn's access log (quiet_log.py)
        self._quiet_polls = QuietPolls() if quiet_polls else None
        self.longpoll = LongPollTransport(self.gateway, self._quiet_polls)
        self.longpoll.serve_forwarded()  # polls that reach another node first (several nodes)
        self._remote = RemoteSends(self.engine, self.registry, cluster.nodes, self.send)
        self._ends = SessionEnds(self.engine, cluster.nodes, self.dispatcher.cancel_session)
        if self.broker.distributed:
            self.relays.serve()
            self._remote.serve()
            self._ends.serve()
        self._tasks: list[asyncio.Task[None]] = []
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = 0
        """The running loop's thread while started: calls from any other go through the loop."""
        self.started = False
        self._unchain_signals: Callable[[], None] = lambda: None
        self.api = HttpApi(
            self.engine,
            self.registry,
            config,
            token=api_token,
            authorize=authorize_api,
            broker=self.broker,
            batches=self._batches,
            origin_allowed=self.gateway.origin_allowed,  # the transports' rule: one allow-list
        )
        self._drain = Drain(self.engine, config, self.api, self.websocket, self.relays)
        batch_routes = []
        if self._batches is not None:
            BatchTopics(self.engine, self.registry, self._batches, authorize_batch)
            batch_routes = BatchApi(self.api, self._batches).routes()
        self.assets = Assets()
        self.observer = Observer(self.engine)
        """This worker's figures (``observer.snapshot()``): the ops page's and /metrics'."""
        self.board = WorkerBoard(self.observer, _stats_dir(stats_dir), history=ops)
        ops_routes = OpsPage(self.api, self.board, self.assets).routes() if ops else []
        self.router = Router(
            routes=[
                WebSocketRoute("/ws", self.websocket),
                Route("/lp", self._lp_open, methods=["POST"]),
                Route("/lp/{session}", self.longpoll.poll, methods=["GET"]),
                Route("/lp/{session}", self.longpoll.post_frame, methods=["POST"]),
                *self.assets.routes(),
                *self.api.routes(),
                *TopicApi(self.api).routes(),
                *batch_routes,
                *ops_routes,
            ]
        )

    # registration (delegated to the registry, which freezes at start)

    def shared(
        self,
        pattern: str,
        *,
        snapshot: bool = False,
        ring: int | None = None,
        keyed: bool = False,
        codec: Codec = Codec.JSON,
        compress_at: int | None = _UNSET,
        client_publish: PublishRule = False,
        keep: float | None = _UNSET,
        max_topics: int | None = None,
        max_keys: int | None = None,
        batch: int = 64,
        presence: bool | str = False,
        presence_info: Callable[[Session], Any] | None = None,
    ) -> Callable[[F], F]:
        """Register a shared channel: ``snapshot=True``, ``ring=N`` or ``keyed=True`` (a live
        table: ``set``, ``patch``, ``delete``, ``replace``). The handler ``(session,
        **params)`` may ``raise Reject`` and returns the value a new subscriber gets when the
        topic has none yet (a keyed topic: its whole table, a mapping of key to value).

        ``client_publish``: True lets a session PUBLISH where the handler accepts it as a
        subscriber; a hook ``(session, **params)`` (``payload=`` too, if it names it) decides
        each PUBLISH instead and may ``raise Reject``. ``keep``: seconds a topic outlives its
        last publish with no subscriber (``Timing.topic_keep``; None: for ever);
        ``max_topics``: the channel's topics alive at once (``Limits.max_topics_per_channel``).
        Keyed: ``max_keys`` live keys a topic (``Limits.max_keys``), ``batch`` entries a frame
        for one subscriber at most. ``presence=True``: who subscribes is the keyed topic
        ``{topic}@presence`` (an entry per user, ``{"sessions": n, "info": …}``, ``info`` what
        ``presence_info(session)`` returns) and the snapshot ``{topic}@count``; ``"count"``:
        the count alone.
        """
        return self.registry.shared(
            pattern,
            snapshot=snapshot,
            ring=ring if ring is not None or snapshot or keyed else self.config.ring_size,
            keyed=keyed,
            codec=codec,
            compress_at=compress_at,
            client_publish=client_publish,
            keep=keep,
            max_topics=max_topics,
            max_keys=max_keys,
            batch=batch,
            presence=presence,
            presence_info=presence_info,
        )

    def private(
        self,
        pattern: str,
        *,
        queue: int | None = None,
        batch: int = 1,
        codec: Codec = Codec.JSON,
        compress_at: int | None = _UNSET,
    ) -> Callable[[F], F]:
        """Register a private channel; the handler ``(session, **params)`` may ``raise Reject``."""
        return self.registry.private(
            pattern, queue=queue, batch=batch, codec=codec, compress_at=compress_at
        )

    def queue(
        self,
        pattern: str,
        *,
        max_length: int = 10_000,
        prefetch: int | None = None,
        max_prefetch: int = 1000,
        initial_prefetch: int = 4,
        batch: int = 64,
        delivery_limit: int = 20,
        dead_letter: str | None = None,
        codel_target: float | None = 0.020,
        codel_interval: float = 0.100,
        codec: Codec = Codec.JSON,
        compress_at: int | None = _UNSET,
        client_publish: PublishRule = False,
        max_topics: int | None = None,
    ) -> Callable[[F], F]:
        """Register a work-queue channel: each item goes to one consumer at a time.

        The handler ``(session, **params)`` runs when a session subscribes (to consume) and
        may ``raise Reject``. ``prefetch`` fixes every consumer's unacknowledged items; None
        sizes it per consumer from its round trip and processing time (from
        ``initial_prefetch``, at most ``max_prefetch``); a consumer may fix its own with
        SUBSCRIBE params ``{"prefetch": n}``. ``batch``: items in one frame at most.
        An item whose deliveries end in NACK or a lost consumer ``delivery_limit`` times, or
        that is NACKed without requeue, goes to the queue topic ``dead_letter`` (else it is
        dropped and counted). ``codel_target``/``codel_interval``: server-side CoDel, which
        takes back (REVOKE) items waiting too long inside a consumer; None turns it off.
        ``client_publish``: clients may PUBLISH items (True: where the handler accepts them
        as consumers; or a hook, as for ``shared``). ``max_topics``: the channel's queue topics
        alive at once. docs/guide.md, "Work queues".
        """
        settings = QueueSettings(
            max_length=max_length,
            prefetch=prefetch,
            max_prefetch=max_prefetch,
            initial_prefetch=min(initial_prefetch, max_prefetch),
            batch=batch,
            delivery_limit=delivery_limit,
            dead_letter=dead_letter,
            codel_target=codel_target,
            codel_interval=codel_interval,
        )
        return self.registry.queue(
            pattern,
            settings,
            codec=codec,
            compress_at=compress_at,
            client_publish=client_publish,
            max_topics=max_topics,
        )

    def rpc(self, name: str | None = None) -> Callable[[F], F]:
        """Register a method ``(session, args) -> result``; an async generator streams."""
        return self.registry.rpc(name)

    def _wake_scheduler(self) -> None:
        """Work arrived while the scheduler's task sleeps (none runs while stopped)."""
        if self._wake is not None:
            self._wake.set()

    def _session_ended(self, s: Session) -> None:
        self.dispatcher.cancel_session(s)
        self.longpoll.session_ended(s)
        self.relays.session_ended(s)

    # ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # a coroutine function, as servers expect of an ASGI 3 app (uvicorn tells ASGI 2 from 3
        # by it); a WebSocket at /ws goes straight to its transport, not through the router,
        # whose frames would stay suspended under every connection for its life (about 1 KB)
        if (
            scope["type"] == "websocket"
            and self.started
            and not self.draining
            and _route_path(scope) == "/ws"
        ):
            await self.websocket(scope, receive, send)
            return
        await self._asgi(scope, receive, send)

    async def _asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan_protocol(receive, send, self.start, self.stop)
            return
        # while draining, only new sessions are refused: a long-poll session's next poll is
        # how it receives its GOODBYE 9. Either way the client is told "not now" (1012/1013,
        # 503), never a refusal for good (server/refusals.py)
        if self.draining and (scope["type"] == "websocket" or not self.started):
            await not_now(scope, receive, send, "server restarting", RESTARTING)
        elif not self.started:
            # starting, or never started: an app without lifespan=rubris.lifespan stays here,
            # its clients retrying and logging this reason
            reason = "rubris is not started (yet?): is lifespan=rubris.lifespan set?"
            await not_now(scope, receive, send, reason, TRY_AGAIN_LATER)
        else:
            await self.router(scope, receive, send)

    async def _lp_open(self, request: Request) -> Response:
        if self.draining:
            headers = {"Retry-After": str(RETRY_AFTER)}
            return Response("server restarting", 503, headers=headers)
        return await self.longpoll.open_session(request)

    # lifespan

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Any = None) -> AsyncIterator[None]:
        """For ``FastAPI(lifespan=rubris.lifespan)`` / ``Starlette(lifespan=...)``."""
        await self.start()
        try:
            yield
        finally:
            await self.stop()

    async def __aenter__(self) -> Rubris:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _needs(self) -> set[str]:
        """What the registered channels ask of the broker (``cluster.base.KINDS``)."""
        needs = set()
        for ch in self.registry.channels:
            if ch.mode == Mode.QUEUE:
                needs.add("work-queue topics")
            elif ch.mode == Mode.KEYED:
                needs.add("keyed topics")
            if ch.presence is not None:
                needs.add("presence")
        return needs

    async def start(self) -> None:
        """Freeze registration and start the scheduler and housekeeping tasks.

        Raises ``StartupError`` where the configuration or the environment does not let rubris
        start (Redis out of reach, refusing, or not durable; several workers without a broker;
        a batch store that cannot be opened): one line that says what to do, its traceback
        logged at DEBUG. Nothing is left started then."""
        if self.started:
            return
        self.registry.freeze()
        loop = asyncio.get_running_loop()
        try:
            if not self.broker.distributed and int(os.environ.get(WORKERS_ENV, "1")) > 1:
                raise StartupError(
                    f"{os.environ[WORKERS_ENV]} workers without a broker would each serve their "
                    "own topics: set RUBRIS_REDIS_URL=redis://HOST:6379/0 (or "
                    "Rubris(broker=...)), or run one worker"
                )
            if any(ch.mode == Mode.QUEUE for ch in self.registry.channels):
                self.broker.holds("work-queue items")  # a Redis that could lose them fails here
            lacking = self.broker.lacks(self._needs())
            if lacking:
                raise StartupError(
                    f"the broker keeps no {' or '.join(sorted(lacking))} for several nodes "
                    f"({type(self.broker).__name__}): give the app a Redis or Sentinel URL, "
                    "or leave those channels out"
                )
            membership = await self.broker.start(self.engine)  # first: one out of reach fails
            if self._batches is not None:
                try:  # before anything runs: a store that cannot open leaves nothing to undo
                    await self._batches.store.start()
                except BaseException:
                    with contextlib.suppress(Exception):
                        await self.broker.stop()
                    raise
        except StartupError as exc:
            # not a bug: its line says what to do, and where in rubris it was raised would
            # only bury it under a traceback (issue 36); that is for DEBUG
            log.debug("rubris could not start", exc_info=True)
            raise exc.with_traceback(None) from None
        if membership is not None:  # several nodes: shared publishes go through the broker
            self.engine.join(membership)
        self._loop = loop
        self._thread = threading.get_ident()
        self._wake = asyncio.Event()
        self._drain.reset()
        self.api.start_accepting()
        # plain `uvicorn app:app` waits for in-flight requests (a waiting poll: 25 s) before it
        # runs our lifespan shutdown: drain when its signal comes instead (exit_signal.py)
        self._unchain_signals = drain_on_exit_signal(loop, self.drain)
        if self._quiet_polls is not None:
            self._quiet_polls.install()
        self._tasks = [
            loop.create_task(
                run_scheduler(self.engine, self._wake, self.websocket.outbox),
                name="rubris-scheduler",
            ),
            loop.create_task(
                housekeeping(self.engine, self.config, self.longpoll, self.websocket, self.broker),
                name="rubris-housekeeping",
            ),
            loop.create_task(queue_ticks(self.engine), name="rubris-queue-ticks"),
        ]
        every = self.config.timing.reauthenticate
        if every is not None:
            self._tasks.append(
                loop.create_task(reauthentication(self.websocket, every), name="rubris-reauth")
            )
        if self._batches is not None:
            self._tasks.append(loop.create_task(self._batches.run(), name="rubris-batches"))
        if self.board.running:  # the snapshot shared with other workers, the ops history
            self._tasks.append(loop.create_task(self.board.run(), name="rubris-worker-stats"))
        self.started = True
        Rubris.running.add(self)

    async def drain(self) -> None:
        """The first half of graceful shutdown: GOODBYE 9 to every session, wait up to
        ``Timing.shutdown_drain`` for their last frames, then close every connection
        (server/drain.py).

        New connections are refused from here on (WebSocket close 1013, HTTP 503). ``stop()``
        calls it; call it yourself (or run under ``rubris_asgi.serve``) before a server closes
        its sockets, since uvicorn closes WebSockets with 1012 before the lifespan shutdown.
        """
        if self.started:
            await self._drain.run()

    @property
    def draining(self) -> bool:
        """From the start of ``drain()`` to the next start: new sessions are refused."""
        return self._drain.draining

    async def stop(self) -> None:
        """Graceful shutdown: ``drain()``, then cancel the scheduler, housekeeping and every
        call still running; no task is left behind."""
        if not self.started:
            return
        await self.drain()
        self._unchain_signals()
        if self._quiet_polls is not None:
            self._quiet_polls.remove()
        self.started = False
        Rubris.running.discard(self)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self.board.close()
        await self.dispatcher.cancel_all()
        await self.broker.stop()  # what was published before the end reaches Redis
        self.engine.leave()
        if self._batches is not None:
            # what consumers ACKed before the end reaches the store before it closes
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._batches.flush(), self.config.timing.shutdown_drain)
            await self._batches.store.close()
        self._wake = None
        self._loop = None
        self._thread = 0


def _route_path(scope: Scope) -> str:
    """The path below the mount (what Starlette's router matches): ``path`` without
    ``root_path``."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] == "/":
        return path[len(root) :]
    return path
