"""Every limit answers with its own protocol code (protocol.md section 9) or HTTP status, and
disturbs nothing else: in each test a well-behaved client on the same server keeps working."""

from __future__ import annotations

import asyncio
import contextlib
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
from zlib_ng import zlib_ng

from rubris_asgi import Limits, Rubris, Session
from rubris_asgi.client import Client, Subscription
from rubris_asgi.protocol import (
    Call,
    Hello,
    Ping,
    Pong,
    Rejected,
    Result,
    Subscribe,
    Subscribed,
    encode_frame,
)

from .apps import make_rubris, starlette_app
from .server import run_server
from .wirekit import (
    expect_goodbye_and_close,
    lp_collect,
    lp_hello,
    recv_until,
    until,
    ws_hello,
    ws_open,
)


def bomb(size: int) -> bytes:
    """Raw DEFLATE of ``size`` zero bytes: about a thousandth of that on the wire."""
    c = zlib_ng.compressobj(9, zlib_ng.DEFLATED, -15)
    return c.compress(bytes(size)) + c.flush()


def limited(**limits: Any) -> Rubris:
    rubris = make_rubris(limits=Limits(**limits))
    gate = asyncio.Event()
    rubris.engine.__dict__["test_gate"] = gate

    @rubris.rpc("slow")
    async def slow(session: Session, args: Any) -> Any:
        await gate.wait()
        return args

    return rubris


@contextlib.asynccontextmanager
async def serving(rubris: Rubris) -> AsyncIterator[tuple[str, Good]]:
    """The server and a well-behaved client subscribed to ``ring.ok``."""
    async with run_server(starlette_app(rubris)) as base:
        async with Client(base + "/rubris", reconnect=False) as client:
            yield base, Good(client, await client.subscribe("ring.ok"))


class Good:
    def __init__(self, client: Client, sub: Subscription) -> None:
        self.client = client
        self.sub = sub


async def still_works(rubris: Rubris, good: Good) -> None:
    """The good client receives a publish and gets a call answered."""
    sub = good.sub
    n = rubris.publish("ring.ok", {"still": "here"})
    value, info = await sub.get(timeout=5)
    assert value == {"still": "here"} and info.seq == n
    assert await good.client.call("echo", [1, 2]) == [1, 2]
    assert good.client.state == "open"


def result_code(m: Result) -> int:
    assert m.status == 1, m
    return int(orjson.loads(m.payload)["code"])


# ------------------------------------------------------------------ inbound frame size


async def test_ws_frame_over_the_inbound_limit_gets_goodbye_5_and_close_1009() -> None:
    rubris = limited(max_inbound_frame=4096)
    async with serving(rubris) as (base, good):
        async with await ws_open(base) as ws:
            w = await ws_hello(ws)
            assert w.max_frame == 4096
            await ws.send(encode_frame([Ping(1)]) + b"\x7f" + bytes([0x80, 0x20]) + bytes(4096))
            await expect_goodbye_and_close(ws, 5, 1009)
        # the session ended with its GOODBYE: not left waiting for a resume
        await until(lambda: w.session not in rubris.engine.sessions, timeout=1.0)
        # too large as the very first frame: the same answer, and no session is made
        async with await ws_open(base) as ws:
            await ws.send(bytes(5000))
            await expect_goodbye_and_close(ws, 5, 1009)
        await until(lambda: len(rubris.engine.sessions) == 1, timeout=1.0)
        # exactly at the limit is fine
        async with await ws_open(base) as ws:
            await ws_hello(ws)
            frame = encode_frame([Ping(2)])
            pad = 4096 - len(frame) - 4  # an unknown kind (0x3f) with a 2-byte length: skipped
            await ws.send(frame + b"\x3f" + bytes([0x80 | (pad & 0x7F), pad >> 7]) + bytes(pad))
            assert await recv_until(ws, lambda m: isinstance(m, Pong)) == Pong(2)
        await still_works(rubris, good)


async def test_lp_frame_over_the_inbound_limit_gets_413() -> None:
    rubris = limited(max_inbound_frame=4096)
    async with serving(rubris) as (base, good):
        async with httpx.AsyncClient(base_url=base + "/rubris", timeout=10) as c:
            r = await c.post("/lp", content=bytes(5000))
            assert r.status_code == 413 and "code 5" in r.text
            w = await lp_hello(c)
            r = await c.post(f"/lp/{w.session}", content=bytes(5000))
            assert r.status_code == 413

            # a chunked body has no Content-Length: it is cut off while it streams in
            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(10):
                    yield bytes(1000)

            r = await c.post(f"/lp/{w.session}", content=chunks())
            assert r.status_code == 413
            # the session itself is fine
            r = await c.post(f"/lp/{w.session}", content=encode_frame([Ping(3)]))
            assert r.status_code == 202
            assert await lp_collect(c, w.session, lambda m: isinstance(m, Pong)) == Pong(3)
        await still_works(rubris, good)


# ------------------------------------------------------------------ inflated size


async def test_deflate_bomb_is_refused_with_code_5_without_inflating_it() -> None:
    rubris = limited(max_inflated=64 * 1024)
    payload = bomb(64 * 1024 * 1024)  # 64 MiB of zeros in ~64 KB
    assert len(payload) < 200 * 1024
    async with serving(rubris) as (base, good):
        async with await ws_open(base, max_size=None) as ws:
            await ws_hello(ws)
            tracemalloc.start()
            try:
                tracemalloc.reset_peak()
                await ws.send(
                    encode_frame(
                        [
                            Call(1, "echo", payload, compressed=True),
                            Subscribe(2, "snap.a", 0, 0, payload, compressed=True),
                        ]
                    )
                )
                res = await recv_until(ws, lambda m: isinstance(m, Result))
                rej = await recv_until(ws, lambda m: isinstance(m, Rejected))
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert isinstance(res, Result) and res.call == 1 and result_code(res) == 5
            assert isinstance(rej, Rejected) and rej.req == 2 and rej.code == 5
            assert peak < 8 * 1024 * 1024, f"{peak} bytes allocated for a refused bomb"
            # just under the limit inflates and works; the session is intact
            ok = zlib_ng.compress(orjson.dumps("x" * 60_000), 1, -15)
            await ws.send(encode_frame([Call(3, "echo", ok, compressed=True)]))
            res = await recv_until(ws, lambda m: isinstance(m, Result))
            assert isinstance(res, Result) and res.status == 0
        async with httpx.AsyncClient(base_url=base + "/rubris", timeout=10) as c:
            w = await lp_hello(c, Call(1, "echo", payload, compressed=True))
            res = await lp_collect(c, w.session, lambda m: isinstance(m, Result))
            assert isinstance(res, Result) and result_code(res) == 5
        await still_works(rubris, good)


# ------------------------------------------------------------------ subscriptions per session


async def test_subscriptions_per_session_rejected_with_6() -> None:
    rubris = limited(max_subscriptions=3)
    async with serving(rubris) as (base, good):
        async with await ws_open(base) as ws:
            await ws_hello(ws)
            subs = [Subscribe(i, f"snap.s{i}", 0, 0, b"") for i in range(1, 5)]
            await ws.send(encode_frame(subs))
            rej = await recv_until(ws, lambda m: isinstance(m, Rejected))
            assert isinstance(rej, Rejected) and (rej.req, rej.code) == (4, 6)
            # subscribing again to a topic it holds is not a new subscription
            await ws.send(encode_frame([Subscribe(5, "snap.s1", 0, 0, b"")]))
            again = await recv_until(ws, lambda m: isinstance(m, (Subscribed, Rejected)))
            assert isinstance(again, Subscribed) and again.req == 5
            # nor is the limit per server: another session has its own three
        await still_works(rubris, good)
        assert await good.client.subscribe("snap.g1") and await good.client.subscribe("snap.g2")


# ------------------------------------------------------------------ sessions in total


async def test_sessions_in_total_goodbye_6_close_1013_and_lp_503() -> None:
    rubris = limited(max_sessions=2)  # the good client holds one
    async with serving(rubris) as (base, good):
        async with await ws_open(base) as second:
            await ws_hello(second)
            async with await ws_open(base) as third:
                await third.send(encode_frame([Hello(1, "")]))
                await expect_goodbye_and_close(third, 6, 1013)
            async with httpx.AsyncClient(base_url=base + "/rubris", timeout=10) as c:
                r = await c.post("/lp", content=encode_frame([Hello(1, "")]))
                assert r.status_code == 503 and "code 6" in r.text
            assert len(rubris.engine.sessions) == 2
            await second.send(encode_frame([Ping(5)]))
            assert await recv_until(second, lambda m: isinstance(m, Pong)) == Pong(5)
        await still_works(rubris, good)


# ------------------------------------------------------------------ topic-name length


async def test_topic_and_method_name_length_refused_with_5() -> None:
    rubris = limited(max_topic_name=16)
    async with serving(rubris) as (base, good):
        async with await ws_open(base) as ws:
            await ws_hello(ws)
            long = "snap." + "x" * 12  # 17 bytes
            await ws.send(
                encode_frame(
                    [
                        Subscribe(1, long, 0, 0, b""),
                        Subscribe(2, "snap." + "x" * 11, 0, 0, b""),  # 16 bytes: fine
                        Call(3, "e" * 17, b""),
                    ]
                )
            )
            rej = await recv_until(ws, lambda m: isinstance(m, (Rejected, Subscribed)))
            assert isinstance(rej, Rejected) and (rej.req, rej.code) == (1, 5)
            ok = await recv_until(ws, lambda m: isinstance(m, (Rejected, Subscribed)))
            assert isinstance(ok, Subscribed) and ok.req == 2
            res = await recv_until(ws, lambda m: isinstance(m, Result))
            assert isinstance(res, Result) and res.call == 3 and result_code(res) == 5
        await still_works(rubris, good)


# ------------------------------------------------------------------ calls in flight


async def test_calls_in_flight_per_session_refused_with_6() -> None:
    rubris = limited(max_calls_in_flight=2)
    gate: asyncio.Event = rubris.engine.__dict__["test_gate"]
    async with serving(rubris) as (base, good):
        async with await ws_open(base) as ws:
            await ws_hello(ws)
            await ws.send(encode_frame([Call(i, "slow", orjson.dumps(i)) for i in (1, 2, 3)]))
            res = await recv_until(ws, lambda m: isinstance(m, Result))
            assert isinstance(res, Result) and res.call == 3 and result_code(res) == 6
            # the limit is per session: the good client's calls are not counted
            await still_works(rubris, good)
            gate.set()
            done = {}
            while len(done) < 2:
                m = await recv_until(ws, lambda m: isinstance(m, Result))
                assert isinstance(m, Result) and m.status == 0
                done[m.call] = orjson.loads(m.payload)
            assert done == {1: 1, 2: 2}
            # the calls are answered: there is room again
            await ws.send(encode_frame([Call(4, "slow", b"4")]))
            m = await recv_until(ws, lambda m: isinstance(m, Result))
            assert isinstance(m, Result) and m.call == 4 and m.status == 0
