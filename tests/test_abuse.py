"""What one client may not do to the others: publish where it may not subscribe, keep topics
alive for ever, take every session, keep a revoked session, or hold the event loop inflating
(issue: "every publisher authorised, and no client can use up what others need").

Engine-level rules run on an injected clock; the rest on a real uvicorn on loopback.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import orjson
import pytest
from starlette.requests import HTTPConnection
from zlib_ng import zlib_ng

from rubris_asgi import Config, ErrorCode, Limits, ProtocolError, Reject, Rubris, Session, Timing
from rubris_asgi.control.budget import Budget
from rubris_asgi.engine.channels import Registry
from rubris_asgi.engine.engine import Engine
from rubris_asgi.protocol import (
    Goodbye,
    Hello,
    Ping,
    Pong,
    Publish,
    Push,
    Rejected,
    Subscribe,
    Subscribed,
    encode_frame,
)

from .server import run_server
from .wirekit import (
    expect_goodbye_and_close,
    lp_collect,
    lp_hello,
    recv_until,
    ws_hello,
    ws_open,
)

# ------------------------------------------------------------------ the app under attack

REVOKED: set[str] = set()


def header_auth(conn: HTTPConnection) -> Any:
    """The user is the X-User header (none: anonymous); a name in REVOKED is refused."""
    user = conn.headers.get("x-user")
    if user in REVOKED:
        raise Reject("revoked")
    return user


def chat_app(**config: Any) -> Rubris:
    rubris = Rubris(Config(**config), authenticate=header_auth)

    @rubris.shared("chat.{room}", ring=16, client_publish=True)
    def chat(session: Session, room: str) -> None:
        if room == "staff" and session.user != "alice":
            raise Reject("staff only", ErrorCode.NOT_AUTHORISED)

    def may_post(session: Session, room: str, payload: bytes) -> bool:
        return session.user is not None and len(payload) <= 64

    @rubris.shared("board.{room}", ring=16, client_publish=may_post)
    def board(session: Session, room: str) -> None:
        return None

    @rubris.shared("orders.{user}", ring=16)
    def orders(session: Session, user: str) -> None:
        if session.user != user:
            raise Reject("not yours", ErrorCode.NOT_AUTHORISED)

    return rubris


def app_of(rubris: Rubris) -> Any:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    return Starlette(routes=[Mount("/rubris", app=rubris)], lifespan=rubris.lifespan)


async def as_user(base: str, user: str | None) -> Any:
    headers = {"x-user": user} if user else {}
    return await ws_open(base, additional_headers=headers)


# ------------------------------------------------------------------ 1. publish authorisation


async def test_a_client_publishes_only_where_it_may_subscribe() -> None:
    rubris = chat_app()
    async with run_server(app_of(rubris)) as base:
        async with (
            await as_user(base, "alice") as alice,
            await as_user(base, "bob") as bob,
            await as_user(base, None) as anon,
        ):
            await ws_hello(
                alice, Subscribe(1, "chat.staff", 0, 0, b""), Subscribe(2, "chat.lobby", 0, 0, b"")
            )
            await recv_until(alice, lambda m: isinstance(m, Subscribed) and m.req == 2)
            await ws_hello(bob)
            await ws_hello(anon)
            for ws in (bob, anon):  # refused as the subscribe handler refuses them
                await ws.send(encode_frame([Publish(7, "chat.staff", b'"spoof"'), Ping(9)]))
                r = await recv_until(ws, lambda m: isinstance(m, Rejected))
                assert isinstance(r, Rejected) and r.req == 7
                assert (r.code, r.reason) == (ErrorCode.NOT_AUTHORISED, "staff only")
                await recv_until(ws, lambda m: isinstance(m, Pong))
            # bob may publish to the lobby without subscribing: the handler accepts him there
            await bob.send(encode_frame([Publish(8, "chat.lobby", b'"hi"'), Ping(10)]))
            await recv_until(bob, lambda m: isinstance(m, Pong))
            got = await recv_until(alice, lambda m: isinstance(m, Push))
            assert isinstance(got, Push) and orjson.loads(got.payload) == "hi"
            # nothing of the refused ones reached the staff room
            assert rubris.engine.topics["chat.staff"].seq == 0


async def test_a_publish_hook_decides_each_publish_with_the_payload() -> None:
    rubris = chat_app()
    async with run_server(app_of(rubris)) as base:
        async with await as_user(base, "bob") as bob, await as_user(base, None) as anon:
            await ws_hello(bob)
            await ws_hello(anon)
            await bob.send(encode_frame([Publish(1, "board.a", b'"' + b"x" * 100 + b'"')]))
            r = await recv_until(bob, lambda m: isinstance(m, Rejected))
            assert isinstance(r, Rejected) and r.code == ErrorCode.NOT_AUTHORISED
            await anon.send(encode_frame([Publish(2, "board.a", b'"short"')]))
            r = await recv_until(anon, lambda m: isinstance(m, Rejected))
            assert isinstance(r, Rejected) and r.req == 2
            await bob.send(encode_frame([Publish(3, "board.a", b'"short"'), Ping(4)]))
            await recv_until(bob, lambda m: isinstance(m, Pong))
            for _ in range(100):
                t = rubris.engine.topics.get("board.a")
                if t is not None and t.seq == 1:
                    break
                await asyncio.sleep(0.01)
            assert rubris.engine.topics["board.a"].seq == 1


def test_client_publish_must_be_a_bool_or_a_callable() -> None:
    with pytest.raises(TypeError):
        Registry().shared("x", snapshot=True, client_publish="yes")  # type: ignore[arg-type]


# ------------------------------------------------------------------ 2. topics retired


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def engine_with(clock: Clock, **timing: float | None) -> tuple[Engine, Registry]:
    config = Config(timing=Timing(session_timeout=30.0, **timing))  # type: ignore[arg-type]
    reg = Registry(keep=config.timing.topic_keep, max_topics=3)
    reg.shared("t.{x}", ring=4)(lambda session, x: None)
    reg.shared("app.{x}", snapshot=True)(lambda session, x: None)
    reg.shared("forever.{x}", snapshot=True, keep=None)(lambda session, x: None)
    return Engine(config, clock=clock), reg


def never(name: str) -> bool:
    return False


def test_a_topic_nobody_needs_is_retired_with_its_memory() -> None:
    clock = Clock()
    e, reg = engine_with(clock)
    ch = reg.match("t.a")
    assert ch is not None
    e.topic_of("t.a", ch[0])  # made by a SUBSCRIBE, never published to
    fed = e.topic_of("t.b", ch[0])  # fed by a client's PUBLISH
    e.publish(fed, {"n": 1})
    clock.now += 4.9
    assert e.retire(clock.now, never) == 0
    clock.now += 0.2
    assert e.retire(clock.now, never) == 1  # the empty one, after its grace
    assert "t.a" not in e.topics and "t.b" in e.topics
    clock.now += 25.0  # 30 s after the client's publish: the window a client comes back in
    assert e.retire(clock.now, never) == 1
    assert e.topics == {} and e.lifetimes.per_channel == {} and e.lifetimes.idle == {}
    assert e.telemetry.topics_retired == 2
    assert e.telemetry.published(e.topics.values()) == 1  # its publishes still count


def test_what_the_application_publishes_is_kept_for_the_channels_keep() -> None:
    clock = Clock()
    e, reg = engine_with(clock, topic_keep=600.0)
    kept = e.shared_named("app.price", reg)
    e.publish(kept, 1)
    forever = e.shared_named("forever.config", reg)
    e.publish(forever, 2)
    clock.now += 599.0
    assert e.retire(clock.now, never) == 0
    clock.now += 2.0
    assert e.retire(clock.now, never) == 1
    assert list(e.topics) == ["forever.config"]
    clock.now += 10 * 86400
    assert e.retire(clock.now, never) == 0


def test_a_subscribed_or_followed_topic_is_never_retired() -> None:
    clock = Clock()
    e, reg = engine_with(clock)
    ch = reg.match("t.a")
    assert ch is not None
    t = e.topic_of("t.a", ch[0])
    s = e.open_session()
    sub = e.subscribe(s, t, 1, 0, 0)
    clock.now += 1000
    assert e.retire(clock.now, never) == 0
    e.unsubscribe(s, sub.number)
    clock.now += 4.0  # the grace counts from when the last subscriber left
    assert e.retire(clock.now, never) == 0
    clock.now += 2.0
    assert e.retire(clock.now, lambda name: name == "t.a") == 0  # followed for other nodes
    assert e.retire(clock.now, never) == 1


def test_a_channel_past_its_max_topics_refuses_only_its_own_new_topics() -> None:
    clock = Clock()
    e, reg = engine_with(clock)
    ch = reg.match("t.a")
    assert ch is not None
    for x in "abc":
        e.topic_of(f"t.{x}", ch[0])
    with pytest.raises(ProtocolError) as err:
        e.topic_of("t.d", ch[0])
    assert err.value.code == ErrorCode.TOO_MANY and "t.{x}" in str(err.value)
    e.shared_named("app.other", reg)  # another channel is not affected
    clock.now += 6.0
    e.retire(clock.now, never)
    e.topic_of("t.d", ch[0])  # room again once they were retired


@pytest.mark.slow  # seconds of timeouts waited out: the full suite's, not the inner loop's
async def test_topics_a_client_made_are_gone_after_it_leaves() -> None:
    rubris = chat_app(timing=Timing(session_timeout=1.0))
    async with run_server(app_of(rubris)) as base:
        async with await as_user(base, None) as anon:
            await ws_hello(anon)
            frame = [Subscribe(i, f"chat.r{i}", 0, 0, b"") for i in range(1, 201)]
            frame += [Publish(1000 + i, f"chat.p{i}", b'"x"') for i in range(100)]
            await anon.send(encode_frame([*frame, Ping(1)]))
            await recv_until(anon, lambda m: isinstance(m, Pong))
            assert len(rubris.engine.topics) == 300
        for _ in range(800):  # the session expires (1 s), then the topics (at most ~6 s)
            if not rubris.engine.topics:
                break
            await asyncio.sleep(0.01)
        assert rubris.engine.topics == {}


# ------------------------------------------------------------------ 5. session caps


def test_sessions_are_capped_per_user_and_per_anonymous_address() -> None:
    e = Engine(Config(limits=Limits(max_sessions_per_user=2, max_sessions_per_address=3)))
    alice = [e.open_session("alice", "alice", "10.0.0.1") for _ in range(2)]
    with pytest.raises(ProtocolError) as err:
        e.open_session("alice", "alice", "10.0.0.9")
    assert err.value.code == ErrorCode.TOO_MANY and "user" in str(err.value)
    anon = [e.open_session(None, None, "10.0.0.1") for _ in range(3)]
    with pytest.raises(ProtocolError) as err:
        e.open_session(None, None, "10.0.0.1")
    assert "address" in str(err.value)
    e.open_session(None, None, "10.0.0.2")  # another address
    e.open_session("bob", "bob", "10.0.0.1")  # a user from the same address
    e.end_session(alice[0])
    e.end_session(anon[0])
    e.open_session("alice", "alice", "10.0.0.1")
    e.open_session(None, None, "10.0.0.1")


async def test_one_client_flooding_sessions_stops_at_its_cap_and_alice_gets_hers() -> None:
    rubris = chat_app(limits=Limits(max_sessions=50, max_sessions_per_address=20))
    hello = encode_frame([Hello(1, "")])
    async with run_server(app_of(rubris)) as base:
        async with httpx.AsyncClient(base_url=base + "/rubris", timeout=10) as c:
            codes = [(await c.post("/lp", content=hello)).status_code for _ in range(30)]
            assert codes == [200] * 20 + [503] * 10
            r = await c.post("/lp", content=hello)
            assert r.status_code == 503 and "address" in r.text
            r = await c.post("/lp", content=hello, headers={"x-user": "alice"})
            assert r.status_code == 200
        async with await as_user(base, None) as ws:
            await ws.send(hello)
            bye = await expect_goodbye_and_close(ws, ErrorCode.TOO_MANY, 1013)
            assert "address" in bye.reason


# ------------------------------------------------------------------ 7. revocation


async def test_disconnect_ends_every_session_of_a_user_at_once() -> None:
    rubris = chat_app()
    async with run_server(app_of(rubris)) as base:
        async with (
            await as_user(base, "carol") as c1,
            await as_user(base, "carol") as c2,
            await as_user(base, "dave") as dave,
        ):
            await ws_hello(c1, Subscribe(1, "orders.carol", 0, 0, b""))
            await recv_until(c1, lambda m: isinstance(m, Subscribed))
            w2 = await ws_hello(c2)
            await ws_hello(dave)
            started = time.monotonic()
            ended = await rubris.disconnect(user="carol", reason="logged out")
            assert ended == 2
            for ws in (c1, c2):
                bye = await expect_goodbye_and_close(ws, ErrorCode.NOT_AUTHORISED, 1008)
                assert bye.reason == "logged out"
            assert time.monotonic() - started < 1.0
            await dave.send(encode_frame([Ping(5)]))
            await recv_until(dave, lambda m: isinstance(m, Pong))  # dave is untouched
        # carol's ended session cannot be resumed
        async with await as_user(base, "carol") as again:
            w = await ws_hello(again, resume=w2.resume)
            assert not w.resumed and w.session != w2.session
        assert await rubris.disconnect(user="carol") == 1
        with pytest.raises(ValueError):
            await rubris.disconnect(user="carol", code=ErrorCode.TOO_MANY)


async def test_disconnect_by_session_id_and_of_a_session_waiting_for_resume() -> None:
    rubris = chat_app()
    async with run_server(app_of(rubris)) as base:
        async with await as_user(base, None) as ws:
            w = await ws_hello(ws)
            assert await rubris.disconnect(session=w.session, code=ErrorCode.REJECTED) == 1
            bye = await expect_goodbye_and_close(ws, ErrorCode.REJECTED, 1008)
            assert bye.code == ErrorCode.REJECTED
        async with await as_user(base, "erin") as ws:
            w = await ws_hello(ws)
        for _ in range(100):  # detached: waiting for a resume
            if rubris.engine.sessions[w.session].sink is None:
                break
            await asyncio.sleep(0.01)
        assert await rubris.disconnect(user="erin") == 1
        assert w.session not in rubris.engine.sessions


async def test_disconnect_ends_a_long_poll_session_with_its_goodbye() -> None:
    rubris = chat_app(timing=Timing(poll_timeout=1.0))
    async with run_server(app_of(rubris)) as base:
        headers = {"x-user": "ivan"}
        async with httpx.AsyncClient(base_url=base + "/rubris", timeout=10, headers=headers) as c:
            w = await lp_hello(c)
            assert await rubris.disconnect(user="ivan", reason="banned") == 1
            bye = await lp_collect(c, w.session, lambda m: isinstance(m, Goodbye))
            assert isinstance(bye, Goodbye) and (bye.code, bye.reason) == (4, "banned")
            for _ in range(100):  # ended once its GOODBYE is taken: the id finds nothing
                r = await c.get(f"/lp/{w.session}", params={"ack": 1})
                if r.status_code == 404:
                    break
                await asyncio.sleep(0.05)
            assert r.status_code == 404
            assert w.session not in rubris.engine.sessions


async def test_reauthentication_ends_a_session_whose_user_is_refused_now() -> None:
    rubris = chat_app(timing=Timing(reauthenticate=0.2))
    async with run_server(app_of(rubris)) as base:
        async with await as_user(base, "frank") as ws, await as_user(base, "gina") as gina:
            await ws_hello(ws)
            await ws_hello(gina)
            REVOKED.add("frank")
            try:
                bye = await expect_goodbye_and_close(ws, ErrorCode.NOT_AUTHORISED, 1008)
                assert "revoked" in bye.reason
            finally:
                REVOKED.discard("frank")
            await gina.send(encode_frame([Ping(1)]))
            await recv_until(gina, lambda m: isinstance(m, Pong))


# ------------------------------------------------------------------ 4. the input budget


def test_the_budget_refills_at_its_rate_up_to_its_burst() -> None:
    b = Budget(rate=1000, burst=500, now=0.0)
    b.spend(400, 0.0)
    assert b.wait(0.0) == 0.0
    b.spend(400, 0.0)
    assert b.wait(0.0) == pytest.approx(0.3)
    assert b.wait(0.3) == 0.0
    b.spend(0, 100.0)
    assert b.level == 500  # never more than the burst


@pytest.mark.slow  # seconds of timeouts waited out: the full suite's, not the inner loop's
async def test_a_client_inflating_past_its_budget_is_slowed_to_it() -> None:
    rate = 1024 * 1024
    rubris = chat_app(limits=Limits(inbound_rate=rate))
    big = zlib_ng.compress(b'"' + b"a" * (256 * 1024 - 2) + b'"', 1, -15)
    async with run_server(app_of(rubris)) as base:
        async with await as_user(base, "hank") as ws:
            await ws_hello(ws, Subscribe(1, "chat.x", 0, 0, b""))
            await recv_until(ws, lambda m: isinstance(m, Subscribed))
            started = time.monotonic()
            # 12 payloads inflating to 256 KiB each: 3 MiB against 1 MiB/s (1 MiB of burst)
            msgs = [Publish(10 + i, "chat.x", big, compressed=True) for i in range(12)]
            await ws.send(encode_frame([*msgs, Ping(2)]))
            await recv_until(ws, lambda m: isinstance(m, Pong), timeout=20)
            assert time.monotonic() - started >= 1.5
        t = rubris.engine.topics.get("chat.x")
        assert t is not None and t.seq == 12  # slowed, nothing refused


def test_a_queue_only_clients_made_is_retired_once_nobody_needs_it() -> None:
    from rubris_asgi.engine.queues import QueueSettings

    clock = Clock()
    config = Config(timing=Timing(session_timeout=30.0))
    e = Engine(config, clock=clock)
    reg = Registry(max_topics=2)
    reg.queue("jobs.{x}", QueueSettings(dead_letter="dead"))(lambda session, x: None)
    reg.queue("dead", QueueSettings())(lambda session: None)
    reg.freeze()
    made = reg.match("jobs.a")
    assert made is not None
    q = e.queue_of("jobs.a", made[0], reg)  # a consumer's SUBSCRIBE, or a client's PUBLISH
    kept = e.queue_named("jobs.b", reg)  # the application's
    s = e.open_session()
    sub = e.subscribe_queue(s, q, 1, None)
    e.enqueue(q, {"n": 1}, item_id="k1")
    clock.now += 100
    assert e.retire(clock.now, never) == 0  # consumed
    e.unsubscribe(s, sub.number)
    clock.now += 31
    assert e.retire(clock.now, never) == 0  # an item waits (given back by the consumer)
    q.ready.clear()
    assert e.retire(clock.now, never) == 0  # k1 is inside the dedup window (10 minutes)
    clock.now += 600
    assert e.retire(clock.now, never) == 1
    assert "jobs.a" not in e.queues and set(e.queues) == {"jobs.b", "dead"}
    assert kept is e.queues["jobs.b"]
    assert e.lifetimes.per_channel == {"jobs.{x}": 1, "dead": 1}
    e.queue_of("jobs.c", made[0], reg)  # room again in the channel (max_topics 2)
    with pytest.raises(ProtocolError):
        e.queue_of("jobs.d", made[0], reg)
