"""What keeps a client from holding or misusing the server at the HTTP level.

- the API refuses a stranger before a single byte of its body is read (token, or the hook's
  ``"$api"`` question), counted at the ASGI ``receive`` itself;
- a browser page of another site is refused (CSRF), whatever cookie it brings;
- a body rubris reads (the API, long-poll POSTs) must come whole within ``body_timeout``: 408;
- under uvicorn as ``serve()`` runs it, a request's head must come within ``header_timeout``
  and an idle kept-alive connection is closed after ``idle_timeout``; requests and WebSockets
  still work;
- what rubris serves carries nosniff and a Content-Security-Policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

import httpx
import orjson
import pytest
from starlette.requests import Request

from rubris_asgi import Config, Rubris, Session, Timing
from rubris_asgi.batches import MemoryBatchStore
from rubris_asgi.errors import UnknownBatch
from rubris_asgi.ops.page import PAGE_CSP
from rubris_asgi.protocol import Hello, Ping, Pong, encode_frame
from rubris_asgi.server.hardening import DATA_CSP, SCRIPT_CSP
from rubris_asgi.serving import DEADLINE_PROTOCOLS, Deadlines, HeadDeadline, uvicorn_config

from .apps import starlette_app
from .server import run_server
from .wirekit import lp_hello, recv_until, ws_hello, ws_open

pytestmark = pytest.mark.core

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SLACK = 1.0
"""Seconds a deadline may be late on a busy test machine."""


def make(timing: Timing | None = None, **kwargs: Any) -> Rubris:
    timing = timing or Timing(poll_timeout=1.0, session_timeout=5.0)
    kwargs.setdefault("batches", MemoryBatchStore())
    rubris = Rubris(Config(timing=timing), **kwargs)

    @rubris.shared("prices.{symbol}", ring=64)
    async def prices(session: Session, symbol: str) -> None:
        return None

    @rubris.queue("work")
    async def work(session: Session) -> None:
        return None

    return rubris


def cookie_hook(request: Request, name: str) -> bool:
    """Whoever brings the session cookie may do anything: what a browser app would trust."""
    return request.cookies.get("sid") == "alice"


def published(rubris: Rubris) -> int:
    return rubris.engine.intake.count + sum(t.seq for t in rubris.engine.topics.values())


# ------------------------------------------------------------ authorised before the body


class CountingReceive:
    """An ASGI ``receive`` that hands out ``body`` in chunks and counts what it handed out."""

    def __init__(self, body: bytes, chunk: int = 4096) -> None:
        self.chunks = [body[i : i + chunk] for i in range(0, len(body), chunk)] or [b""]
        self.handed = 0

    async def __call__(self) -> dict[str, Any]:
        if not self.chunks:
            await asyncio.sleep(3600)  # the client would send nothing more
        chunk = self.chunks.pop(0)
        self.handed += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": bool(self.chunks)}


async def asgi(
    app: Any, method: str, path: str, headers: dict[str, str], receive: Any
) -> tuple[int, dict[str, str], Any]:
    """One request straight through the ASGI app: (status, headers, JSON body)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 1234),
        "server": ("t", 80),
    }
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await asyncio.wait_for(app(scope, receive, send), 5)
    start = sent[0]
    answer = {k.decode(): v.decode() for k, v in start["headers"]}
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], answer, orjson.loads(body)


BIG = 16 * 1024 * 1024 + 1
NDJSON_LINE = b'{"topic": "prices.A", "data": 1}\n'


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/api/publish", "application/x-ndjson"),
        ("/api/enqueue", "application/json"),
        ("/api/batches/ack", "application/json"),
        ("/api/batches", "application/json"),
    ],
)
async def test_the_hook_refuses_a_stranger_before_a_byte_of_the_body(
    path: str, content_type: str
) -> None:
    rubris = make(authorize_api=cookie_hook)
    async with rubris:
        # over the body limit and declared so: still 403, not 413, and nothing read
        receive = CountingReceive(NDJSON_LINE * 8)
        headers = {"host": "t", "content-type": content_type, "content-length": str(BIG)}
        status, answer, body = await asgi(rubris, "POST", path, headers, receive)
        assert (status, body["error"]) == (403, "not allowed to use the API")
        assert answer["x-content-type-options"] == "nosniff"
        assert receive.handed == 0
        # a body of no declared length (chunked), as it would be dribbled: the same
        receive = CountingReceive(NDJSON_LINE * 8, chunk=1)
        headers = {"host": "t", "content-type": content_type, "transfer-encoding": "chunked"}
        status, _answer, _body = await asgi(rubris, "POST", path, headers, receive)
        assert status == 403 and receive.handed == 0
        assert published(rubris) == 0


async def test_the_token_refuses_before_a_byte_of_the_body() -> None:
    for kwargs in ({"api_token": TOKEN}, {"api_token": TOKEN, "authorize_api": cookie_hook}):
        rubris = make(**kwargs)
        async with rubris:
            receive = CountingReceive(NDJSON_LINE * 8)
            headers = {"host": "t", "content-type": "application/x-ndjson"}
            status, answer, _body = await asgi(rubris, "POST", "/api/publish", headers, receive)
            assert status == 401 and answer["www-authenticate"] == "Bearer"
            assert receive.handed == 0
            if "authorize_api" in kwargs:  # the token is good, the hook refuses the caller
                receive = CountingReceive(NDJSON_LINE * 8)
                status, _a, _b = await asgi(
                    rubris, "POST", "/api/publish", {**headers, **AUTH}, receive
                )
                assert status == 403 and receive.handed == 0


async def test_a_caller_the_hook_lets_in_is_read_and_asked_per_topic() -> None:
    asked: list[str] = []

    def hook(request: Request, name: str) -> bool:
        asked.append(name)
        return cookie_hook(request, name)

    rubris = make(authorize_api=hook)
    async with rubris:
        receive = CountingReceive(NDJSON_LINE * 3)
        headers = {"host": "t", "content-type": "application/x-ndjson", "cookie": "sid=alice"}
        status, _answer, body = await asgi(rubris, "POST", "/api/publish", headers, receive)
        assert status == 200 and body["accepted"] == 3
        assert receive.handed == len(NDJSON_LINE) * 3
        assert asked == ["$api", "prices.A"]


async def test_a_stranger_dribbling_a_large_body_is_refused_at_once() -> None:
    """On a real server: the 403 comes before the body, which would take 50 s."""
    rubris = make(authorize_api=cookie_hook)
    async with run_server(starlette_app(rubris)) as base:
        head = (
            b"POST /rubris/api/publish HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/x-ndjson\r\nContent-Length: 20000000\r\n\r\n"
        )
        body = NDJSON_LINE * 1000
        took, answer = await dribble(port_of(base), head, body, every=0.05, to_close=False)
        assert answer.startswith(b"HTTP/1.1 403 ")
        assert took < SLACK
        assert b'"not allowed to use the API"' in answer
    assert published(rubris) == 0


# ------------------------------------------------------------ CSRF: the Origin of a page


@pytest.fixture
async def cookie_api() -> AsyncIterator[tuple[Rubris, httpx.AsyncClient]]:
    rubris = make(authorize_api=cookie_hook, allowed_origins=["https://app.example"])
    async with rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://t", cookies={"sid": "alice"}
        ) as http:
            yield rubris, http


async def test_a_cross_site_simple_request_is_refused(
    cookie_api: tuple[Rubris, httpx.AsyncClient],
) -> None:
    rubris, http = cookie_api
    await rubris.batches.open("b1")
    for origin in ("https://evil.example", "null", "https://app.example.evil", "http://t:81"):
        # what a form or a no-cors fetch of another site can send: no preflight
        evil = {"origin": origin, "content-type": "text/plain"}
        requests = [
            http.post("/api/publish", content=NDJSON_LINE, headers=evil),
            http.post("/api/enqueue", content=b'{"topic": "work", "data": 1}', headers=evil),
            http.post("/api/batches", content=b'{"batch": "opened"}', headers=evil),
            http.post("/api/batches/b1/seal", headers=evil),
            http.post("/api/batches/b1/items", content=b'{"count": 5}', headers=evil),
            http.get("/api/topics/prices.A", headers={"origin": origin}),
            http.get("/api/batches/b1", headers={"origin": origin}),
        ]
        for request in requests:
            r = await request
            assert r.status_code == 403, (origin, r.request.url)
            assert r.json()["error"] == "origin not allowed"
            assert r.headers["x-content-type-options"] == "nosniff"
    assert published(rubris) == 0
    assert rubris.engine.queues == {} or rubris.queue_stats("work").enqueued == 0
    with pytest.raises(UnknownBatch):
        await rubris.batches.status("opened")
    status = await rubris.batches.status("b1")
    assert (status.state, status.total) == ("open", 0)


async def test_same_origin_allowed_and_non_browser_requests_still_work(
    cookie_api: tuple[Rubris, httpx.AsyncClient],
) -> None:
    rubris, http = cookie_api
    ndjson = {"content-type": "application/x-ndjson"}
    for extra in ({}, {"origin": "http://t"}, {"origin": "https://app.example"}):
        r = await http.post("/api/publish", content=NDJSON_LINE, headers={**ndjson, **extra})
        assert r.status_code == 200, extra
        r = await http.post("/api/batches", json={}, headers=extra)
        assert r.status_code == 201, extra
        r = await http.get("/api/topics/prices.A", headers=extra)
        assert r.status_code == 200, extra
    await asyncio.sleep(0.05)
    assert published(rubris) == 3


async def test_any_origin_under_star_but_never_null() -> None:
    rubris = make(api_token=TOKEN, allowed_origins=["*"])
    async with rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            r = await http.get("/api/topics/prices.A", headers={**AUTH, "origin": "https://x.y"})
            assert r.status_code == 200
            r = await http.get("/api/topics/prices.A", headers={**AUTH, "origin": "null"})
            assert r.status_code == 403


async def test_the_origin_is_checked_before_the_token() -> None:
    rubris = make(api_token=TOKEN)
    async with rubris:
        receive = CountingReceive(NDJSON_LINE)
        headers = {"host": "t", "origin": "https://evil.example", "content-type": "text/plain"}
        status, _answer, body = await asgi(rubris, "POST", "/api/publish", headers, receive)
        assert (status, body["error"], receive.handed) == (403, "origin not allowed", 0)


# ------------------------------------------------------------ body timeouts


async def dribble(
    port: int, head: bytes, body: bytes, every: float, *, to_close: bool = True
) -> tuple[float, bytes]:
    """Send ``head`` at once, then ``body`` a byte every ``every`` seconds, while reading the
    answer (until the server closes, with ``to_close``; else its first bytes): (seconds from
    the head to the answer's first bytes, the answer)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    start = time.monotonic()

    async def drip() -> None:
        with contextlib.suppress(OSError):
            for i in range(len(body)):
                await asyncio.sleep(every)
                writer.write(body[i : i + 1])
                await writer.drain()

    dripping = asyncio.create_task(drip())
    try:
        first = await asyncio.wait_for(reader.read(65536), 10)
        took = time.monotonic() - start
        rest = b""
        if to_close:
            rest = await asyncio.wait_for(_to_close(reader), 10)
    finally:
        dripping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await dripping
        writer.close()
    return took, first + rest


async def _to_close(reader: asyncio.StreamReader) -> bytes:
    """What comes until the server closes (a write of ours may have met the close first)."""
    with contextlib.suppress(ConnectionError):
        return await reader.read()
    return b""


def port_of(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


SLOW = Timing(body_timeout=0.5, poll_timeout=1.0, session_timeout=5.0)


async def test_an_api_body_too_slow_gets_408_and_nothing_is_taken() -> None:
    rubris = make(SLOW, api_token=TOKEN)
    async with run_server(starlette_app(rubris)) as base:
        body = NDJSON_LINE * 3
        head = (
            b"POST /rubris/api/publish HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t0ken\r\n"
            b"Content-Type: application/x-ndjson\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        took, answer = await dribble(port_of(base), head, body, every=0.1)
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert 0.4 < took < 0.5 + SLACK
        assert b'"request body not received within 0.5 s"' in answer
        assert b"connection: close" in answer.lower()  # and it was closed: read() ended
    assert published(rubris) == 0


async def test_a_long_poll_body_too_slow_gets_408() -> None:
    rubris = make(SLOW)
    async with run_server(starlette_app(rubris)) as base:
        frame = encode_frame([Hello(1, "")])
        async with httpx.AsyncClient(base_url=base + "/rubris", timeout=10) as c:
            w = await lp_hello(c)  # a whole body in time is taken
        for path in (b"/rubris/lp", b"/rubris/lp/" + w.session.encode()):
            head = b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (
                path,
                len(frame) + 10,
            )
            took, answer = await dribble(port_of(base), head, frame + b"\0" * 10, every=0.1)
            assert answer.startswith(b"HTTP/1.1 408 "), answer
            assert 0.4 < took < 0.5 + SLACK
            assert answer.endswith(b"request body not received within 0.5 s (code 1)")
        assert len(rubris.engine.sessions) == 1  # the slow HELLO opened nothing


# ------------------------------------------------------------ uvicorn as serve() runs it

DEADLINE = 0.3
FAST = Timing(header_timeout=DEADLINE, idle_timeout=DEADLINE, poll_timeout=0.6, session_timeout=5.0)


@contextlib.asynccontextmanager
async def served(rubris: Rubris, http: str) -> AsyncIterator[int]:
    """``rubris`` under uvicorn as ``serve()`` configures it (``http``: the parser); the port."""
    async with run_server(starlette_app(rubris), drain=rubris, http=http) as base:
        yield int(base.rsplit(":", 1)[1])


async def closed_after(reader: asyncio.StreamReader, start: float) -> float:
    """Read to the server's close (within 10 s); the seconds since ``start``."""
    await asyncio.wait_for(_to_close(reader), 10)
    return time.monotonic() - start


def closed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """The server closed: an end of stream read, or a write of ours refused (a reset)."""
    return reader.at_eof() or writer.transport.is_closing()


async def answer_head(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)


PARSERS = sorted(DEADLINE_PROTOCOLS.keys() - {"auto"})


@pytest.mark.parametrize("http", PARSERS)
async def test_a_connection_that_sends_no_head_in_time_is_closed(http: str) -> None:
    rubris = make(FAST, api_token=TOKEN)
    async with served(rubris, http) as port:
        # nothing at all
        start = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert DEADLINE - 0.1 < await closed_after(reader, start) < DEADLINE + SLACK
        writer.close()
        # a header byte every 0.1 s: each byte in time, the head not
        head = b"GET /rubris/client.js HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
        took, answer = await dribble(port, b"", head, every=0.1)
        assert answer == b"" and DEADLINE - 0.1 < took < DEADLINE + SLACK


@pytest.mark.parametrize("http", PARSERS)
async def test_a_kept_alive_connection_idle_or_slow_on_its_next_head_is_closed(
    http: str,
) -> None:
    rubris = make(FAST, api_token=TOKEN)
    async with served(rubris, http) as port:
        request = b"HEAD /rubris/client.js HTTP/1.1\r\nHost: x\r\n\r\n"
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        assert (await answer_head(reader)).startswith(b"HTTP/1.1 200 ")
        start = time.monotonic()
        assert DEADLINE - 0.1 < await closed_after(reader, start) < DEADLINE + SLACK  # idle
        writer.close()
        # kept alive, then the next request's head dribbled: its own head deadline
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        assert (await answer_head(reader)).startswith(b"HTTP/1.1 200 ")
        start = time.monotonic()
        for byte in request[:30]:  # a byte every 0.1 s: the deadline runs from the first
            await asyncio.sleep(0.1)
            if closed(reader, writer):
                break
            writer.write(bytes([byte]))
        assert 0.1 + DEADLINE - 0.1 < await closed_after(reader, start) < 0.1 + DEADLINE + SLACK
        writer.close()


@pytest.mark.parametrize("http", PARSERS)
async def test_a_refused_body_dribbled_on_does_not_keep_the_connection(http: str) -> None:
    """The rest of a body the answer came before is discarded as it comes, no longer than a
    head may take."""
    rubris = make(FAST, authorize_api=cookie_hook)
    async with served(rubris, http) as port:
        head = (
            b"POST /rubris/api/publish HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/x-ndjson\r\nContent-Length: 20000000\r\n\r\n"
        )
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head)
        assert (await answer_head(reader)).startswith(b"HTTP/1.1 403 ")
        start = time.monotonic()
        for _ in range(30):
            await asyncio.sleep(0.1)
            if closed(reader, writer):
                break
            writer.write(NDJSON_LINE[:1])
        assert await closed_after(reader, start) < 0.1 + DEADLINE + SLACK
        writer.close()


@pytest.mark.slow  # seconds of timeouts waited out: the full suite's, not the inner loop's
@pytest.mark.parametrize("http", PARSERS)
async def test_requests_and_websockets_outlive_the_head_deadline(http: str) -> None:
    rubris = make(FAST, api_token=TOKEN)
    async with served(rubris, http) as port:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base + "/rubris", timeout=10) as c:
            r = await c.get("/client.js")
            assert r.status_code == 200
            w = await lp_hello(c)
            # a poll that waits 0.6 s, past the head deadline: its head came in time
            r = await c.get(f"/lp/{w.session}", params={"ack": 0})
            assert r.status_code in (200, 204)
            r = await c.post("/api/publish", json={"topic": "prices.A", "data": 1}, headers=AUTH)
            assert r.status_code == 200
        async with await ws_open(base) as ws:
            await ws_hello(ws)
            await asyncio.sleep(DEADLINE + 0.3)  # well past the head deadline
            await ws.send(encode_frame([Ping(7)]))
            pong = await recv_until(ws, lambda m: isinstance(m, Pong))
            assert isinstance(pong, Pong) and pong.token == 7


def test_serve_sets_the_timeouts_unless_the_caller_chose() -> None:
    rubris = make(Timing(idle_timeout=3.0, header_timeout=4.0))
    config = uvicorn_config("mod:app", rubris)
    assert config.timeout_keep_alive == 3.0 and config.ws_per_message_deflate is False
    assert isinstance(config.http, type) and issubclass(config.http, HeadDeadline)
    for http, protocol in DEADLINE_PROTOCOLS.items():  # "auto", "h11", "httptools"
        assert uvicorn_config("mod:app", rubris, http=http).http is protocol
    config = uvicorn_config("mod:app", rubris, timeout_keep_alive=60, http="zttp")
    assert (config.timeout_keep_alive, config.http) == (60, "zttp")
    # workers: the config crosses to each worker by pickle, deadlines and protocol with it
    again = pickle.loads(pickle.dumps(uvicorn_config("mod:app")))
    assert again.http is DEADLINE_PROTOCOLS["auto"]
    assert again.rubris_deadlines == Deadlines()  # a worker reads its own Rubris's, once started


# ------------------------------------------------------------ security headers


def security(r: httpx.Response) -> tuple[str, str]:
    return r.headers["x-content-type-options"], r.headers["content-security-policy"]


async def test_what_rubris_serves_says_what_it_is() -> None:
    rubris = make(api_token=TOKEN, ops=True)
    async with rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            for path in ("/client.js", "/client/session.js"):
                r = await http.get(path)
                assert r.status_code == 200 and security(r) == ("nosniff", SCRIPT_CSP)
            r = await http.get("/client/nothing.js")
            assert r.status_code == 404 and security(r) == ("nosniff", DATA_CSP)
            answers: Iterable[httpx.Response] = [
                await http.post(
                    "/api/publish", json={"topic": "prices.A", "data": 1}, headers=AUTH
                ),
                await http.post("/api/publish", json={"topic": "nope", "data": 1}, headers=AUTH),
                await http.post("/api/publish", json={}),
                await http.get("/api/topics/prices.A", headers=AUTH),
                await http.post("/api/batches", headers=AUTH),
                await http.get("/api/batches/nope", headers=AUTH),
                await http.get("/ops/stats", headers=AUTH),
                await http.get("/ops/stats"),
            ]
            for r in answers:
                assert r.headers["content-type"] == "application/json", r.request.url
                assert security(r) == ("nosniff", DATA_CSP), r.request.url
            page = await http.get("/ops", headers=AUTH)
            assert page.status_code == 200 and security(page) == ("nosniff", PAGE_CSP)
            assert "'unsafe-inline'" not in PAGE_CSP.split("script-src")[1].split(";")[0]
            r = await http.get("/ops/ops.js", headers=AUTH)
            assert r.status_code == 200 and security(r) == ("nosniff", SCRIPT_CSP)
