"""Presence across nodes through a real Redis (``RedisBroker``, presence.py).

Two nodes share one ``redis-server``; users subscribe on either (several sessions of one user
on both), and watchers on each node must see one member per user with every node's sessions
added up, the count, leaves, and a dead node's members gone within ``node_timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis
from starlette.requests import HTTPConnection

from rubris_asgi import Config, Rubris, Session, Timing
from rubris_asgi.client import Client
from rubris_asgi.cluster import RedisBroker
from rubris_asgi.cluster.redis import presence_lua
from rubris_asgi.engine.keyed.presence import member_of

from .apps import starlette_app
from .lbkit import Balancer
from .rediskit import RedisServer, redis_server  # noqa: F401 (the fixture)
from .server import run_server

pytestmark = pytest.mark.redis

NODE_TIMEOUT = 3.0


@pytest.fixture
def url(redis_server: RedisServer) -> str:  # noqa: F811 (the fixture)
    redis_server.flush()
    return redis_server.url


def user_of(conn: HTTPConnection) -> str | None:
    return conn.headers.get("x-user")


def presence_node(url: str) -> Rubris:
    rubris = Rubris(
        Config(timing=Timing(poll_timeout=1.0, session_timeout=5.0)),
        broker=RedisBroker(url, node_timeout=NODE_TIMEOUT),
        batches=False,
        authenticate=user_of,
    )

    @rubris.shared(
        "room.{id}", snapshot=True, presence=True, presence_info=lambda s: {"user": s.user}
    )
    async def room(session: Session, id: str) -> Any:  # noqa: A002
        return {"room": id}

    @rubris.shared("lobby.{id}", snapshot=True, presence="count")
    async def lobby(session: Session, id: str) -> Any:  # noqa: A002
        return {"lobby": id}

    return rubris


@contextlib.asynccontextmanager
async def nodes(url: str) -> AsyncIterator[list[tuple[Rubris, str]]]:
    rubrises = [presence_node(url) for _ in range(2)]
    async with contextlib.AsyncExitStack() as stack:
        bases = [await stack.enter_async_context(run_server(starlette_app(r))) for r in rubrises]
        yield [(r, b + "/rubris") for r, b in zip(rubrises, bases, strict=True)]


async def until(cond: Any, what: str, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not reached in {timeout} s: {what}")


def client(base: str, user: str | None = None, **kw: Any) -> Client:
    return Client(base, headers={"x-user": user} if user else None, **kw)


def sessions(members: Any) -> dict[str, int]:
    return {m: v["sessions"] for m, v in members.items()}


async def test_members_are_every_nodes_sessions_added_up(url: str) -> None:
    """Alice on both nodes (two tabs on A, one on B) is one member with three sessions, her
    info from the hook; an anonymous session is a member of its own; the count says as much;
    a leave on one node takes a session off, the last one the member."""
    async with nodes(url) as [(_a, url_a), (b, url_b)]:
        async with contextlib.AsyncExitStack() as stack:
            watch_a = await stack.enter_async_context(client(url_a))
            watch_b = await stack.enter_async_context(client(url_b))
            pa = await watch_a.presence("room.1")
            pb = await watch_b.presence("room.1")
            count = await watch_b.presence_count("room.1")
            users = []
            for user, base in (("alice", url_a), ("alice", url_a), ("alice", url_b)):
                users.append(await stack.enter_async_context(client(base, user)))
            users.append(await stack.enter_async_context(client(url_b, "bob")))
            anon = await stack.enter_async_context(client(url_a))
            subs = [await c.subscribe("room.1") for c in (*users, anon)]
            assert anon.session_id is not None
            nobody = member_of(None, anon.session_id)
            want = {"alice": 3, "bob": 1, nobody: 1}
            await until(lambda: sessions(pa.members) == want == sessions(pb.members), "members")
            assert pa.members["alice"]["info"] == {"user": "alice"}
            assert pb.members[nobody]["info"] == {"user": None}
            await until(lambda: (count.members, count.sessions) == (3, 5), "the count")
            await users[2].unsubscribe(subs[2])  # alice's tab on B leaves
            await until(lambda: sessions(pb.members)["alice"] == 2, "a session less")
            session = b.engine.sessions[users[3].session_id]  # type: ignore[index]
            b.engine.end_session(session)  # bob's session ends: his last
            want = {"alice": 2, nobody: 1}
            await until(lambda: sessions(pa.members) == want == sessions(pb.members), "bob gone")
            await until(lambda: (count.members, count.sessions) == (2, 3), "counted")
            hidden = await watch_a.presence_count("lobby.1")
            await users[0].subscribe("lobby.1")
            await until(lambda: (hidden.members, hidden.sessions) == (1, 1), "count-only")


async def test_a_resume_on_its_node_is_neither_a_leave_nor_a_join(url: str) -> None:
    async with nodes(url) as [(_a, url_a), (_b, url_b)]:
        base_a = url_a.removesuffix("/rubris")
        async with client(url_b) as watcher, Balancer([base_a]) as lb:
            changes: list[tuple[str, str]] = []
            p = await watcher.presence(
                "room.2",
                on_join=lambda m, v: changes.append(("join", m)),
                on_leave=lambda m, v: changes.append(("leave", m)),
            )
            async with client(lb.base + "/rubris", "carol", backoff=(0.05, 0.2)) as c:
                await c.subscribe("room.2")
                await until(lambda: "carol" in p.members, "carol joined")
                lb.cut()
                await until(lambda: c.stats.reconnects == 1 and c.state == "open", "resumed")
                assert c.resumed
                await asyncio.sleep(0.3)  # a batch's time: a leave would have come
                assert changes == [("join", "carol")] and sessions(p.members) == {"carol": 1}


@pytest.mark.slow
async def test_a_killed_nodes_members_are_gone_within_node_timeout(url: str) -> None:
    """Node A stops without a word (no heartbeat, no presence write, no leave): B takes its
    members away once its heartbeat is older than ``node_timeout`` less a beat, within
    ``node_timeout`` of the kill; B's own members stay."""
    async with nodes(url) as [(a, url_a), (b, url_b)]:
        async with (
            client(url_a, "alice") as ca,
            client(url_a, "dave") as cd,
            client(url_b, "alice") as cb,
            client(url_b) as watcher,
        ):
            for c in (ca, cd, cb):
                await c.subscribe("room.3")
            p = await watcher.presence("room.3")
            await until(lambda: sessions(p.members) == {"alice": 2, "dave": 1}, "members")
            broker = a.broker
            assert isinstance(broker, RedisBroker)
            tasks = [*broker.queues._tasks, *broker.presence._tasks]
            for task in tasks:  # as a killed process: no beat, no write, no leave
                task.cancel()
            killed = time.monotonic()
            await until(lambda: sessions(p.members) == {"alice": 1}, "A's members gone", 10)
            took = time.monotonic() - killed
            assert 0.8 < took <= NODE_TIMEOUT + 0.3, took  # + a script's and a frame's time
            assert b.broker.presence.swept == 1  # type: ignore[attr-defined]
            broker.queues._tasks = []  # cancelled above: nothing to wait for at the stop
            print(f"a killed node's members gone after {took:.2f} s")


@pytest.mark.slow
async def test_a_node_taken_for_dead_and_back_writes_its_members_again(url: str) -> None:
    """A's heartbeat stops past the lapse (paused): B takes A's members away; A beats again,
    learns Redis holds none of its members, and writes them all again."""
    async with nodes(url) as [(a, url_a), (_b, url_b)]:
        async with client(url_a, "erin") as ce, client(url_b) as watcher:
            await ce.subscribe("room.4")
            p = await watcher.presence("room.4")
            await until(lambda: "erin" in p.members, "erin")
            broker = a.broker
            assert isinstance(broker, RedisBroker)
            beat = broker.queues._tasks[2]
            assert beat.get_name() == "rubris-queues-beat"
            beat.cancel()
            await until(lambda: "erin" not in p.members, "taken for dead", 10)
            broker.queues._tasks[2] = asyncio.create_task(broker.queues._beat_loop())
            await until(lambda: sessions(p.members) == {"erin": 1}, "written again", 10)
            assert p.members["erin"]["info"] == {"user": "erin"}


@pytest.mark.slow
async def test_a_redis_stall_past_node_timeout_takes_nobody_for_dead() -> None:
    """Redis sleeps longer than ``node_timeout``: nobody beat meanwhile, so when it wakes no
    node is taken for dead and no member leaves."""
    with RedisServer(args=("--enable-debug-command", "local")) as server:
        async with nodes(server.url) as [(_a, url_a), (_b, url_b)]:
            async with client(url_a, "fay") as cf, client(url_b) as watcher:
                await cf.subscribe("room.5")
                left: list[str] = []
                p = await watcher.presence("room.5", on_leave=lambda m, v: left.append(m))
                await until(lambda: "fay" in p.members, "fay")
                await _debug_sleep(server.port, NODE_TIMEOUT + 1.5)
                await asyncio.sleep(2.5)  # beats and sweeps of both nodes after it
                assert not left and sessions(p.members) == {"fay": 1}


@pytest.mark.slow
async def test_members_are_written_again_after_redis_lost_them() -> None:
    """Redis restarted without its data: each node finds its members gone and writes them
    again; watchers are told the topic restarted and see every member again."""
    with RedisServer(appendonly=False) as server:
        async with nodes(server.url) as [(_a, url_a), (_b, url_b)]:
            async with (
                client(url_a, "gus") as cg,
                client(url_b, "gus") as cg2,
                client(url_b, "hal") as ch,
                client(url_a) as watcher,
            ):
                for c in (cg, cg2, ch):
                    await c.subscribe("room.6")
                p = await watcher.presence("room.6")
                count = await watcher.presence_count("room.6")
                want = {"gus": 2, "hal": 1}
                await until(lambda: sessions(p.members) == want, "members")
                server.kill()
                server.restart()
                await until(lambda: watcher.stats.restarted >= 1, "the watcher told", 10)
                await until(lambda: sessions(p.members) == want, "written again", 10)
                await until(lambda: (count.members, count.sessions) == (2, 3), "counted")


async def test_a_thousand_sessions_joining_and_leaving_on_two_nodes_converge(url: str) -> None:
    """1,000 sessions of 300 users join across two nodes at once, then half of them end: the
    members a watcher sees converge on the truth, in batches, not a round trip a session."""
    async with nodes(url) as [(a, _), (b, url_b)]:
        async with client(url_b) as watcher:
            p = await watcher.presence("room.9")
            count = await watcher.presence_count("room.9")
            opened = []
            began = time.monotonic()
            for i in range(1000):
                node = a if i % 2 else b
                s = node.engine.open_session(owner=f"u{i % 300}")
                ch, _ = node.registry.match("room.9")  # type: ignore[misc]
                node.engine.subscribe(s, node.engine.topic_of("room.9", ch), 1, 0, 0)
                opened.append((node, s))
            want = {f"u{i}": len(range(i, 1000, 300)) for i in range(300)}
            await until(lambda: sessions(p.members) == want, "1,000 joined", 10)
            joined = time.monotonic() - began
            began = time.monotonic()
            for node, s in opened[::2]:
                node.engine.end_session(s)
            for i, (_, s) in enumerate(opened):
                if i % 2 == 0:
                    want[s.owner] -= 1
            want = {m: n for m, n in want.items() if n}
            await until(lambda: sessions(p.members) == want, "500 left", 10)
            await until(lambda: (count.members, count.sessions) == (len(want), 500), "counted")
            left = time.monotonic() - began
            print(f"presence: 1,000 joins seen in {joined:.3f} s, 500 leaves in {left:.3f} s")
            assert joined < 2.0 and left < 2.0


async def _debug_sleep(port: int, seconds: float) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    arg = f"{seconds:.3f}"
    writer.write(f"*3\r\n$5\r\nDEBUG\r\n$5\r\nSLEEP\r\n${len(arg)}\r\n{arg}\r\n".encode())
    try:
        reply = await asyncio.wait_for(reader.readline(), seconds + 10)
        assert reply.startswith(b"+OK"), reply
    finally:
        writer.close()


async def test_a_dead_nodes_members_go_a_budget_a_call_and_counts_are_idempotent(url: str) -> None:
    """The scripts alone: counts written twice count once; a dead node with more members than
    one sweep takes away goes in several calls, each bounded, every member and the count
    taken away in the end."""
    async with Redis.from_url(url) as r:
        counts = r.register_script(presence_lua.COUNTS)
        sweep = r.register_script(presence_lua.SWEEP)
        sec, usec = await r.time()
        now = sec * 1000 + usec // 1000
        await r.zadd("rubris:nodes", {"dead": now, "live": now})
        await r.set("rubris:beat", now)
        n = presence_lua.BUDGET + presence_lua.BUDGET // 2
        batch: list[Any] = ["room.z", n]
        for i in range(n):
            batch += [f"m{i}", 2, b'{"i":%d}' % i]
        fixed = ["rubris:", "dead", 60_000, "77", 120_000, 1_000_000]
        assert await counts(args=[*fixed, 1, *batch]) == 1
        assert await counts(args=[*fixed, 0, *batch]) == 1  # sent again: the same counts
        assert await r.get("rubris:ps:room.z") == str(2 * n).encode()
        assert await r.hlen("rubris:kv:room.z@presence") == n
        await r.zadd("rubris:nodes", {"dead": now - 10_000})  # silent past the lapse
        args = ["rubris:", "live", 3000, 1500, 60_000, "77", 120_000, 1_000_000]
        first = await sweep(args=args)
        assert first[2] == 1 and first[1] == 0  # more to take away
        assert await r.hlen("rubris:pt:room.z") == n - presence_lua.BUDGET
        second = await sweep(args=args)
        assert second[1:] == [1, 0]
        assert await r.hlen("rubris:pt:room.z") == 0 and await r.get("rubris:ps:room.z") == b"0"
        assert not await r.sismember("rubris:pn", "dead")
        count = await r.hget("rubris:t:room.z@count", "v")
        assert count is not None and count.endswith(b'{"members":0,"sessions":0}')
        assert await counts(args=[*fixed, 0, *batch]) == 0  # swept: it must register again
