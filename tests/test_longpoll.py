"""The long-poll transport at the HTTP level, against a real uvicorn."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest

from rubris_asgi import Limits, Timing
from rubris_asgi.protocol import (
    Call,
    Hello,
    Ping,
    Pong,
    Push,
    Result,
    Subscribe,
    Subscribed,
    Welcome,
    decode_frame,
    encode_frame,
)

from .apps import make_rubris, starlette_app
from .server import run_server


async def hello(c: httpx.AsyncClient, *extra: object, resume: str = "") -> Welcome:
    r = await c.post("/lp", content=encode_frame([Hello(1, resume), *extra]))  # type: ignore[list-item]
    assert r.status_code == 200, r.text
    w = decode_frame(r.content)[0]
    assert isinstance(w, Welcome)
    return w


async def test_poll_numbering_ack_and_resend_of_a_lost_response() -> None:
    rubris = make_rubris()
    async with run_server(starlette_app(rubris)) as base:
        async with httpx.AsyncClient(base_url=base + "/rubris", timeout=10) as c:
            w = await hello(c, Subscribe(1, "snap.a", 0, 0, b""))
            r = await c.get(f"/lp/{w.session}", params={"ack": 0})
            assert r.status_code == 200 and r.headers["Rubris-Frame"] == "1"
            first = r.content
            msgs = decode_frame(first)
            assert isinstance(msgs[0], Subscribed) and isinstance(msgs[1], Push)
            # the response "was lost": polling with the old ack gets the very same frame
            r = await c.get(f"/lp/{w.session}", params={"ack": 0})
            assert r.status_code == 200 and r.headers["Rubris-Frame"] == "1"
            assert r.content == first
            rubris.publish("snap.a", {"n": 2})
            r = await c.get(f"/lp/{w.session}", params={"ack": 1})
            assert r.headers["Rubris-Frame"] == "2"
            assert [m.payload for m in decode_frame(r.content)] == [b'{"n":2}']  # type: ignore[union-attr]
            r = await c.get(f"/lp/{w.session}", params={"ack": 7})
            assert r.status_code == 400


async def test_poll_times_out_with_204_then_gets_data() -> None:
    rubris = make_rubris(timing=Timing(poll_timeout=0.3, session_timeout=5.0))
    async with run_server(starlette_app(rubris)) as base:
        async with httpx.AsyncClient(base_url=base + "/rubris", timeout=10) as c:
            w = await hello(c)
            r = await c.get(f"/lp/{w.session}", params={"ack": 0})
            assert r.status_code == 204
            r = await c.post(f"/lp/{w.session}", content=encode_frame([Ping(4)]))
            assert r.status_code == 202
            r = await c.get(f"/lp/{w.session}", params={"ack": 0})
            assert decode_frame(r.content) == [Pong(4)]


async def test_newer_poll_supersedes_older_with_409() -> None:
    rubris = make_rubris(timing=Timing(poll_timeout=3, session_timeout=5.0))
    async with run_server(starlette_app(rubris)) as base:
        async with httpx.AsyncClient(base_url=base + "/rubris", timeout=10) as c:
            w = await hello(c)
            first = asyncio.create_task(c.get(f"/lp/{w.session}", params={"ack": 0}))
            await asyncio.sleep(0.2)
            second = asyncio.create_task(c.get(f"/lp/{w.session}", params={"ack": 0}))
            r1 = await first
            assert r1.status_code == 409
            await c.post(f"/lp/{w.session}", content=encode_frame([Ping(1)]))
            r2 = await second
            assert r2.status_code == 200


async def test_rpc_results_and_errors_over_long_poll() -> None:
    rubris = make_rubris()
    async with run_server(starlette_app(rubris)) as base:
        async with httpx.AsyncClient(base_url=base + "/rubris", timeout=10) as c:
            w = await hello(
                c,
                Call(1, "echo", orjson.dumps({"x": 1})),
                Call(2, "fail", b""),
                Call(3, "nope", b""),
            )
            got: dict[int, Result] = {}
            ack = 0
            while len(got) < 3:
                r = await c.get(f"/lp/{w.session}", params={"ack": ack})
                if r.status_code == 200:
                    ack = int(r.headers["Rubris-Frame"])
                    for m in decode_frame(r.content):
                        if isinstance(m, Result):
                            got[m.call] = m
            assert got[1].status == 0 and orjson.loads(got[1].payload) == {"x": 1}
            assert got[2].status == 1 and orjson.loads(got[2].payload) == {
                "code": 10,
                "message": "no such thing",
            }
            assert orjson.loads(got[3].payload)["code"] == 3


async def test_errors_are_plain_http() -> None:
    rubris = make_rubris(limits=Limits(max_inbound_frame=1024))
    async with run_server(starlette_app(rubris)) as base:
        async with httpx.AsyncClient(base_url=base + "/rubris", timeout=10) as c:
            r = await c.post("/lp", content=b"\x21\x05\x01")
            assert r.status_code == 400 and "HELLO" in r.text
            r = await c.post("/lp", content=encode_frame([Ping(1)]))
            assert r.status_code == 400 and "first message must be HELLO" in r.text
            r = await c.post("/lp", content=b"\x00" * 2048)
            assert r.status_code == 413
            r = await c.get("/lp/does-not-exist", params={"ack": 0})
            assert r.status_code == 404
            w = await hello(c)
            r = await c.post(f"/lp/{w.session}", content=b"\x22\xff")
            assert r.status_code == 400
            r = await c.get(f"/lp/{w.session}", params={"ack": "x"})
            assert r.status_code == 400


@pytest.mark.slow  # seconds of timeouts waited out: the full suite's, not the inner loop's
async def test_session_ends_after_the_session_timeout_without_polls() -> None:
    rubris = make_rubris(timing=Timing(poll_timeout=0.2, session_timeout=0.5))
    async with run_server(starlette_app(rubris)) as base:
        async with httpx.AsyncClient(base_url=base + "/rubris", timeout=10) as c:
            w = await hello(c)
            assert w.session in rubris.engine.sessions
            await asyncio.sleep(1.3)
            assert w.session not in rubris.engine.sessions
            r = await c.get(f"/lp/{w.session}", params={"ack": 0})
            assert r.status_code == 404
