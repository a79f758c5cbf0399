"""What the clients say when they cannot connect, and what they do about it.

A wrong URL, a refused origin, a server not started: each error names its subject and the fix
(issue 36). "Not now" (1012/1013, 503) is retried with one WARNING line; a refusal for good is
not retried, and a client that gives up in the background says so (an ERROR, or
``wait_closed()`` raising), never ending silently. The restarts under each ASGI server are
tests/test_restarts.py.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from rubris_asgi import Reject, Rubris
from rubris_asgi.client import Client, ConnectionLost

from .apps import make_rubris, starlette_app
from .server import SERVERS, run_server
from .test_restarts import example_worker

ROOT = Path(__file__).resolve().parent.parent
TRANSPORTS = ("websocket", "longpoll")


def reason_of(err: BaseException) -> str:
    """The error and its causes, as one text."""
    parts = []
    e: BaseException | None = err
    while e is not None:
        parts.append(str(e))
        e = e.__cause__
    return " <- ".join(parts)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_wrong_mount_path_says_no_rubris_endpoint_and_is_not_retried(
    transport: str,
) -> None:
    async with run_server(starlette_app(make_rubris())) as base:
        client = Client(base + "/wrong", transport=transport)  # type: ignore[arg-type]
        with pytest.raises(ConnectionLost) as err:
            await client.connect()
        text = reason_of(err.value)
        endpoint = (
            base.replace("http", "ws") + "/wrong/ws"
            if transport == "websocket"
            else base + "/wrong/lp"
        )
        assert f"no rubris endpoint at {endpoint} " in text, text
        assert "is the mount path right?" in text, text
        assert client.stats.reconnects == 0 and client.state == "closed"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_endpoint_given_as_the_url_is_named_as_the_mistake(transport: str) -> None:
    async with run_server(starlette_app(make_rubris())) as base:
        endpoint = "/ws" if transport == "websocket" else "/lp"
        client = Client(base + "/rubris" + endpoint, transport=transport)  # type: ignore[arg-type]
        with pytest.raises(ConnectionLost) as err:
            await client.connect()
        text = reason_of(err.value)
        assert "no rubris endpoint" in text, text
        assert "give the client the mount URL (http://host:port/rubris)" in text, text


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_origin_refusal_names_the_origin_and_allowed_origins(
    server: str, transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The server's log line and the client's error name the Origin and the setting; the
    client does not retry (behind a proxy that rewrites Host, e.g. Vite's changeOrigin)."""
    rubris = make_rubris(allowed_origins=["https://app.example"])
    origin = "http://localhost:5173"
    async with run_server(starlette_app(rubris), server=server) as base:
        client = Client(
            base + "/rubris",
            transport=transport,  # type: ignore[arg-type]
            headers={"Origin": origin},
        )
        with pytest.raises(ConnectionLost) as err:
            await client.connect()
        text = reason_of(err.value)
        logged = [r.getMessage() for r in caplog.records if r.name == "rubris_asgi"]
    assert any(origin in m and "allowed_origins" in m for m in logged), logged
    # granian cannot answer a refused handshake with a body: there the WebSocket is accepted
    # and closed with 1008 and the reason, before a message is read
    assert f"origin {origin!r} is not allowed" in text, text
    assert "allowed_origins" in text, text
    assert client.stats.reconnects == 0 and rubris.engine.sessions == {}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_authentication_refusal_gives_its_reason(transport: str) -> None:
    def authenticate(conn: object) -> str:
        raise Reject("the token expired: log in again")

    async with run_server(starlette_app(make_rubris(authenticate=authenticate))) as base:
        client = Client(base + "/rubris", transport=transport)  # type: ignore[arg-type]
        with pytest.raises(ConnectionLost) as err:
            await client.connect()
    text = reason_of(err.value)
    assert "refused" in text and "the token expired: log in again" in text, text


async def test_a_rubris_not_started_answers_not_now_with_its_reason() -> None:
    """An app that forgot the lifespan (or one still starting): the WebSocket is accepted and
    closed with 1013, the long-poll POST answered 503 with Retry-After, both saying why; never
    the 403 of a close before accept, which clients take for a refusal for good."""
    rubris = make_rubris()
    app = Starlette(routes=[Mount("/rubris", rubris)])  # no lifespan=rubris.lifespan
    async with run_server(app) as base:
        async with ws_connect(base.replace("http", "ws") + "/rubris/ws") as ws:
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
        frame = closed.value.rcvd
        assert frame is not None and frame.code == 1013, frame
        assert "rubris is not started" in frame.reason and "lifespan" in frame.reason
        async with httpx.AsyncClient() as http:
            r = await http.post(base + "/rubris/lp", content=b"")
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r
        assert "rubris is not started" in r.text


@pytest.mark.slow  # seconds by design
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_rubris_stopping_is_not_now_retried_with_one_warning(
    transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Stopped under a server that goes on (a restart in place): clients are told "not now"
    (1012, 503) while it is down, retry with backoff and say so in one line, instead of giving
    up on a 403; once it is started again, they are back."""
    caplog.set_level(logging.DEBUG, logger="rubris_asgi.client")
    rubris = make_rubris()
    app = Starlette(routes=[Mount("/rubris", rubris)])  # started and stopped by the test
    async with run_server(app) as base:
        client = Client(base + "/rubris", transport=transport, backoff=(0.05, 0.2))  # type: ignore[arg-type]
        await rubris.start()
        try:
            await client.connect()
            await rubris.stop()  # GOODBYE 9, then "not now" until started again
            await asyncio.sleep(1.3)  # attempts, each told "not now" (503: after Retry-After)
            assert client.state == "reconnecting"
            await rubris.start()
            await asyncio.wait_for(client.wait_connected(), 5)
            warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
            assert len(warnings) == 1 and "reconnecting" in warnings[0], warnings
            attempts = [r.getMessage() for r in caplog.records if "reconnect attempt" in r.msg]
            assert attempts, "no attempt failed"
            said = "is restarting (1012" if transport == "websocket" else "HTTP 503"
            assert all(said in m and "server restarting" in m for m in attempts), attempts
        finally:
            await client.close()
            await rubris.stop()


async def test_a_client_that_gives_up_in_the_background_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Connected, then refused for good on a reconnect (the credentials were revoked): the client
    closes, logs one ERROR saying why when nobody waits, and ``wait_closed`` raises it."""
    allowed = {"yes": True}

    def authenticate(conn: object) -> str:
        if not allowed["yes"]:
            raise Reject("user banned")
        return "alice"

    rubris = make_rubris(authenticate=authenticate)
    async with run_server(starlette_app(rubris)) as base:
        watched = Client(base + "/rubris", backoff=(0.05, 0.2))
        silent = Client(base + "/rubris", backoff=(0.05, 0.2))
        await watched.connect()
        await silent.connect()
        waiting = asyncio.create_task(watched.wait_closed())
        allowed["yes"] = False
        await rubris.disconnect(user="alice", code=4, reason="signed out")
        with pytest.raises(ConnectionLost) as err:
            await asyncio.wait_for(waiting, 10)
        assert "signed out (code 4)" in reason_of(err.value), reason_of(err.value)
        await asyncio.wait_for(_closed(silent), 10)  # it gave up by itself
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        # the one nobody waited on says it; the watched one raised instead
        assert len(errors) == 1 and "giving up" in errors[0], errors
        with pytest.raises(ConnectionLost):
            await silent.wait_closed()  # later callers get it too
        await watched.close()
        await silent.close()


async def _closed(client: Client) -> None:
    for _ in range(1000):
        if client.state == "closed":
            return
        await asyncio.sleep(0.01)


async def test_wait_closed_returns_after_close() -> None:
    async with run_server(starlette_app(make_rubris())) as base:
        client = Client(base + "/rubris")
        await client.connect()
        waiting = asyncio.create_task(client.wait_closed())
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await client.close()
        await asyncio.wait_for(waiting, 5)  # returns: closed on purpose


@pytest.mark.slow  # seconds by design
@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:{port}/nowhere", "http://127.0.0.1:{port}/rubris/ws"]
)
async def test_the_example_worker_that_cannot_connect_says_why_and_exits_1(url: str) -> None:
    async with run_server(starlette_app(Rubris())) as base:
        port = base.rsplit(":", 1)[1]
        async with example_worker(url.format(port=port)) as proc:
            out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 1, (out, err)
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert "stopped" in lines[0] and "no rubris endpoint" in lines[0], lines
