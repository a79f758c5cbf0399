"""Bad input from the wire: random and half-valid frames over a raw WebSocket and long-poll POSTs.

The server must never crash (no ERROR logged, no 5xx), must answer a malformed frame with code 1
(GOODBYE 1 + close 1002 on WebSocket, HTTP 400 on long-poll; 2 for a wrong version, 5 / 1009 /
413 for an oversized frame), must not leak a session, connection or task, and a well-behaved
client on the same server carries on.

Hypothesis drives synchronous clients from a worker thread while the server runs in the test's
event loop, so every example talks to the same live server over real sockets.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as sync_connect

from rubris_asgi import Limits, Rubris, Timing
from rubris_asgi.client import Client
from rubris_asgi.protocol import (
    Call,
    Goodbye,
    Hello,
    Message,
    Ping,
    Pong,
    Subscribe,
    Welcome,
    decode_frame,
    encode_frame,
    encode_str,
    encode_uv,
)

from .apps import make_rubris, starlette_app
from .server import run_server
from .wirekit import expect_goodbye_and_close, recv_until, until, ws_hello, ws_open, ws_url

MAX_FRAME = 8 * 1024
SESSION_TIMEOUT = 0.5
# what a bad frame may get: protocol error, unsupported version, too large
WS_CODES = {1: 1002, 2: 1002, 5: 1009}
LP_BAD = {400, 413}


def fuzz_rubris() -> Rubris:
    return make_rubris(
        limits=Limits(max_inbound_frame=MAX_FRAME),
        timing=Timing(session_timeout=SESSION_TIMEOUT, poll_timeout=0.3, shutdown_drain=1.0),
    )


class Errors(logging.Handler):
    """Collects every ERROR (or worse) logged while fuzzing: a crash would show here."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


# ------------------------------------------------------------------ strategies

CLIENT_KINDS = list(range(0x21, 0x2A))
SERVER_KINDS = list(range(0x01, 0x0C))
NAMES = ["snap.a", "ring.b", "inbox", "big", "echo", "whoami", "fail", "", "snap.", "x" * 300]
METHODS = ["echo", "whoami", "fail", "nope", ""]


def message(kind: int, body: bytes) -> bytes:
    return bytes([kind]) + encode_uv(len(body)) + body


uvs = st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1))
texts = st.one_of(st.sampled_from(NAMES), st.text(max_size=20))
payloads = st.one_of(
    st.binary(max_size=40), st.sampled_from([b"", b"{}", b"[1,2]", b'"x"', b"{", b"\xff"])
)


@st.composite
def structured_message(draw: Callable[..., Any]) -> bytes:
    """A message with a plausible kind and fields, often subtly wrong."""
    kind = draw(st.one_of(st.sampled_from(CLIENT_KINDS), st.sampled_from(SERVER_KINDS), uvs))
    kind &= 0xFF
    if draw(st.booleans()) and draw(st.booleans()):
        kind |= 0x80  # COMPRESSED, valid on some kinds only
    fields = draw(
        st.lists(
            st.one_of(
                uvs.map(encode_uv),
                texts.map(encode_str),
                st.sampled_from(METHODS).map(encode_str),
                payloads,
            ),
            max_size=4,
        )
    )
    body = b"".join(fields)
    raw = message(kind, body)
    cut = draw(st.integers(0, len(raw)))
    return raw if draw(st.booleans()) else raw[:cut] or raw  # sometimes truncated


frames = st.one_of(
    st.binary(min_size=1, max_size=64),
    st.lists(structured_message(), min_size=1, max_size=4).map(b"".join),
    st.builds(lambda a, b: a + b, st.just(encode_frame([Hello(1, "")])), st.binary(max_size=32)),
    st.just(b"\x00" * (MAX_FRAME + 1)),
)
first_frames = st.one_of(
    frames,
    st.just(encode_frame([Hello(1, "")])),
    st.builds(lambda v: encode_frame([Hello(v, "")]), uvs),
    st.builds(lambda t: encode_frame([Hello(1, t)]), texts),
    st.just(encode_frame([Ping(1)])),
)
ws_frame = st.one_of(
    frames.map(lambda b: ("bytes", b)), st.text(max_size=16).map(lambda t: ("text", t))
)


# ------------------------------------------------------------------ the synchronous peers


def ws_exchange(url: str, first: bytes, rest: list[tuple[str, Any]]) -> list[Message]:
    """Send the frames; read until the server closes or falls quiet. Returns what came."""
    got: list[Message] = []
    with sync_connect(
        url,
        subprotocols=["rubris.v1"],  # type: ignore[list-item]
        compression=None,
        open_timeout=5,
        close_timeout=1,
    ) as ws:
        try:
            ws.send(first)
            for kind, data in rest:
                ws.send(data if kind == "bytes" else str(data))
        except ConnectionClosed:
            pass  # closed by the server while we were still sending: read what it said
        try:
            while True:
                frame = ws.recv(timeout=0.3)
                assert isinstance(frame, bytes), "the server sent a text frame"
                got.extend(decode_frame(frame))  # the server never sends a malformed frame
        except TimeoutError:
            return got  # quiet: it accepted everything it was sent
        except ConnectionClosed:
            pass
        # the server closed: a GOODBYE with an allowed code came first, then the matching close
        byes = [m for m in got if isinstance(m, Goodbye)]
        assert byes, f"closed without GOODBYE (close {ws.close_code}); got {got}"
        assert isinstance(got[-1], Goodbye), "a message after GOODBYE"
        assert byes[0].code in WS_CODES, byes
        assert ws.close_code == WS_CODES[byes[0].code], (byes, ws.close_code)
        return got


def lp_exchange(http: httpx.Client, first: bytes, rest: list[bytes]) -> None:
    r = http.post("/lp", content=first)
    assert r.status_code in LP_BAD | {200}, (r.status_code, r.text)
    if r.status_code != 200:
        assert (
            ("code 5" in r.text)
            if r.status_code == 413
            else ("code 1" in r.text or "code 2" in r.text)
        )
        return
    w = decode_frame(r.content)[0]
    assert isinstance(w, Welcome)
    for body in rest:
        r = http.post(f"/lp/{w.session}", content=body)
        assert r.status_code in LP_BAD | {202}, (r.status_code, r.text)
    r = http.get(f"/lp/{w.session}", params={"ack": 0})
    assert r.status_code in (200, 204, 404), (r.status_code, r.text)
    if r.status_code == 200:
        decode_frame(r.content)


# ------------------------------------------------------------------ the test


@pytest.mark.slow
async def test_fuzzing_both_transports_leaks_nothing_and_disturbs_nobody() -> None:
    errors = Errors()
    loggers = [logging.getLogger(n) for n in ("rubris_asgi", "uvicorn.error", "uvicorn")]
    for lg in loggers:
        lg.addHandler(errors)
    rubris = fuzz_rubris()
    try:
        async with run_server(starlette_app(rubris)) as base:
            async with Client(base + "/rubris") as good:
                sub = await good.subscribe("ring.good")
                loop = asyncio.get_running_loop()
                tasks_before = {t for t in asyncio.all_tasks() if not t.done()}
                url = ws_url(base)
                ended_late: list[str] = []

                @settings(
                    max_examples=60,
                    deadline=None,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                )
                @given(
                    transport=st.sampled_from(["ws", "lp"]),
                    first=first_frames,
                    rest=st.lists(ws_frame, max_size=3),
                )
                def fuzz(transport: str, first: bytes, rest: list[tuple[str, Any]]) -> None:
                    if transport == "ws":
                        got = ws_exchange(url, first, rest)
                        welcome = next((m for m in got if isinstance(m, Welcome)), None)
                        if welcome is not None and isinstance(got[-1], Goodbye):
                            # GOODBYE ended the session at once: it is not left to time out
                            deadline = time.monotonic() + SESSION_TIMEOUT / 2
                            while welcome.session in rubris.engine.sessions:
                                if time.monotonic() > deadline:
                                    ended_late.append(welcome.session)
                                    break
                                time.sleep(0.01)
                    else:
                        with httpx.Client(base_url=base + "/rubris", timeout=5) as http:
                            lp_exchange(http, first, [d for k, d in rest if k == "bytes"])

                started = time.monotonic()
                await asyncio.to_thread(fuzz)
                assert time.monotonic() - started < 25
                assert ended_late == []

                # nothing leaked: every fuzz session ends (WebSocket ones at once after GOODBYE,
                # the rest after the short session timeout), and every task and connection goes
                good_id = good.session_id
                await until(lambda: set(rubris.engine.sessions) == {good_id}, timeout=5)
                await until(lambda: len(rubris.websocket.connections) == 1, timeout=5)
                assert set(rubris.longpoll.sessions) == set()
                assert rubris.dispatcher.tasks == set()
                await until(
                    lambda: {t for t in asyncio.all_tasks() if not t.done()} <= tasks_before,
                    timeout=5,
                )
                pool = rubris.stats().pool
                assert pool.in_use_block + pool.in_use_large + pool.in_use_unpooled == 0

                # and the well-behaved client carried on throughout
                n = rubris.publish("ring.good", {"after": "fuzz"})
                value, info = await sub.get(timeout=5)
                assert value == {"after": "fuzz"} and info.seq == n
                assert await good.call("echo", 1) == 1
                assert good.state == "open" and good.session_id == good_id
                del loop
    finally:
        for lg in loggers:
            lg.removeHandler(errors)
    assert [r.getMessage() for r in errors.records] == []


# ------------------------------------------------------------------ the named cases

VALID = encode_frame([Hello(1, "")])
BAD_FIRST = [
    pytest.param(b"\x21", 1, id="truncated-header"),
    pytest.param(VALID[:-1], 1, id="truncated-hello"),
    pytest.param(b"\x21\x80", 1, id="unterminated-varint"),
    pytest.param(b"\x21\x81\x00\x01\x00", 1, id="overlong-varint"),
    pytest.param(b"\x21\x03\x01\x01\xff", 1, id="bad-utf8"),
    pytest.param(encode_frame([Subscribe(1, "snap.a", 0, 0, b"")]), 1, id="subscribe-first"),
    pytest.param(encode_frame([Call(1, "echo", b"")]), 1, id="call-first"),
    pytest.param(b"\xa1\x02\x01\x00", 1, id="compressed-hello"),
    pytest.param(b"\x05\x00", 1, id="server-kind-first"),
    pytest.param(encode_frame([Hello(3, "")]), 2, id="version-3"),
    pytest.param(bytes(MAX_FRAME + 1), 5, id="oversized"),
]


@pytest.mark.parametrize(("first", "code"), BAD_FIRST)
async def test_bad_first_frame_on_both_transports(first: bytes, code: int) -> None:
    rubris = fuzz_rubris()
    async with run_server(starlette_app(rubris)) as base:
        async with await ws_open(base) as ws:
            await ws.send(first)
            await expect_goodbye_and_close(ws, code, WS_CODES[code])
        async with httpx.AsyncClient(base_url=base + "/rubris", timeout=5) as c:
            r = await c.post("/lp", content=first)
            assert r.status_code == (413 if code == 5 else 400), r.text
            assert f"code {code}" in r.text
        assert rubris.engine.sessions == {}


AFTER_HELLO = [
    pytest.param(b"\x28", 1, id="truncated"),
    pytest.param(b"\x28\x05\x01", 1, id="length-past-end"),
    pytest.param(encode_frame([Hello(1, "")]), 1, id="second-hello"),
    pytest.param(b"\x02\x03\x01\x01\x00", 1, id="server-kind"),
    pytest.param(b"\xa8\x01\x01", 1, id="compressed-ping"),
    pytest.param(bytes(MAX_FRAME + 1), 5, id="oversized"),
]


@pytest.mark.parametrize(("frame", "code"), AFTER_HELLO)
async def test_bad_frame_after_hello_on_both_transports(frame: bytes, code: int) -> None:
    rubris = fuzz_rubris()
    async with run_server(starlette_app(rubris)) as base:
        async with await ws_open(base) as ws:
            w = await ws_hello(ws)
            await ws.send(frame)
            await expect_goodbye_and_close(ws, code, WS_CODES[code])
        # GOODBYE ended the session at once: not left to wait for a resume until the timeout
        await until(lambda: w.session not in rubris.engine.sessions, timeout=SESSION_TIMEOUT / 2)
        async with httpx.AsyncClient(base_url=base + "/rubris", timeout=5) as c:
            r = await c.post("/lp", content=encode_frame([Hello(1, "")]))
            lw = decode_frame(r.content)[0]
            assert isinstance(lw, Welcome)
            r = await c.post(f"/lp/{lw.session}", content=frame)
            assert r.status_code == (413 if code == 5 else 400), r.text
            # a bad POST is refused alone: the session still works
            r = await c.post(f"/lp/{lw.session}", content=encode_frame([Ping(4)]))
            assert r.status_code == 202
            r = await c.get(f"/lp/{lw.session}", params={"ack": 0})
            assert decode_frame(r.content) == [Pong(4)]


async def test_text_frame_and_empty_frame() -> None:
    rubris = fuzz_rubris()
    async with run_server(starlette_app(rubris)) as base:
        for first in ("hello", b""):
            async with await ws_open(base) as ws:
                await ws.send(first)
                await expect_goodbye_and_close(ws, 1, 1002)
        async with await ws_open(base) as ws:
            await ws_hello(ws)
            await ws.send("text after hello")
            await expect_goodbye_and_close(ws, 1, 1002)
        async with httpx.AsyncClient(base_url=base + "/rubris", timeout=5) as c:
            r = await c.post("/lp", content=b"")
            assert r.status_code == 400
        await until(lambda: rubris.engine.sessions == {}, timeout=SESSION_TIMEOUT / 2)
        async with await ws_open(base) as ws:
            await ws_hello(ws, Ping(1))
            assert await recv_until(ws, lambda m: isinstance(m, Pong)) == Pong(1)
