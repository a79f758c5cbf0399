"""Errors that name their subject (issue 36, item 3): every refusal of a topic or method the
client named says which one, on the server (REJECTED, RESULT errors, the HTTP API) and in the
Python client's exceptions, even against a server whose reasons name nothing; a value orjson
cannot encode raises a ``TypeError`` naming the topic (or method), the type and the fix, with
nothing left half-sent. The browser client's texts: tests/test_browser_error_texts.py.
"""

from __future__ import annotations

import asyncio
import decimal
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from rubris_asgi import Codec, Config, Limits, Rubris, Session, Timing
from rubris_asgi.client import (
    CallError,
    Client,
    ItemRefused,
    Rejection,
    SubscribeRejected,
)
from rubris_asgi.client.payloads import _call_error, _dumps
from rubris_asgi.errors import ErrorCode
from rubris_asgi.protocol import Call, Publish, Rejected, Result, Subscribe
from rubris_asgi.protocol.naming import NAME_SHOWN, quoted, value_refused

from .apps import starlette_app
from .server import run_server
from .test_client_unit import FakeServer, connected, eventually

TOKEN = "texts-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FIX = "or pass orjson-compatible values"


class Opaque:
    """A value of a type orjson knows nothing about."""


def make() -> Rubris:
    rubris = Rubris(
        Config(limits=Limits(), timing=Timing(poll_timeout=1.0, session_timeout=5.0)),
        api_token=TOKEN,
        batches=False,
    )

    @rubris.shared("prices.{symbol}", snapshot=True, client_publish=True)
    async def prices(session: Session, symbol: str) -> Any:
        return None

    @rubris.shared("chat.{room}", ring=8, client_publish=lambda session, room: room != "closed")
    async def chat(session: Session, room: str) -> None:
        return None

    @rubris.shared("raw", ring=4, codec=Codec.BYTES)
    async def raw(session: Session) -> None:
        return None

    @rubris.private("inbox", queue=16)
    async def inbox(session: Session) -> None:
        return None

    @rubris.queue("jobs.{kind}", client_publish=True)
    async def jobs(session: Session, kind: str) -> None:
        return None

    @rubris.rpc("place_order")
    async def place_order(session: Session, args: Any) -> Any:
        return {"ok": True}

    return rubris


async def served() -> AsyncIterator[tuple[Rubris, Client]]:
    rubris = make()
    async with run_server(starlette_app(rubris)) as base:
        async with Client(base + "/rubris", transport="websocket") as client:
            yield rubris, client


@pytest.fixture
async def live() -> AsyncIterator[tuple[Rubris, Client]]:
    """The app on a real server and a client connected to it over a WebSocket."""
    async for pair in served():
        yield pair


# ---------------------------------------------------------------- the server's reasons


async def test_an_unknown_topic_is_named_in_rejected_and_subscribe_rejected(
    live: tuple[Rubris, Client],
) -> None:
    _rubris, client = live
    with pytest.raises(SubscribeRejected) as info:
        await client.subscribe("prics.AAPL")
    err = info.value
    assert (err.code, err.reason, err.topic) == (3, "unknown topic 'prics.AAPL'", "prics.AAPL")
    # the name once: the reason names it, so the client does not say it again
    assert str(err) == "subscribe refused: unknown topic 'prics.AAPL' (code 3)"


async def test_an_unknown_method_is_named_in_the_result_error(
    live: tuple[Rubris, Client],
) -> None:
    _rubris, client = live
    with pytest.raises(CallError) as info:
        await client.call("plce_order", {"qty": 1})
    assert (info.value.code, info.value.message) == (3, "unknown method 'plce_order'")
    assert "'plce_order'" in str(info.value)
    # the stream of an unknown method says the same
    with pytest.raises(CallError) as info:
        async for _ in client.stream("plce_order"):
            pass
    assert info.value.message == "unknown method 'plce_order'"


async def test_a_refused_publish_names_its_topic(live: tuple[Rubris, Client]) -> None:
    _rubris, client = live
    await client.publish("prics.AAPL", 1)  # no such channel
    await client.publish("chat.closed", "hi")  # the channel's hook says no
    await eventually(lambda: len(client.rejections) == 2)
    unknown, closed = client.rejections
    assert (unknown.name, unknown.code, unknown.reason) == (
        "prics.AAPL",
        3,
        "unknown topic 'prics.AAPL'",
    )
    assert str(unknown) == "publish refused: unknown topic 'prics.AAPL' (code 3)"
    assert (closed.code, closed.reason) == (4, "not allowed to publish to 'chat.closed'")
    assert str(closed) == "publish refused: not allowed to publish to 'chat.closed' (code 4)"


async def test_a_refused_enqueue_names_its_topic(live: tuple[Rubris, Client]) -> None:
    _rubris, client = live
    with pytest.raises(ItemRefused) as info:
        await client.enqueue("jbos.resize", {"image": 1})
    err = info.value
    assert (err.code, err.reason, err.topic) == (3, "unknown topic 'jbos.resize'", "jbos.resize")
    assert str(err) == "enqueue refused: unknown topic 'jbos.resize' (code 3)"


async def test_a_name_over_the_limit_is_named_cut_short(live: tuple[Rubris, Client]) -> None:
    _rubris, client = live
    name = "prices." + "A" * 300
    with pytest.raises(SubscribeRejected) as info:
        await client.subscribe(name)
    cut = repr(name[:NAME_SHOWN]) + "…"
    assert info.value.code == ErrorCode.TOO_LARGE
    assert info.value.reason == f"topic name {cut} too long (307 bytes, at most 256)"
    assert len(info.value.reason) < 160  # bounded, whatever the client sent
    with pytest.raises(CallError) as called:
        await client.call("m" * 1000)
    assert called.value.message == (
        f"method name {repr('m' * NAME_SHOWN)}… too long (1000 bytes, at most 256)"
    )
    await client.publish(name, 1)
    await eventually(lambda: len(client.rejections) == 1)
    assert client.rejections[0].reason == f"unknown topic {cut}"


async def test_the_http_api_names_the_topic() -> None:
    async with make() as rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            r = await http.get("/api/topics/prics.AAPL", headers=AUTH)
            assert r.status_code == 404
            assert r.json()["error"] == "no shared channel offers the topic 'prics.AAPL'"
            entry = {"topic": "prics.AAPL", "data": 1}
            r = await http.post("/api/publish", json=entry, headers=AUTH)
            assert r.status_code == 404
            assert r.json()["error"] == "no shared channel offers the topic 'prics.AAPL'"
            long = "prices." + "B" * 300
            cut = repr(long[:NAME_SHOWN]) + "…"
            r = await http.get(f"/api/topics/{long}", headers=AUTH)
            assert r.status_code == 400
            assert r.json()["error"] == f"topic name {cut} too long (307 bytes, at most 256)"
            r = await http.post("/api/publish", json={"topic": long, "data": 1}, headers=AUTH)
            assert r.status_code == 400
            assert r.json()["error"] == f"topic name {cut} too long (307 bytes, at most 256)"


# ---------------------------------------------------------------- the client's exceptions


async def test_subscribe_rejected_names_the_topic_an_older_server_did_not(
    server: FakeServer,
) -> None:
    client, conn = await connected(server)
    task = asyncio.ensure_future(client.subscribe("prics.AAPL"))
    s = await conn.expect(Subscribe)
    await conn.send(Rejected(s.req, ErrorCode.UNKNOWN, "unknown topic"))
    with pytest.raises(SubscribeRejected) as info:
        await task
    assert (info.value.code, info.value.reason) == (3, "unknown topic")  # the server's, kept
    assert info.value.topic == "prics.AAPL"
    assert str(info.value) == "subscribe 'prics.AAPL' refused: unknown topic (code 3)"
    await client.close()


async def test_rejection_and_item_refused_name_the_topic_an_older_server_did_not(
    server: FakeServer,
) -> None:
    client, conn = await connected(server)
    await client.publish("chta.lobby", {"m": "hi"})
    pub = await conn.expect(Publish)
    await conn.send(Rejected(pub.req, ErrorCode.UNKNOWN, "unknown topic"))
    await eventually(lambda: client.stats.rejected == 1)
    assert str(client.rejections[-1]) == "publish to 'chta.lobby' refused: unknown topic (code 3)"

    task = asyncio.ensure_future(client.enqueue("jbos.resize", {"image": 1}))
    item = await conn.expect(Publish)
    await conn.send(Rejected(item.req, ErrorCode.UNKNOWN, "unknown topic"))
    with pytest.raises(ItemRefused) as info:
        await task
    assert info.value.topic == "jbos.resize"
    assert str(info.value) == "enqueue to 'jbos.resize' refused: unknown topic (code 3)"
    await client.close()


def test_call_error_names_the_method_once() -> None:
    older = _call_error(orjson.dumps({"code": 3, "message": "unknown method"}), "plce_order")
    assert (older.code, older.message, older.method) == (3, "unknown method", "plce_order")
    assert str(older) == "call 'plce_order' failed: unknown method (code 3)"
    newer = _call_error(
        orjson.dumps({"code": 3, "message": "unknown method 'plce_order'"}), "plce_order"
    )
    assert str(newer) == "call failed: unknown method 'plce_order' (code 3)"
    refused = CallError(10, "insufficient funds", method="place_order")
    assert str(refused) == "call 'place_order' failed: insufficient funds (code 10)"
    # made without a method (the constructor of before): the text it always had
    assert str(CallError(10, "insufficient funds")) == "insufficient funds (code 10)"
    assert CallError(10, "x").method == ""
    # the other constructors of before still work, with the texts of before
    assert str(SubscribeRejected(3, "unknown topic")) == "unknown topic (code 3)"
    assert str(Rejection(1, "", 3, "unknown topic")) == "publish refused: unknown topic (code 3)"


async def test_the_client_names_the_method_of_a_call_an_older_server_refused(
    server: FakeServer,
) -> None:
    client, conn = await connected(server)
    try:
        task = asyncio.ensure_future(client.call("plce_order"))
        c = await conn.expect(Call)
        await conn.send(Result(c.call, 1, orjson.dumps({"code": 3, "message": "unknown method"})))
        with pytest.raises(CallError) as info:
            await task
        assert info.value.method == "plce_order"
        with pytest.raises(TypeError, match=r"^call of 'plce_order': a Decimal is not JSON"):
            await client.call("plce_order", {"qty": decimal.Decimal(1)})
    finally:
        await client.close()


# ---------------------------------------------------------------- values that are not JSON


def fix_of(kind: str, hint: str) -> str:
    article = "an" if kind[0] in "aeiouAEIOU" else "a"
    return f"{article} {kind} is not JSON: convert it ({hint}) {FIX}"


async def test_the_client_names_the_topic_of_a_value_that_is_not_json(
    server: FakeServer,
) -> None:
    client, conn = await connected(server)
    kept = dict(client._pub_reqs)
    with pytest.raises(TypeError) as info:
        await client.publish("prices.AAPL", {"px": decimal.Decimal("189.5")})
    assert str(info.value) == "publish to 'prices.AAPL': " + fix_of("Decimal", "float(x), str(x)")
    assert isinstance(info.value.__cause__, TypeError)  # orjson's own, kept
    assert client._pub_reqs == kept  # nothing taken: no request, nothing to tie a refusal to

    with pytest.raises(TypeError) as info:
        await client.enqueue("jobs.resize", {1, 2})
    assert str(info.value) == "enqueue to 'jobs.resize': " + fix_of("set", "list(x)")
    with pytest.raises(TypeError) as info:
        await client.enqueue_many("jobs.resize", [1, 2, Opaque(), 4])
    assert str(info.value) == "enqueue to 'jobs.resize' (values[2]): " + fix_of(
        "Opaque", "to a dict, list, str, int, float, bool or None"
    )
    assert not client._outbox.items  # a run is sent whole or not at all
    assert not client._outcomes.waiting
    with pytest.raises(TypeError, match=r"^enqueue to 'jobs.resize': the value is not JSON"):
        await client.enqueue("jobs.resize", 1 << 70)  # orjson's other refusals say what they are

    # a call's args: the fix, and the method where the caller gives it (_dumps)
    with pytest.raises(TypeError) as info:
        await client.call("place_order", {"px": decimal.Decimal(1)}, timeout=1)
    assert fix_of("Decimal", "float(x), str(x)") in str(info.value)
    with pytest.raises(TypeError) as info:
        _dumps({"px": decimal.Decimal(1)}, "place_order")
    assert str(info.value) == "call of 'place_order': " + fix_of("Decimal", "float(x), str(x)")

    # the client goes on: the next publish is sent and numbered as usual
    await client.publish("prices.AAPL", {"px": 189.5})
    pub = await conn.expect(Publish)
    assert (pub.name, orjson.loads(pub.payload)) == ("prices.AAPL", {"px": 189.5})
    await client.close()


async def test_the_server_names_the_topic_of_a_value_that_is_not_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with make() as rubris:
        assert rubris.publish("prices.AAPL", {"px": 1}) == 1
        t = rubris.engine.topics["prices.AAPL"]
        before = (t.seq, t.msg)
        with pytest.raises(TypeError) as info:
            rubris.publish("prices.AAPL", {"px": decimal.Decimal("189.5")})
        assert str(info.value) == "publish to 'prices.AAPL': " + fix_of(
            "Decimal", "float(x), str(x)"
        )
        assert isinstance(info.value.__cause__, TypeError)
        with pytest.raises(TypeError, match=r"^publish to 'prices.AAPL': a set is not JSON"):
            await rubris.publish_async("prices.AAPL", {1})
        assert (t.seq, t.msg) == before  # no seq taken, nothing stored
        assert rubris.publish("prices.AAPL", {"px": 2}) == 2  # and the next one is the next
        # a bytes topic says what it takes, with its name
        with pytest.raises(TypeError) as info:
            rubris.publish("raw", 5)
        assert str(info.value) == "publish to 'raw': a bytes topic takes bytes, got int"

        with pytest.raises(TypeError) as info:
            rubris.enqueue("jobs.resize", {"n": decimal.Decimal(1)}, id="once")
        assert str(info.value) == "enqueue to 'jobs.resize': " + fix_of(
            "Decimal", "float(x), str(x)"
        )
        with pytest.raises(TypeError, match=r"^enqueue to 'jobs.resize': an Opaque is not JSON"):
            await rubris.put("jobs.resize", Opaque())
        assert rubris.queue_stats("jobs.resize").waiting == 0
        assert rubris.enqueue("jobs.resize", {"n": 1}, id="once")  # its id was not remembered

        # a TypeError that is not the value's is raised as it came, not blamed on the value
        def broken(*args: Any, **kwargs: Any) -> int:
            raise TypeError("a bug of its own")

        monkeypatch.setattr(rubris.engine, "publish", broken)
        with pytest.raises(TypeError) as info:
            rubris.publish("prices.AAPL", {"px": 1})
        assert str(info.value) == "a bug of its own" and info.value.__cause__ is None


async def test_send_and_send_to_name_the_topic(live: tuple[Rubris, Client]) -> None:
    rubris, client = live
    sub = await client.subscribe("inbox")
    (session,) = rubris.sessions()
    q = session.private("inbox")
    assert q is not None
    with pytest.raises(TypeError) as info:
        await rubris.send(session, "inbox", {"at": decimal.Decimal(1)})
    assert str(info.value) == "send to 'inbox': " + fix_of("Decimal", "float(x), str(x)")
    with pytest.raises(TypeError) as info:
        rubris.send_nowait(session, "inbox", {1, 2})
    assert str(info.value) == "send to 'inbox': " + fix_of("set", "list(x)")
    with pytest.raises(TypeError) as info:
        await rubris.send_to(session.id, "inbox", Opaque(), key="k1")
    # said once, though send_to goes through send on this node
    assert str(info.value) == "send to 'inbox': " + fix_of(
        "Opaque", "to a dict, list, str, int, float, bool or None"
    )
    assert q.seq == 0  # nothing queued, no seq taken
    # the key was not remembered: the same key with a good value is queued
    assert await rubris.send_to(session.id, "inbox", {"ok": 1}, key="k1") == 1
    value, _info = await sub.get(timeout=5)
    assert value == {"ok": 1}


def test_quoted_bounds_a_name_and_value_refused_words_the_fix() -> None:
    assert quoted("prics.AAPL") == "'prics.AAPL'"
    assert quoted("it's") == '"it\'s"'  # as repr quotes
    assert quoted("x" * 5000) == repr("x" * NAME_SHOWN) + "…"
    try:
        orjson.dumps({"a": [decimal.Decimal(1)]})
    except TypeError as exc:
        err = value_refused("publish to 'p'", exc)
    assert isinstance(err, TypeError)
    assert str(err) == "publish to 'p': " + fix_of("Decimal", "float(x), str(x)")
