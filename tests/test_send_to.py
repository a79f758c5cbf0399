"""``Rubris.send_to`` says exactly what happened: the seq (queued, once), a refusal (certainly
not queued), or ``DeliveryUnknown`` (perhaps queued); and a retry with the same ``key`` queues
a message at most once, on this node as on another.

Two nodes run in this loop (two ``Rubris`` on two uvicorn servers) on a real ``redis-server``;
the receiving client is the Python client on a WebSocket to the session's node, which is how
every delivery is counted. A Redis stall is the server process stopped (SIGSTOP) and continued
(SIGCONT): what ``DEBUG SLEEP`` does, without needing ``--enable-debug-command``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

from rubris_asgi import (
    BrokerUnavailable,
    DeliveryUnknown,
    QueueFull,
    Rubris,
    RubrisError,
    Session,
    SessionClosed,
)
from rubris_asgi.client import Client
from rubris_asgi.cluster import RedisBroker
from rubris_asgi.cluster import sends as remote_module

from .apps import make_rubris, starlette_app
from .rediskit import RedisServer, redis_server  # noqa: F401 (the fixture)
from .server import run_server

pytestmark = pytest.mark.redis  # every test here runs a real redis-server

MAIL = 4096
"""The capacity of the ``mail`` private channel: room for every send of a test."""


@pytest.fixture
def url(redis_server: RedisServer) -> str:  # noqa: F811 (the fixture)
    redis_server.flush()
    return redis_server.url


def app_rubris(**overrides: Any) -> Rubris:
    """tests/apps.py's app (``inbox``: a private channel of 16) and ``mail`` (of 4096)."""
    r = make_rubris(**overrides)

    @r.private("mail", queue=MAIL)
    async def mail(session: Session) -> None:
        return None

    return r


@contextlib.asynccontextmanager
async def nodes(url: str, **broker: Any) -> AsyncIterator[list[tuple[Rubris, str]]]:
    rubrises = [app_rubris(broker=RedisBroker(url, **broker), batches=False) for _ in range(2)]
    async with contextlib.AsyncExitStack() as stack:
        bases = [await stack.enter_async_context(run_server(starlette_app(r))) for r in rubrises]
        yield list(zip(rubrises, bases, strict=True))


async def until(cond: Any, what: str, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not reached in {timeout} s: {what}")


async def collect(c: Client, name: str) -> list[tuple[int, Any]]:
    got: list[tuple[int, Any]] = []
    await c.subscribe(name, lambda value, info: got.append((info.seq, value)))
    return got


def holding(base: str) -> Client:
    """A client that acknowledges nothing by itself: its queue fills and stays full."""
    return Client(base + "/rubris", ack_every=1_000_000, ack_interval=3600.0)


async def test_200_concurrent_sends_to_another_node_are_each_queued_once(url: str) -> None:
    """200 concurrent ``send_to`` from node B to a session on node A all return, each with
    its own seq, and the client gets each message once; the same 200 again with the same keys
    return the same seqs and queue nothing. (Before: 101 raised ``BrokerUnavailable`` at once,
    from the 100-connection pool, and were not retried; and there were no keys.)"""
    async with nodes(url) as [(a, base_a), (b, _)]:
        async with Client(base_a + "/rubris") as c:
            got = await collect(c, "mail")
            sid = c.session_id
            assert sid is not None and sid in a.engine.sessions
            sends = [b.send_to(sid, "mail", {"n": i}, key=f"m{i}") for i in range(200)]
            seqs = await asyncio.gather(*sends, return_exceptions=True)
            failed = [s for s in seqs if isinstance(s, BaseException)]
            assert failed == [], f"{len(failed)} raised, first: {failed[0]!r}"
            assert sorted(seqs) == list(range(1, 201))  # type: ignore[type-var]
            await until(lambda: len(got) == 200, "200 messages")
            assert {seq: v["n"] for seq, v in got} == dict(zip(seqs, range(200), strict=True))
            again = [b.send_to(sid, "mail", {"n": i}, key=f"m{i}") for i in range(200)]
            assert await asyncio.gather(*again) == seqs
            assert await b.send_to(sid, "mail", {"n": 200}) == 201  # no key: a new message
            await until(lambda: len(got) == 201, "the 201st")
            await asyncio.sleep(0.2)
            assert len(got) == 201


async def test_queue_full_across_nodes_means_never_queued(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send that waits past the wait for room raises ``QueueFull``, and the home has given
    up: when room frees afterwards the message is not queued after all. (Before: only the
    asking node gave up; the home kept waiting and queued the message once room came, so a
    sender told "full" that retried sent it twice.)"""
    monkeypatch.setattr(remote_module, "SEND_TIMEOUT", 0.5)
    async with nodes(url) as [(a, base_a), (b, _)]:
        async with holding(base_a) as c:
            got = await collect(c, "inbox")
            sid = c.session_id
            assert sid is not None
            assert [await b.send_to(sid, "inbox", {"n": i}) for i in range(16)] == list(
                range(1, 17)
            )
            await until(lambda: len(got) == 16, "16 messages, unacknowledged")
            loop = asyncio.get_running_loop()
            start = loop.time()
            with pytest.raises(QueueFull):
                await b.send_to(sid, "inbox", {"n": "refused"}, key="r")
            assert 0.5 <= loop.time() - start < 0.5 + remote_module.REPLY_GRACE
            q = a.engine.sessions[sid].private("inbox")
            assert q is not None
            q.ack(16)  # what the client's ACK does: room for 16 more
            await asyncio.sleep(0.3)
            assert await b.send_to(sid, "inbox", {"n": 16}, key="r") == 17  # the key was freed
            await until(lambda: len(got) == 17, "the 17th")
            await asyncio.sleep(0.2)
            assert [v["n"] for _, v in got] == list(range(17))  # "refused" never came


async def test_a_key_queues_once_for_a_session_on_this_node() -> None:
    """``send_to`` to a session of this node (no Redis at all): a repeated key returns the
    first seq and queues nothing, a repeat made while the first waits for room shares its
    outcome, and a send refused (``QueueFull``) leaves its key free for a retry."""
    r = app_rubris()
    async with run_server(starlette_app(r)) as base, holding(base) as c:
        got = await collect(c, "inbox")
        mail = await collect(c, "mail")
        sid = c.session_id
        assert sid is not None
        assert await r.send_to(sid, "inbox", {"n": 0}, key="k0") == 1
        assert await r.send_to(sid, "inbox", {"n": 0}, key="k0") == 1
        assert await r.send_to(sid, "inbox", {"n": 1}, key="k1") == 2
        assert await r.send_to(sid, "mail", {"n": 0}, key="k0") == 1  # keys are per channel
        for i in range(2, 16):
            assert await r.send_to(sid, "inbox", {"n": i}, key=f"k{i}") == i + 1
        await until(lambda: len(got) == 16 and len(mail) == 1, "16 + 1 messages")
        first = asyncio.create_task(r.send_to(sid, "inbox", {"n": 16}, key="k16"))
        repeat = asyncio.create_task(r.send_to(sid, "inbox", {"n": 16}, key="k16"))
        await asyncio.sleep(0.2)
        assert not first.done() and not repeat.done()  # the queue is full: both wait
        q = r.engine.sessions[sid].private("inbox")
        assert q is not None
        q.ack(16)
        assert await first == await repeat == 17
        await until(lambda: len(got) == 17, "the 17th of inbox")
        await until(lambda: len(q.unacked) == 1, "sent")
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(remote_module, "SEND_TIMEOUT", 0.3)
            for _ in range(15):
                await r.send_to(sid, "inbox", {"n": "filler"})
            await until(lambda: len(got) == 32, "the fillers sent")
            with pytest.raises(QueueFull):
                await r.send_to(sid, "inbox", {"n": 32}, key="k32")
        q.ack(32)
        assert await r.send_to(sid, "inbox", {"n": 32}, key="k32") == 33
        await until(lambda: len(got) == 33, "the 33rd")
        await asyncio.sleep(0.2)
        assert [v["n"] for _, v in got if v["n"] != "filler"] == [*range(17), 32]
        assert len(got) == 33 and mail == [(1, {"n": 0})]
        with pytest.raises(ValueError):
            await r.send_to(sid, "inbox", 1, key="")


async def test_a_redis_stall_gives_exact_outcomes_and_keyed_retries_deliver_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Senders on node B keep sending to a session on node A while Redis stalls for 4 s. Each
    call returns (the message arrives once, with that seq), is refused (it never arrives), or
    raises ``DeliveryUnknown``; then every call not answered with a seq is sent again with its
    key until it is: every message arrives exactly once, and a message that had arrived
    answers its retry with the seq it arrived with. (Before: thousands raised, and hundreds of
    those had been delivered: a retry doubled them.)"""
    # short bounds so that the stall shows every outcome: Redis calls time out after 1 s, a
    # home's answer is awaited 2 + 1 s
    monkeypatch.setattr(remote_module, "SEND_TIMEOUT", 2.0)
    monkeypatch.setattr(remote_module, "REPLY_GRACE", 1.0)
    with RedisServer() as server:
        async with nodes(server.url, connect_timeout=1.0) as [(a, base_a), (b, _)]:
            async with Client(base_a + "/rubris") as c:
                got = await collect(c, "mail")
                sid = c.session_id
                assert sid is not None
                outcome: dict[str, int | BaseException] = {}
                sending = True

                async def sender(who: int) -> None:
                    i = 0
                    while sending:
                        key = f"{who}.{i}"
                        try:
                            outcome[key] = await b.send_to(sid, "mail", key, key=key)
                        except RubrisError as exc:
                            outcome[key] = exc
                        i += 1
                        # ~100 sends a second in all: the whole run stays within the keys a
                        # session remembers (KEYS_PER_SESSION, the newest 1,024), or a retry
                        # at the end would find its key forgotten, as documented (at 10 ms,
                        # 2,800 sends on a fast machine, and a keyed retry delivered twice)
                        await asyncio.sleep(0.2)

                senders = [asyncio.create_task(sender(w)) for w in range(20)]
                await asyncio.sleep(1.0)
                assert server.pid is not None
                os.kill(server.pid, signal.SIGSTOP)
                try:
                    await asyncio.sleep(4.0)
                finally:
                    os.kill(server.pid, signal.SIGCONT)
                await asyncio.sleep(1.0)
                sending = False
                await asyncio.wait_for(asyncio.gather(*senders), 15)
                await until(lambda: a.stats().broker.up and b.stats().broker.up, "Redis back")

                returned = {k: v for k, v in outcome.items() if isinstance(v, int)}
                unknown = [k for k, v in outcome.items() if isinstance(v, DeliveryUnknown)]
                refused = {
                    k: v
                    for k, v in outcome.items()
                    if isinstance(v, BaseException) and not isinstance(v, DeliveryUnknown)
                }
                kinds = Counter(type(v).__name__ for v in refused.values())
                print(
                    f"stall: {len(outcome)} sends, {len(returned)} returned, "
                    f"{len(refused)} refused {dict(kinds)}, {len(unknown)} unknown"
                )
                assert all(
                    isinstance(v, (SessionClosed, QueueFull, BrokerUnavailable))
                    for v in refused.values()
                ), kinds
                assert unknown or refused, "the stall changed nothing: the test tests nothing"
                assert len(outcome) < remote_module.KEYS_PER_SESSION  # the key window holds all
                await until(
                    lambda: {v for _, v in got} >= set(returned), "every returned message", 15
                )
                await asyncio.sleep(1.0)  # late arrivals of the unknown ones
                arrived = Counter(v for _, v in got)
                seq_of = {v: seq for seq, v in got}
                assert [k for k, n in arrived.items() if n > 1] == []
                assert all(seq_of[k] == seq for k, seq in returned.items())
                assert [k for k in refused if k in arrived] == []  # refused: never delivered
                print(f"stall: {sum(k in arrived for k in unknown)} of the unknown had arrived")

                for key in [*unknown, *refused]:
                    for _ in range(100):
                        try:
                            seq = await b.send_to(sid, "mail", key, key=key)
                            break
                        except RubrisError:
                            await asyncio.sleep(0.05)
                    else:
                        raise AssertionError(f"{key} never went through")
                    if key in seq_of:
                        assert seq == seq_of[key]  # it had arrived: the same seq, not again
                    returned[key] = seq
                await until(lambda: len(got) >= len(outcome), "every message", 15)
                await asyncio.sleep(0.3)
                arrived = Counter(v for _, v in got)
                assert arrived == Counter(list(outcome))  # every message exactly once
                assert {v: seq for seq, v in got} == returned


async def test_a_lost_answer_is_unknown_and_the_keyed_retry_returns_the_first_seq(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The home queues a waiting message while Redis is stalled, so its answer cannot go back:
    the asking node raises ``DeliveryUnknown`` (not a refusal: the message did arrive), and
    the retry with the same key, once Redis is back, answers the seq it arrived with and
    queues nothing. (Before: ``BrokerUnavailable``, "not sent", for a delivered message.)"""
    monkeypatch.setattr(remote_module, "SEND_TIMEOUT", 3.0)
    monkeypatch.setattr(remote_module, "REPLY_GRACE", 1.0)
    with RedisServer() as server:
        async with nodes(server.url, connect_timeout=1.0) as [(a, base_a), (b, _)]:
            async with holding(base_a) as c:
                got = await collect(c, "inbox")
                sid = c.session_id
                assert sid is not None
                for i in range(16):
                    await b.send_to(sid, "inbox", {"n": i})
                await until(lambda: len(got) == 16, "16 messages, unacknowledged")
                waiting = asyncio.create_task(b.send_to(sid, "inbox", {"n": 16}, key="late"))
                await asyncio.sleep(0.5)  # the request is at the home, waiting for room
                assert not waiting.done()
                assert server.pid is not None
                os.kill(server.pid, signal.SIGSTOP)
                try:
                    q = a.engine.sessions[sid].private("inbox")
                    assert q is not None
                    q.ack(16)  # room: the home queues it, and cannot answer through Redis
                    await until(lambda: len(got) == 17, "the 17th, straight over the socket")
                    with pytest.raises(DeliveryUnknown):
                        await asyncio.wait_for(waiting, 6.0)
                finally:
                    os.kill(server.pid, signal.SIGCONT)
                for _ in range(100):
                    try:
                        seq = await b.send_to(sid, "inbox", {"n": 16}, key="late")
                        break
                    except (BrokerUnavailable, DeliveryUnknown, SessionClosed):
                        await asyncio.sleep(0.05)  # Redis coming back
                else:
                    raise AssertionError("the retry never went through")
                assert seq == got[-1][0] == 17
                await asyncio.sleep(0.3)
                assert [v["n"] for _, v in got] == list(range(17))


async def test_disconnect_ends_a_users_sessions_on_every_node(url: str) -> None:
    """``Rubris.disconnect(user=...)`` asked on one node ends that user's sessions on both,
    and counts them; by session id, the session's own node ends it."""

    def who(conn: Any) -> Any:
        return conn.headers.get("x-user")

    rubrises = [
        app_rubris(broker=RedisBroker(url), batches=False, authenticate=who) for _ in range(2)
    ]
    async with contextlib.AsyncExitStack() as servers:
        b0, b1 = [await servers.enter_async_context(run_server(starlette_app(r))) for r in rubrises]
        r0, r1 = rubrises
        clients = [
            Client(f"{b}/rubris", transport="websocket", headers={"x-user": "carol"})
            for b in (b0, b1, b1)
        ]
        other = Client(f"{b0}/rubris", transport="websocket", headers={"x-user": "dave"})
        async with contextlib.AsyncExitStack() as stack:
            for c in (*clients, other):
                await stack.enter_async_context(c)
            await until(lambda: len(r1.engine.sessions) == 2, "both sessions on node 1")
            assert await r0.disconnect(user="carol", reason="logged out") == 3
            await until(
                lambda: (
                    not any(
                        s.owner == "carol" for r in (r0, r1) for s in r.engine.sessions.values()
                    )
                ),
                "carol's sessions ended everywhere",
            )
            assert [s.owner for s in r0.engine.sessions.values()] == ["dave"]
            dave = other.session_id
            assert dave is not None
            assert await r1.disconnect(session=dave) == 1
            await until(lambda: not r0.engine.sessions, "dave's session ended by node 1")


async def test_disconnect_with_redis_away_ends_what_it_can_and_says_what_it_could_not() -> None:
    """Redis killed: ``disconnect(user=...)`` still ends the user's sessions on this node, then
    raises ``BrokerUnavailable`` saying how many it ended and that other nodes are unknown; once
    Redis is back, a second call reaches the other node."""

    def who(conn: Any) -> Any:
        return conn.headers.get("x-user")

    with RedisServer() as srv:
        rubrises = [
            app_rubris(broker=RedisBroker(srv.url), batches=False, authenticate=who)
            for _ in range(2)
        ]
        async with contextlib.AsyncExitStack() as stack:
            b0, b1 = [
                await stack.enter_async_context(run_server(starlette_app(r))) for r in rubrises
            ]
            r0, r1 = rubrises
            for b in (b0, b1):
                c = Client(f"{b}/rubris", transport="websocket", headers={"x-user": "carol"})
                await stack.enter_async_context(c)
            await until(lambda: len(r0.engine.sessions) == len(r1.engine.sessions) == 1, "both")
            srv.kill()
            with pytest.raises(BrokerUnavailable, match="1 sessions ended here"):
                await r0.disconnect(user="carol")
            assert not r0.engine.sessions
            assert len(r1.engine.sessions) == 1  # not reached: the error says so
            srv.restart()
            for _ in range(200):  # the nodes' links come back; a call that raised may still
                try:  # have ended it there (its answer lost): a repeat is safe, and then says so
                    await r0.disconnect(user="carol")
                    break
                except BrokerUnavailable:
                    await asyncio.sleep(0.1)
            else:
                raise AssertionError("disconnect never reached the other node after the restart")
            await until(lambda: not r1.engine.sessions, "carol's other session ended")
