"""``RubrisMiddleware`` in front of real frameworks, and the thread-safe publish.

The example apps of docs/examples/frameworks/ run on a real uvicorn (``rubris_asgi.Server``,
which drains rubris before closing connections, as ``python3 -m docs.examples.frameworks.X``
does), and once more as their docstrings say, from the command line. The middleware's own
tests wrap a plain ASGI app and run on uvicorn (some on hypercorn and granian too), in the
test's loop (tests/server.py). Each example module is imported once: its ``rubris`` starts and
stops once.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import re
import shlex
import signal
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.lifespan.on import LifespanOn

from rubris_asgi import ErrorCode, ProtocolError, QueueFull, Rubris, RubrisMiddleware
from rubris_asgi.client import Client

from .apps import make_rubris
from .server import SERVERS as EMBEDDED
from .server import run_server

ROOT = Path(__file__).resolve().parent.parent
TRANSPORTS = ("websocket", "longpoll")
PRICE = {"symbol": "AAPL", "price": 189.5}


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


@contextlib.asynccontextmanager
async def no_task_left() -> AsyncIterator[None]:
    """Every task the block started has ended by its end (a short grace for the last ones)."""
    before = set(asyncio.all_tasks())
    yield
    await asyncio.sleep(0.05)
    left = {t for t in asyncio.all_tasks() - before if not t.done()}
    left.discard(asyncio.current_task())  # type: ignore[arg-type]
    assert left == set(), left


async def connect_all(base: str) -> list[Client]:
    clients = [Client(base + "/rubris", transport=t, reconnect=False) for t in TRANSPORTS]
    for c in clients:
        await c.connect()
    return clients


async def said_goodbye(clients: list[Client]) -> None:
    """Each client got GOODBYE 9 (shutting down) from the drain; then it is closed."""
    await until(lambda: all(c.stats.goodbye is not None for c in clients))
    for c in clients:
        assert c.stats.goodbye is not None and c.stats.goodbye[0] == ErrorCode.SHUTTING_DOWN
        await c.close()


def example(name: str) -> ModuleType:
    return importlib.import_module(f"docs.examples.frameworks.{name}")


# the framework's own answer for a path it does not know: a piece of its body, and whether the
# app's middleware adds its x-served-by header to it (Litestar's only wraps route handlers)
NOT_FOUND = {
    "fastapi_app": ('{"detail":"Not Found"}', True),
    "starlette_app": ("Not Found", True),
    "litestar_app": ('"status_code":404', False),
    "quart_app": ("<title>404 Not Found</title>", True),
    "plain_asgi": ('{"error": "not found"}', True),
    "django_app": ("<title>Not Found</title>", True),
}
SERVED_BY = {
    "fastapi_app": "fastapi",
    "starlette_app": "starlette",
    "litestar_app": "litestar",
    "quart_app": "quart",
    "plain_asgi": "plain-asgi",
    "django_app": "django",
}


async def check_app_routes(name: str, http: httpx.AsyncClient) -> None:
    """Outside /rubris (and right next to it) the framework answers, its middleware runs;
    under /rubris rubris answers, without the app's middleware."""
    body, marked = NOT_FOUND[name]
    for path in ("/nope", "/rubris", "/rubrisx", "/rubrisx/ws"):
        r = await http.get(path)
        assert r.status_code == 404 and body in r.text, (path, r.status_code, r.text)
        assert (r.headers.get("x-served-by") == SERVED_BY[name]) is marked, r.headers
    r = await http.get("/rubris/client.js")
    assert r.status_code == 200 and "javascript" in r.headers["content-type"]
    assert "x-served-by" not in r.headers


@pytest.mark.parametrize(
    "name", ["fastapi_app", "starlette_app", "litestar_app", "quart_app", "plain_asgi"]
)
async def test_example_app_publishes_from_its_route_with_rubris_started_around_it(
    name: str,
) -> None:
    """FastAPI and Starlette use ``app.add_middleware(RubrisMiddleware, rubris=rubris)``,
    Litestar, Quart and the plain app are wrapped: ``RubrisMiddleware(app, rubris=rubris)``."""
    mod = example(name)
    rubris: Rubris = mod.rubris
    assert not rubris.started and mod.SEEN == {}
    async with no_task_left():
        async with (
            run_server(mod.app, drain=rubris) as base,
            httpx.AsyncClient(base_url=base, timeout=5) as http,
        ):
            assert mod.SEEN == {"startup": True}  # rubris was started when the app's hook ran
            clients = await connect_all(base)
            for c in clients:  # the startup hook's publish is the snapshot a subscriber gets
                market = await c.subscribe("market")
                assert (await market.get(timeout=5))[0] == {"open": True}
            subs = [await c.subscribe("prices.AAPL") for c in clients]

            r = await http.post("/price/AAPL", json={"price": 189.5})
            assert r.status_code == 200, r.text
            assert r.headers["x-served-by"] == SERVED_BY[name]
            for sub in subs:
                value, info = await sub.get(timeout=5)
                assert value == PRICE and info.seq == r.json()["seq"]
            await check_app_routes(name, http)
        # the server drained rubris (GOODBYE 9), then ran the app's shutdown, then rubris's
        await said_goodbye(clients)
        assert mod.SEEN == {"startup": True, "shutdown": True}
        assert not rubris.started


async def test_django_sync_and_async_views_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    """Django's ASGIHandler raises for lifespan: rubris runs the lifespan alone. The sync view
    runs in a worker thread, so its publish goes through the thread-safe hand-off."""
    mod = example("django_app")
    rubris: Rubris = mod.rubris
    callers: list[int] = []
    publish = rubris.publish

    def spy(name: str, value: Any) -> int:
        callers.append(threading.get_ident())
        return publish(name, value)

    monkeypatch.setattr(rubris, "publish", spy)
    assert not rubris.started
    async with no_task_left():
        async with (
            run_server(mod.application, drain=rubris) as base,
            httpx.AsyncClient(base_url=base, timeout=5) as http,
        ):
            assert rubris.started  # by the lifespan, before any request
            clients = await connect_all(base)
            subs = [await c.subscribe("prices.AAPL") for c in clients]
            for i, path in enumerate(("/price/AAPL", "/async/price/AAPL")):
                r = await http.post(path, json={"price": 189.5 + i})
                assert r.status_code == 200, r.text
                assert r.headers["x-served-by"] == "django"
                for sub in subs:
                    value, info = await sub.get(timeout=5)
                    assert value == {"symbol": "AAPL", "price": 189.5 + i}
                    assert info.seq == r.json()["seq"] == i + 1
            loop_thread = threading.get_ident()
            assert callers[0] != loop_thread  # the sync view: a worker thread
            assert callers[1] == loop_thread  # the async view: the server's loop
            assert (await http.get("/price/AAPL")).status_code == 405  # require_POST: Django's
            await check_app_routes("django_app", http)
        await said_goodbye(clients)
        assert not rubris.started


# --- the middleware itself, around a plain ASGI app ----------------------------------------


def plain_app(rubris: Rubris, events: list[str], lifespan: str = "ok") -> ASGIApp:
    """An ASGI app: ``POST /publish/{topic}`` publishes its body (text); any other HTTP request
    gets 200 ``app {path}``. ``lifespan``: ``ok``; ``fail`` (answers startup.failed);
    ``raise`` (raises once it took the startup event); ``unsupported`` (raises at once for
    anything but HTTP, as Django's ASGIHandler does)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" and lifespan == "unsupported":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}")
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].removeprefix("lifespan.")
                events.append(f"app {kind}, rubris started: {rubris.started}")
                if kind == "startup" and lifespan == "fail":
                    await send({"type": "lifespan.startup.failed", "message": "no database"})
                    return
                if kind == "startup" and lifespan == "raise":
                    raise RuntimeError("no database")
                await send({"type": f"{message['type']}.complete"})
                if kind == "shutdown":
                    return
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1000})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        text = f"app {scope['path']}"
        if scope["method"] == "POST" and scope["path"].startswith("/publish/"):
            text = str(rubris.publish(scope["path"].removeprefix("/publish/"), body.decode()))
        headers = [(b"content-type", b"text/plain"), (b"x-app", b"yes")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": text.encode()})

    return app


def spy_start_stop(rubris: Rubris, events: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    start, stop = rubris.start, rubris.stop

    async def spy_start() -> None:
        events.append("rubris start")
        await start()

    async def spy_stop() -> None:
        events.append("rubris stop")
        await stop()

    monkeypatch.setattr(rubris, "start", spy_start)
    monkeypatch.setattr(rubris, "stop", spy_stop)


@pytest.mark.parametrize("server", EMBEDDED)
async def test_lifespan_starts_rubris_first_and_stops_it_last(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rubris, events = make_rubris(), []
    spy_start_stop(rubris, events, monkeypatch)
    app = RubrisMiddleware(plain_app(rubris, events), rubris=rubris)
    async with no_task_left():
        async with run_server(app, server=server):
            assert events == ["rubris start", "app startup, rubris started: True"]
        assert events[2:] == ["app shutdown, rubris started: True", "rubris stop"]
        assert not rubris.started


async def server_startup(app: ASGIApp) -> list[dict[str, Any]]:
    """uvicorn's own lifespan driver (``lifespan="on"``) runs the startup; what it received.
    (On ``lifespan.startup.failed`` uvicorn's server exits with status 3.)"""
    lifespan = LifespanOn(uvicorn.Config(app, lifespan="on", log_level="critical"))
    received: list[dict[str, Any]] = []
    send = lifespan.send

    async def spy(message: Any) -> None:
        received.append(dict(message))
        await send(message)

    lifespan.send = spy  # type: ignore[method-assign]
    await asyncio.wait_for(lifespan.startup(), 10)
    assert lifespan.should_exit == any(m["type"] == "lifespan.startup.failed" for m in received)
    return received


@pytest.mark.parametrize(
    ("lifespan", "reason"), [("fail", "no database"), ("raise", "RuntimeError: no database")]
)
async def test_failed_app_startup_reaches_the_server_and_stops_rubris(
    lifespan: str, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rubris, events = make_rubris(), []
    spy_start_stop(rubris, events, monkeypatch)
    app = RubrisMiddleware(plain_app(rubris, events, lifespan), rubris=rubris)
    async with no_task_left():
        received = await server_startup(app)
    assert received == [{"type": "lifespan.startup.failed", "message": reason}]
    assert events == ["rubris start", "app startup, rubris started: True", "rubris stop"]
    assert not rubris.started


@pytest.mark.parametrize("server", EMBEDDED)
async def test_app_that_raises_for_lifespan_is_left_out_of_it(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rubris, events = make_rubris(), []
    spy_start_stop(rubris, events, monkeypatch)
    app = RubrisMiddleware(plain_app(rubris, events, "unsupported"), rubris=rubris)
    async with no_task_left():
        async with (
            run_server(app, server=server) as base,
            httpx.AsyncClient(base_url=base, timeout=5) as http,
            Client(base + "/rubris") as c,
        ):
            assert events == ["rubris start"]
            sub = await c.subscribe("ring.t")
            r = await http.post("/publish/ring.t", content=b"hello")
            assert r.status_code == 200 and r.headers["x-app"] == "yes"
            assert (await sub.get(timeout=5))[0] == "hello"
        assert events == ["rubris start", "rubris stop"]
        assert not rubris.started


async def test_without_lifespan_the_first_request_starts_rubris(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """uvicorn --lifespan off, daphne: nothing starts rubris but the first requests (several
    at once start it once), and nothing stops it: the server never says it shuts down."""
    rubris, events = make_rubris(), []
    spy_start_stop(rubris, events, monkeypatch)
    app = RubrisMiddleware(plain_app(rubris, events), rubris=rubris)
    try:
        async with no_task_left():
            async with (
                run_server(app, lifespan="off") as base,
                httpx.AsyncClient(base_url=base, timeout=5) as http,
            ):
                assert not rubris.started
                c = Client(base + "/rubris", transport="websocket")
                got = await asyncio.gather(c.connect(), *(http.get(f"/x{i}") for i in range(4)))
                assert [r.text for r in got[1:]] == [f"app /x{i}" for i in range(4)]
                assert rubris.started and events == ["rubris start"]
                sub = await c.subscribe("ring.t")
                await http.post("/publish/ring.t", content=b"hello")
                assert (await sub.get(timeout=5))[0] == "hello"
                await c.close()
                assert rubris.started and events == ["rubris start"]
                await rubris.stop()  # what a framework's own shutdown hook would do
                # stopped for good: a later request does not start it again
                assert (await http.get("/rubris/client.js")).status_code == 503
                assert (await http.get("/x")).text == "app /x"
                assert not rubris.started and events == ["rubris start", "rubris stop"]
    finally:
        await rubris.stop()


async def test_metrics_served_at_the_path_given() -> None:
    """``metrics="/metrics"``: Prometheus text for a framework that cannot mount an endpoint;
    the app keeps every other path, and a bad metrics path is refused like a bad ``path``."""
    rubris = make_rubris()
    app = RubrisMiddleware(plain_app(rubris, []), rubris=rubris, metrics="/metrics")
    async with (
        run_server(app) as base,
        httpx.AsyncClient(base_url=base, timeout=5) as http,
        Client(base + "/rubris") as c,
    ):
        await c.subscribe("snap.a")
        r = await http.get("/metrics")
        assert r.status_code == 200 and "x-app" not in r.headers
        assert "rubris_sessions{" in r.text and 'transport="websocket"' in r.text
        assert (await http.get("/metrics/x")).text == "app /metrics/x"
    with pytest.raises(ValueError, match="metrics must look like"):
        RubrisMiddleware(plain_app(rubris, []), rubris=rubris, metrics="metrics")


async def test_paths_under_the_prefix_go_to_rubris_the_rest_to_the_app() -> None:
    rubris = make_rubris()
    async with (
        run_server(RubrisMiddleware(plain_app(rubris, []), rubris=rubris)) as base,
        httpx.AsyncClient(base_url=base, timeout=5) as http,
    ):
        for path in ("/", "/rubris", "/rubrisx", "/rubrisx/ws", "/x/rubris/ws"):
            r = await http.get(path)
            assert r.text == f"app {path}" and r.headers["x-app"] == "yes"
        for path in ("/rubris/", "/rubris/client.js", "/rubris/nope"):
            assert "x-app" not in (await http.get(path)).headers, path
        assert (await http.get("/rubris/client.js")).status_code == 200
        for transport in TRANSPORTS:  # /rubris/ws, /rubris/lp
            async with Client(base + "/rubris", transport=transport) as c:  # type: ignore[arg-type]
                assert (await (await c.subscribe("snap.a")).get(timeout=5))[0] == {"initial": "a"}


@pytest.mark.slow
async def test_a_deeper_path_and_a_proxy_root_path() -> None:
    """``path="/push/v1"``; and uvicorn ``--root-path /api`` (a proxy that strips ``/api``):
    the middleware routes on the path below the root path."""
    rubris = make_rubris()
    app = RubrisMiddleware(plain_app(rubris, []), rubris=rubris, path="/push/v1")
    async with run_server(app) as base:
        for transport in TRANSPORTS:
            async with Client(base + "/push/v1", transport=transport) as c:  # type: ignore[arg-type]
                assert (await (await c.subscribe("snap.a")).get(timeout=5))[0] == {"initial": "a"}

    rubris = make_rubris()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = RubrisMiddleware(plain_app(rubris, []), rubris=rubris)
    config = uvicorn.Config(
        app, ws_per_message_deflate=False, log_level="warning", root_path="/api"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await until(lambda: server.started)
        base = f"http://127.0.0.1:{sock.getsockname()[1]}"
        async with httpx.AsyncClient(base_url=base, timeout=5) as http:
            assert (await http.get("/rubrisx")).text == "app /api/rubrisx"
        for transport in TRANSPORTS:
            async with Client(base + "/rubris", transport=transport) as c:  # type: ignore[arg-type]
                assert (await (await c.subscribe("snap.a")).get(timeout=5))[0] == {"initial": "a"}
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


@pytest.mark.parametrize("path", ["rubris", "/rubris/", "/", "", "//rubris", "/a//b"])
def test_a_bad_path_is_refused(path: str) -> None:
    with pytest.raises(ValueError, match="path must look like"):
        RubrisMiddleware(plain_app(make_rubris(), []), rubris=make_rubris(), path=path)


async def test_plain_uvicorn_closes_websockets_before_rubris_can_say_goodbye() -> None:
    """What the guide says about the uvicorn CLI: its shutdown closes WebSockets (1012)
    before the lifespan shutdown, so rubris stops but a client gets no GOODBYE 9; run under
    ``rubris_asgi.serve`` / ``Server`` for it (the example tests above)."""
    rubris = make_rubris()
    async with run_server(RubrisMiddleware(plain_app(rubris, []), rubris=rubris)) as base:
        c = Client(base + "/rubris", transport="websocket", reconnect=False)
        await c.connect()
        await c.subscribe("snap.a")
    assert not rubris.started
    await asyncio.sleep(0.1)
    assert c.stats.goodbye is None
    await c.close()


# --- publish, enqueue and send_nowait from other threads -----------------------------------


def threaded_rubris() -> Rubris:
    rubris = make_rubris()

    @rubris.shared("ticks", ring=1024)
    async def ticks(session: Any) -> None:
        return None

    @rubris.queue("jobs", max_length=1)
    async def jobs(session: Any) -> None:
        return None

    return rubris


async def in_thread(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``fn()`` in a new thread: what it returned or raised, and the thread's id."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except Exception as exc:
            out.append(exc)
        out.append(threading.get_ident())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    await until(lambda: not thread.is_alive())
    thread.join()
    return out[0], out[1]


async def test_publishes_from_four_threads_all_arrive_each_in_order() -> None:
    rubris = threaded_rubris()
    async with (
        run_server(RubrisMiddleware(plain_app(rubris, []), rubris=rubris)) as base,
        Client(base + "/rubris") as c,
    ):
        got: list[tuple[Any, int]] = []
        sub = await c.subscribe("ticks", lambda value, info: got.append((value, info.seq)))

        def work(t: int) -> Callable[[], list[int]]:
            return lambda: [rubris.publish("ticks", {"t": t, "i": i}) for i in range(200)]

        results = await asyncio.gather(*(in_thread(work(t)) for t in range(4)))
        loop_thread = threading.get_ident()
        assert all(tid != loop_thread for _, tid in results)
        seqs = [s for r, _ in results for s in r]
        assert sorted(seqs) == list(range(1, 801))  # each publish got its own seq
        assert all(r == sorted(r) for r, _ in results)
        await until(lambda: len(got) == 800)
        assert sub.gaps == []
        for t in range(4):
            mine = [(v["i"], seq) for v, seq in got if v["t"] == t]
            assert [i for i, _ in mine] == list(range(200))  # all, in the thread's order
            assert [seq for _, seq in mine] == results[t][0]


async def test_errors_raise_in_the_calling_thread() -> None:
    rubris = threaded_rubris()
    async with (
        run_server(RubrisMiddleware(plain_app(rubris, []), rubris=rubris)) as base,
        Client(base + "/rubris") as c,
    ):
        loop_thread = threading.get_ident()
        exc, tid = await in_thread(lambda: rubris.publish("no.such.topic", 1))
        assert isinstance(exc, ProtocolError) and exc.code == ErrorCode.UNKNOWN
        assert tid != loop_thread
        exc, _ = await in_thread(lambda: rubris.enqueue("no.such.queue", 1))
        assert isinstance(exc, ProtocolError) and exc.code == ErrorCode.UNKNOWN

        assert (await in_thread(lambda: rubris.enqueue("jobs", 1)))[0] is not None
        exc, _ = await in_thread(lambda: rubris.enqueue("jobs", 2))  # max_length=1
        assert isinstance(exc, QueueFull)

        inbox = await c.subscribe("inbox")  # private, queue=16
        session = rubris.engine.sessions[c.session_id]  # type: ignore[index]
        seq, _ = await in_thread(lambda: rubris.send_nowait(session, "inbox", {"n": 1}))
        assert isinstance(seq, int)
        assert (await inbox.get(timeout=5))[0] == {"n": 1}


# --- the commands the examples' docstrings give, as a reader runs them ---------------------


def documented_command(name: str) -> list[str]:
    """The ``uvicorn ...`` line of the example's docstring."""
    doc = (ROOT / "docs" / "examples" / "frameworks" / f"{name}.py").read_text()
    found = re.search(r"^\s+(uvicorn docs\.examples\.frameworks\.\S+ .*)$", doc, re.M)
    assert found, f"{name}: no uvicorn command in the docstring"
    return shlex.split(found.group(1))


async def run_command(cmd: list[str], port: int, check: Callable[[str], Awaitable[None]]) -> None:
    """Run ``cmd`` from the repository root, ``check`` it once it answers, stop it (Ctrl-C)."""
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            for _ in range(300):
                if proc.returncode is not None:
                    break
                with contextlib.suppress(httpx.TransportError):
                    await http.get("/rubris/client.js")
                    break
                await asyncio.sleep(0.05)
        assert proc.returncode is None, "the server exited"
        await check(f"http://127.0.0.1:{port}")
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGINT)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), 10)
        except asyncio.TimeoutError:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = await proc.communicate()
    log = out.decode(errors="replace")
    assert "Traceback" not in log and "ERROR" not in log, log


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def push_arrives(base: str) -> None:
    async with (
        Client(base + "/rubris", transport="websocket") as c,
        httpx.AsyncClient(base_url=base, timeout=5) as http,
    ):
        sub = await c.subscribe("prices.AAPL")
        r = await http.post("/price/AAPL", json={"price": 189.5})
        assert r.status_code == 200, r.text
        assert (await sub.get(timeout=5))[0] == PRICE


SERVERS: dict[str, Callable[[list[str], int], list[str]]] = {
    "uvicorn": lambda cmd, port: [*cmd, "--host", "127.0.0.1", "--port", str(port)],
    "hypercorn": lambda cmd, port: ["hypercorn", cmd[1], "--bind", f"127.0.0.1:{port}"],
    "granian": lambda cmd, port: ["granian", "--interface", "asgi", cmd[1], "--port", str(port)],
}


@pytest.mark.parametrize(
    ("name", "server"),
    [(name, "uvicorn") for name in SERVED_BY]
    + [("starlette_app", "hypercorn"), ("django_app", "granian")],
)
async def test_the_documented_command_runs(name: str, server: str) -> None:
    port = free_port()
    cmd = SERVERS[server](documented_command(name), port)
    await run_command(cmd, port, push_arrives)
