"""Graceful shutdown: GOODBYE 9 to every session on both transports, in-flight frames drained
within ``Timing.shutdown_drain``, nothing left running; under ``rubris_asgi.serving.Server`` and
with a direct ``await rubris.stop()``."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from websockets.exceptions import ConnectionClosed

from rubris_asgi import Rubris, Session, Timing
from rubris_asgi.client import Client
from rubris_asgi.protocol import (
    Call,
    Goodbye,
    Hello,
    Message,
    Push,
    Subscribe,
    Subscribed,
    decode_frame,
    encode_frame,
)
from rubris_asgi.serving import Server

from .apps import make_rubris, starlette_app
from .netkit import free_port
from .server import run_server
from .wirekit import (
    expect_goodbye_and_close,
    lp_hello,
    raw_ws_handshake,
    recv_until,
    until,
    ws_client_frame,
    ws_hello,
    ws_open,
)

DRAIN = 1.5


def shutdown_rubris() -> Rubris:
    rubris = make_rubris(timing=Timing(poll_timeout=5.0, session_timeout=5.0, shutdown_drain=DRAIN))

    @rubris.rpc("forever")
    async def forever(session: Session, args: Any) -> Any:
        await asyncio.Event().wait()

    return rubris


@contextlib.asynccontextmanager
async def serve(rubris: Rubris, **options: Any) -> AsyncIterator[tuple[str, Server]]:
    """Run ``rubris_asgi.serving.Server`` as tests/server.py runs uvicorn; the test stops it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        starlette_app(rubris),
        host="127.0.0.1",
        port=port,
        ws="websockets-sansio",
        ws_per_message_deflate=False,
        log_level="warning",
        **options,
    )
    server = Server(config, rubris)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await until(lambda: server.started or task.done())
        if task.done():
            task.result()
        server.__dict__["test_task"] = task
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 15)
        sock.close()


def running_tasks() -> set[asyncio.Task[Any]]:
    return {t for t in asyncio.all_tasks() if not t.done()} - {asyncio.current_task()}  # type: ignore[operator]


async def lp_poll_all(c: httpx.AsyncClient, sid: str, ack: int) -> tuple[int, list[Message]]:
    r = await c.get(f"/lp/{sid}", params={"ack": ack})
    assert r.status_code in (200, 204), (r.status_code, r.text)
    if r.status_code == 204:
        return ack, []
    return int(r.headers["Rubris-Frame"]), decode_frame(r.content)


async def test_server_sends_goodbye_9_on_both_transports_and_leaves_nothing() -> None:
    before = running_tasks()
    rubris = shutdown_rubris()
    async with serve(rubris) as (base, server):
        task: asyncio.Task[None] = server.__dict__["test_task"]
        # a Python client, a raw WebSocket with a call that never ends, and two long-poll
        # sessions: one with a poll waiting, one that polled a moment ago and polls again
        client = Client(base + "/rubris", reconnect=False)
        await client.connect()
        await client.subscribe("ring.x")
        ws = await ws_open(base)
        await ws_hello(ws, Subscribe(1, "ring.x", 0, 0, b""), Call(2, "forever", b""))
        await recv_until(ws, lambda m: isinstance(m, Subscribed))
        http = httpx.AsyncClient(base_url=base + "/rubris", timeout=10)
        waiting = await lp_hello(http, Subscribe(1, "ring.x", 0, 0, b""))
        ack, _ = await lp_poll_all(http, waiting.session, 0)
        later = await lp_hello(http)
        await until(lambda: rubris.dispatcher.tasks != set())
        try:
            poll = asyncio.create_task(http.get(f"/lp/{waiting.session}", params={"ack": ack}))
            await asyncio.sleep(0.1)

            for i in range(5):  # in flight when the shutdown starts
                rubris.publish("ring.x", i)
            started = time.monotonic()
            server.should_exit = True

            # the raw WebSocket: what was published, then GOODBYE 9 as the last message and
            # close 1000
            got: list[int] = []
            while True:
                m = await recv_until(ws, lambda m: isinstance(m, (Push, Goodbye)))
                if isinstance(m, Goodbye):
                    assert m.code == 9
                    break
                assert isinstance(m, Push)
                got.append(orjson.loads(m.payload))
            assert got == sorted(got)  # whatever arrived came in order
            with pytest.raises(Exception):  # noqa: B017 - closed: ConnectionClosed
                await asyncio.wait_for(ws.recv(), 5)
            assert ws.close_code == 1000

            # the waiting poll is answered (with what was published), and polling on, the
            # client gets GOODBYE 9 as the last message
            r = await poll
            assert r.status_code == 200
            msgs = decode_frame(r.content)
            while not isinstance(msgs[-1], Goodbye):
                assert all(isinstance(m, Push) for m in msgs), msgs
                ack, msgs = await lp_poll_all(http, waiting.session, int(r.headers["Rubris-Frame"]))
                assert msgs, "a poll that got nothing: the GOODBYE did not come"
            assert msgs[-1].code == 9
            # the one that polls again a moment later gets it too
            r = await http.get(f"/lp/{later.session}", params={"ack": 0})
            assert r.status_code == 200
            bye = decode_frame(r.content)[-1]
            assert isinstance(bye, Goodbye) and bye.code == 9
            # the Python client saw it as well
            await until(lambda: client.stats.goodbye is not None)
            assert client.stats.goodbye[0] == 9  # type: ignore[index]

            await asyncio.wait_for(task, DRAIN + 5)
            took = time.monotonic() - started
            assert took < DRAIN + 2, took
        finally:
            await client.close()
            await ws.close()
            await http.aclose()
    assert not rubris.started
    assert rubris.engine.sessions == {} and rubris.longpoll.sessions == {}
    assert rubris.websocket.connections == set() and rubris.dispatcher.tasks == set()
    pool = rubris.stats().pool
    assert pool.in_use_block + pool.in_use_large + pool.in_use_unpooled == 0
    await until(lambda: running_tasks() <= before, timeout=3)


async def test_direct_stop_refuses_newcomers_and_says_goodbye() -> None:
    rubris = shutdown_rubris()
    async with run_server(starlette_app(rubris)) as base:
        before = running_tasks()
        async with (
            await ws_open(base) as ws,
            httpx.AsyncClient(base_url=base + "/rubris", timeout=10) as http,
        ):
            await ws_hello(ws, Call(1, "forever", b""))
            lp = await lp_hello(http)  # polled a moment ago: the drain waits for its next poll
            stopping = asyncio.create_task(rubris.stop())
            await expect_goodbye_and_close(ws, 9, 1000)
            # while draining, newcomers are told "not now", never refused for good (a 403 at the
            # handshake would make clients give up): 503 with Retry-After, and a WebSocket
            # accepted and closed with 1012 (restarting)
            assert rubris.draining and not stopping.done()
            r = await http.post("/lp", content=encode_frame([Hello(1, "")]))
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            async with await ws_open(base) as late:
                with pytest.raises(ConnectionClosed) as closed:
                    await late.recv()
            assert closed.value.rcvd is not None
            assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1012, "server restarting")
            r = await http.get(f"/lp/{lp.session}", params={"ack": 0})
            bye = decode_frame(r.content)[-1]
            assert isinstance(bye, Goodbye) and bye.code == 9
            await asyncio.wait_for(stopping, DRAIN + 2)
        assert rubris.engine.sessions == {} and rubris.dispatcher.tasks == set()
        # our own tasks (scheduler, housekeeping, calls) are gone; only uvicorn's remain
        await until(lambda: running_tasks() <= before, timeout=3)
        names = {t.get_name() for t in asyncio.all_tasks()}
        assert not {"rubris-scheduler", "rubris-housekeeping"} & names


@pytest.mark.slow
@pytest.mark.parametrize("via_server", [True, False], ids=["Server", "stop"])
async def test_drain_is_bounded_by_shutdown_drain_with_a_stuck_client(via_server: bool) -> None:
    """A client that stopped reading cannot take its GOODBYE: the drain gives up after
    ``shutdown_drain`` and shutdown carries on, with the Server and with a direct stop()."""
    before = running_tasks()
    rubris = shutdown_rubris()

    @rubris.shared("fat", ring=64, compress_at=None)
    async def fat(session: Session) -> None:
        return None

    async with contextlib.AsyncExitStack() as stack:
        server: Server | None = None
        if via_server:
            base, server = await stack.enter_async_context(serve(rubris))
        else:
            base = await stack.enter_async_context(run_server(starlette_app(rubris)))
        stuck, status, _ = await raw_ws_handshake(int(base.rsplit(":", 1)[1]), rcvbuf=4096)
        stack.callback(stuck.close)
        assert status == 101
        hello = encode_frame([Hello(1, ""), Subscribe(1, "fat", 0, 0, b"")])
        await asyncio.get_running_loop().sock_sendall(stuck, ws_client_frame(hello))
        topics = rubris.engine.topics
        await until(lambda: "fat" in topics and bool(topics["fat"].subs))
        [conn] = list(rubris.websocket.connections)
        blob = "x" * (128 * 1024)
        for _ in range(100):
            if conn.writing is not None:
                break
            rubris.publish("fat", blob)
            await asyncio.sleep(0.01)
        assert conn.writing is not None, "never blocked"
        async with httpx.AsyncClient(base_url=base + "/rubris", timeout=10) as h:
            good = await lp_hello(h)
            poll = asyncio.create_task(h.get(f"/lp/{good.session}", params={"ack": 0}))
            await asyncio.sleep(0.1)
            started = time.monotonic()
            if server is not None:
                server.should_exit = True
                await asyncio.wait_for(server.__dict__["test_task"], 2 * DRAIN + 5)
            else:
                await rubris.stop()
            took = time.monotonic() - started
            # the well-behaved long-poll client got its GOODBYE 9 at once
            r = await poll
            assert r.status_code == 200
            bye = decode_frame(r.content)[-1]
            assert isinstance(bye, Goodbye) and bye.code == 9
        # the drain: shutdown_drain; the Server then cuts the stuck connection after as long
        # again (uvicorn alone would wait for it forever)
        assert DRAIN - 0.1 <= took < (2 * DRAIN if via_server else DRAIN) + 1.5, took
        assert rubris.engine.sessions == {} and rubris.websocket.connections == set()
        if via_server:
            await until(lambda: running_tasks() <= before, timeout=3)


@pytest.mark.slow
async def test_plain_uvicorn_ctrl_c_ends_a_waiting_poll_at_once_with_goodbye_9() -> None:
    """Under plain ``uvicorn app:app`` (no ``rubris_asgi.serve``), Ctrl-C used to wait for a
    waiting long-poll's whole ``poll_timeout`` (25 s) before the lifespan ran: rubris now drains
    when uvicorn's signal comes (server/exit_signal.py), so the poll is answered with GOODBYE 9 at
    once, the WebSocket client gets GOODBYE 9 too, and the process exits within a second or
    two."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "uvicorn", "tests.workers_app:app", "--host", "127.0.0.1"],
        *["--port", str(port), "--log-level", "warning", "--ws-per-message-deflate", "false"],
        stdin=subprocess.DEVNULL,
    )
    client = Client(base + "/rubris", reconnect=False)
    http = httpx.AsyncClient(base_url=base + "/rubris", timeout=30)
    try:
        for _ in range(300):
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get("/client.js")).status_code == 200:
                    break
            await asyncio.sleep(0.1)
        await client.connect()
        await client.subscribe("ticks")
        waiting = await lp_hello(http, Subscribe(1, "ticks", 0, 0, b""))
        ack, _ = await lp_poll_all(http, waiting.session, 0)  # the SUBSCRIBED
        poll = asyncio.create_task(http.get(f"/lp/{waiting.session}", params={"ack": ack}))
        await asyncio.sleep(0.3)  # the poll waits on the server (poll_timeout 25 s)
        assert not poll.done()

        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        r = await asyncio.wait_for(poll, 5)
        assert r.status_code == 200, (r.status_code, r.text)
        bye = decode_frame(r.content)[-1]
        assert isinstance(bye, Goodbye) and bye.code == 9
        await until(lambda: client.stats.goodbye is not None, timeout=5)
        assert client.stats.goodbye[0] == 9  # type: ignore[index]
        await asyncio.wait_for(proc.wait(), 10)
        took = time.monotonic() - started
        assert took < 5, f"uvicorn took {took:.1f} s to stop"
    finally:
        await client.close()
        await http.aclose()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
