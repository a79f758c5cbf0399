"""Security: origin allow-list, secrets bound to their user, no enumeration, constant-time
compare."""

from __future__ import annotations

import base64
import hmac
import re
import secrets
from typing import Any

import httpx
import orjson
import pytest
from starlette.requests import HTTPConnection
from websockets.exceptions import InvalidStatus

from rubris_asgi import Reject, Rubris
from rubris_asgi.engine.engine import Engine
from rubris_asgi.protocol import (
    Call,
    Hello,
    Ping,
    Pong,
    Publish,
    Rejected,
    Result,
    Subscribe,
    Subscribed,
    Welcome,
    encode_frame,
)
from rubris_asgi.protocol.naming import quoted

from .apps import make_rubris, starlette_app
from .server import run_server
from .wirekit import lp_collect, lp_hello, recv_until, ws_hello, ws_open

B64URL = re.compile(r"\A[A-Za-z0-9_-]+\Z")


def header_auth(conn: HTTPConnection) -> Any:
    """The user is the X-User header; "mallory" is refused; no header is anonymous (None)."""
    user = conn.headers.get("x-user")
    if user == "mallory":
        raise Reject("banned")
    return user


def secured(**kwargs: Any) -> Rubris:
    return make_rubris(authenticate=header_auth, **kwargs)


def port_of(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


# ------------------------------------------------------------------ origin allow-list


async def test_websocket_origin_allow_list() -> None:
    rubris = secured(allowed_origins=["https://app.example"])
    async with run_server(starlette_app(rubris)) as base:
        for origin in ("http://evil.example", "null", "https://app.example.evil", "http://x"):
            with pytest.raises(InvalidStatus) as err:
                await ws_open(base, origin=origin)
            assert err.value.response.status_code == 403, origin
        same = f"http://127.0.0.1:{port_of(base)}"
        for origin in (same, "https://app.example", None):  # None: not a browser
            async with await ws_open(base, origin=origin) as ws:
                w = await ws_hello(ws)
                assert isinstance(w, Welcome)


async def test_longpoll_origin_allow_list() -> None:
    rubris = secured(allowed_origins=["https://app.example"])
    hello = encode_frame([Hello(1, "")])
    async with run_server(starlette_app(rubris)) as base:
        async with httpx.AsyncClient(base_url=base + "/rubris", timeout=10) as c:
            for origin in ("http://evil.example", "null"):
                r = await c.post("/lp", content=hello, headers={"origin": origin})
                assert r.status_code == 403, origin
            assert rubris.engine.sessions == {}  # nothing was created for them
            same = f"http://127.0.0.1:{port_of(base)}"
            for origin in (same, "https://app.example"):
                r = await c.post("/lp", content=hello, headers={"origin": origin})
                assert r.status_code == 200, origin


async def test_allow_any_origin_with_star() -> None:
    rubris = secured(allowed_origins=["*"])
    async with run_server(starlette_app(rubris)) as base:
        async with await ws_open(base, origin="http://anything.example") as ws:
            await ws_hello(ws)


async def test_authentication_refusal_is_403_on_both_transports() -> None:
    rubris = secured()
    async with run_server(starlette_app(rubris)) as base:
        with pytest.raises(InvalidStatus) as err:
            await ws_open(base, additional_headers={"x-user": "mallory"})
        assert err.value.response.status_code == 403
        async with httpx.AsyncClient(base_url=base + "/rubris", timeout=10) as c:
            r = await c.post(
                "/lp", content=encode_frame([Hello(1, "")]), headers={"x-user": "mallory"}
            )
            assert r.status_code == 403
        assert rubris.engine.sessions == {}


# ------------------------------------------------------------------ ids and tokens


def test_session_ids_and_resume_secrets_are_128_random_bits() -> None:
    engine = Engine()
    seen: set[str] = set()
    for _ in range(2000):
        s = engine.open_session()
        sid, dot, secret = s.resume_token.partition(".")
        assert sid == s.id and dot == "."
        for part in (sid, secret):
            assert B64URL.match(part)
            assert len(base64.urlsafe_b64decode(part + "==")) >= 16  # >= 128 bits
        seen.add(sid)
        seen.add(secret)
    assert len(seen) == 4000  # no repeats


async def test_resume_token_is_bound_to_its_user() -> None:
    rubris = secured()
    async with run_server(starlette_app(rubris)) as base:
        async with await ws_open(base, additional_headers={"x-user": "alice"}) as alice:
            w = await ws_hello(alice, Subscribe(1, "ring.a", 0, 0, b""))
            await recv_until(alice, lambda m: isinstance(m, Subscribed))
            alice_session = rubris.engine.sessions[w.session]
            # bob, and an anonymous peer, present alice's token: a new session each
            for headers in ({"x-user": "bob"}, {}):
                async with await ws_open(base, additional_headers=headers) as other:
                    got = await ws_hello(other, resume=w.resume)
                    assert not got.resumed and got.session != w.session
                    assert got.resume != w.resume
            async with httpx.AsyncClient(base_url=base + "/rubris", timeout=10) as c:
                got = await lp_hello(c, resume=w.resume)
                assert not got.resumed and got.session != w.session
            # none of that disturbed alice: same session, same connection, still delivering
            assert rubris.engine.sessions[w.session] is alice_session
            assert alice_session.sink is not None
            rubris.publish("ring.a", 1)
            await alice.send(encode_frame([Ping(7)]))
            assert await recv_until(alice, lambda m: isinstance(m, Pong)) == Pong(7)
            # a forged secret for alice's session id is refused too
            forged = w.session + "." + secrets.token_urlsafe(16)
            async with await ws_open(base, additional_headers={"x-user": "alice"}) as ws:
                got = await ws_hello(ws, resume=forged)
                assert not got.resumed
        # alice herself resumes after her connection is gone
        async with await ws_open(base, additional_headers={"x-user": "alice"}) as again:
            got = await ws_hello(again, resume=w.resume)
            assert got.resumed and got.session == w.session


async def test_resume_compares_the_secret_in_constant_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    engine = Engine()
    s = engine.open_session(owner="alice")
    wrong = s.id + "." + secrets.token_urlsafe(16)
    assert engine.find_resumable(wrong, "alice") is None
    assert engine.find_resumable(s.resume_token, "alice") is s
    assert engine.find_resumable(s.resume_token, "bob") is None
    assert len(calls) == 3
    assert calls[0] == (s.resume_token.encode(), wrong.encode())
    assert all(a == s.resume_token.encode() for a, _ in calls)


# ------------------------------------------------------------------ long-poll ownership


async def test_longpoll_session_is_usable_only_by_its_owner() -> None:
    rubris = secured()
    async with run_server(starlette_app(rubris)) as base:
        async with httpx.AsyncClient(base_url=base + "/rubris", timeout=10) as c:
            alice = {"x-user": "alice"}
            c.headers.update(alice)
            w = await lp_hello(c)
            del c.headers["x-user"]
            unknown = secrets.token_urlsafe(16)
            answers = []
            for sid, headers in (
                (w.session, {"x-user": "bob"}),
                (w.session, {}),
                (unknown, {"x-user": "bob"}),
                (unknown, alice),
            ):
                g = await c.get(f"/lp/{sid}", params={"ack": 0}, headers=headers)
                p = await c.post(f"/lp/{sid}", content=encode_frame([Ping(1)]), headers=headers)
                answers.append((g.status_code, g.text, p.status_code, p.text))
            # all four the same: another user's session looks exactly like an unknown one
            assert len(set(answers)) == 1, answers
            assert answers[0][0] == 404 and answers[0][2] == 404
            # bob's POST did not reach alice's session: her poll sees only her own PING
            r = await c.post(f"/lp/{w.session}", content=encode_frame([Ping(2)]), headers=alice)
            assert r.status_code == 202
            c.headers.update(alice)
            assert await lp_collect(c, w.session, lambda m: isinstance(m, Pong)) == Pong(2)


# ------------------------------------------------------------------ no enumeration


async def test_unknown_topics_and_methods_all_get_the_same_answer() -> None:
    rubris = secured()
    async with run_server(starlette_app(rubris)) as base:
        async with await ws_open(base, additional_headers={"x-user": "alice"}) as ws:
            await ws_hello(ws)
            names = ["no.such", "snap", "admin.secrets", "snap.a.b", "ring", "x" * 200, "inbox2"]
            await ws.send(encode_frame([Subscribe(i, n, 0, 0, b"") for i, n in enumerate(names)]))
            # each answer is the same function of the name alone (it shows the client its own
            # name, cut short when long), whether or not a channel offers it
            answers = {}
            for _ in names:
                m = await recv_until(ws, lambda m: isinstance(m, (Rejected, Subscribed)))
                assert isinstance(m, Rejected), m
                answers[m.req] = (m.code, m.reason)
            assert answers == {i: (3, f"unknown topic {quoted(n)}") for i, n in enumerate(names)}
            assert answers[5] == (3, f"unknown topic {'x' * 100!r}…")
            # publishing where clients may not publish looks the same as an unknown topic
            await ws.send(encode_frame([Publish(50, "snap.a", b"1"), Publish(51, "nope", b"1")]))
            pubs = {}
            for _ in range(2):
                m = await recv_until(ws, lambda m: isinstance(m, Rejected))
                assert isinstance(m, Rejected)
                pubs[m.req] = (m.code, m.reason)
            assert pubs == {50: (3, "unknown topic 'snap.a'"), 51: (3, "unknown topic 'nope'")}
            # methods likewise
            await ws.send(encode_frame([Call(i, n, b"") for i, n in enumerate(names, 100)]))
            results = {}
            for _ in names:
                m = await recv_until(ws, lambda m: isinstance(m, Result))
                assert isinstance(m, Result) and m.status == 1
                results[m.call] = orjson.loads(m.payload)
            assert results == {
                i: {"code": 3, "message": f"unknown method {quoted(n)}"}
                for i, n in enumerate(names, 100)
            }
            # a topic the handler refuses says only what the handler said
            await ws.send(encode_frame([Subscribe(200, "snap.forbidden", 0, 0, b"")]))
            m = await recv_until(ws, lambda m: isinstance(m, (Rejected, Subscribed)))
            assert isinstance(m, Rejected) and (m.code, m.reason) == (10, "not for you")


async def test_no_endpoint_lists_sessions_or_topics() -> None:
    rubris = secured()
    async with run_server(starlette_app(rubris)) as base:
        async with httpx.AsyncClient(base_url=base + "/rubris", timeout=10) as c:
            w = await lp_hello(c, Subscribe(1, "snap.visible", 0, 0, b""))
            for path in ("/", "/lp", "/lp/", "/ws", "/sessions", "/topics", "/stats", "/lp/*"):
                for method in ("GET", "POST", "HEAD", "OPTIONS"):
                    r = await c.request(method, path)
                    # 307: Starlette's redirect of "/lp/" to "/lp", which is POST-only
                    assert r.status_code in (307, 400, 404, 405), (method, path, r)
                    assert w.session not in r.text and "snap.visible" not in r.text
