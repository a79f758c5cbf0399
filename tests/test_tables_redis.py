"""Keyed topics (live tables) across nodes through a real Redis (``RedisBroker``, tables.py).

Two nodes (two ``Rubris`` on two uvicorn servers in this loop) share one ``redis-server``;
clients hold tables with the Python client, whose ``Table`` must end equal to the table Redis
holds, or be told (RESET, UNSUBSCRIBED 11), whatever the faults.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from rubris_asgi import BrokerUnavailable, Config, Rubris, Session, TableFull, Timing
from rubris_asgi.client import Client
from rubris_asgi.client.table import Change
from rubris_asgi.cluster import RedisBroker
from rubris_asgi.cluster.redis.table_hearing import parse, record
from rubris_asgi.engine.engine import Engine
from rubris_asgi.engine.keyed.topic import KeyedTopic
from rubris_asgi.engine.membership import Change as MChange
from rubris_asgi.engine.membership import Membership
from rubris_asgi.protocol import Entry, EntryOp, Mode
from rubris_asgi.protocol.deflate import inflate

from .apps import starlette_app
from .enginekit import FakeClock, connect
from .lbkit import Balancer
from .rediskit import RedisServer, redis_server  # noqa: F401 (the fixture)
from .server import run_server

pytestmark = pytest.mark.redis

LONG = "x" * 200
"""Makes a value worth deflating (compress_at 64) and a patch worth sending."""


@pytest.fixture
def url(redis_server: RedisServer) -> str:  # noqa: F811 (the fixture)
    redis_server.flush()
    return redis_server.url


TOKEN = "t0ken"


def table_node(url: str, **broker: Any) -> Rubris:
    rubris = Rubris(
        Config(timing=Timing(poll_timeout=1.0, session_timeout=5.0)),
        broker=RedisBroker(url, node_timeout=3.0, **broker),
        batches=False,
        compress_at=64,
        api_token=TOKEN,
    )

    @rubris.shared("book.{sym}", keyed=True)
    async def book(session: Session, sym: str) -> None:
        return None

    @rubris.shared("small.{name}", keyed=True, max_keys=3)
    async def small(session: Session, name: str) -> None:
        return None

    return rubris


@contextlib.asynccontextmanager
async def nodes(url: str, **broker: Any) -> AsyncIterator[list[tuple[Rubris, str]]]:
    """Two nodes sharing the Redis at ``url``: (rubris, base URL of its mount) each."""
    rubrises = [table_node(url, **broker) for _ in range(2)]
    async with contextlib.AsyncExitStack() as stack:
        bases = [await stack.enter_async_context(run_server(starlette_app(r))) for r in rubrises]
        yield [(r, b + "/rubris") for r, b in zip(rubrises, bases, strict=True)]


async def until(cond: Any, what: str, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not reached in {timeout} s: {what}")


async def redis_table(url: str, name: str) -> tuple[int, dict[str, Any]]:
    """The head and the live entries of ``name`` as Redis holds them."""
    async with Redis.from_url(url) as r:
        head = int(await r.hget(f"rubris:t:{name}", "s") or 0)
        out = {}
        for key, rec in (await r.hgetall(f"rubris:kv:{name}")).items():
            _, _, _, data, compressed, _ = record(key.decode(), rec)
            if data is not None:
                out[key.decode()] = orjson.loads(inflate(data, 1 << 20) if compressed else data)
        return head, out


def ops(changes: list[Change]) -> list[str]:
    return [c.op for c in changes]


async def test_a_table_changed_on_either_node_is_the_same_everywhere(url: str) -> None:
    """Changes made on both nodes (set, patch, delete, replace; deflated values, patches)
    reach a subscriber on each node, numbered once: the same seqs, the same table, equal to
    the one a subscriber that comes later reads, and to what any node reads back."""
    async with nodes(url) as [(a, url_a), (b, url_b)]:
        async with Client(url_a) as ca, Client(url_b) as cb:
            seen_a: list[Change] = []
            seen_b: list[Change] = []
            ta = await ca.subscribe_table("book.X", seen_a.append)
            tb = await cb.subscribe_table("book.X", seen_b.append)
            await ta.wait_synced(timeout=5)
            await tb.wait_synced(timeout=5)
            assert ta.epoch == tb.epoch != 0
            want: dict[str, Any] = {}
            assert await a.set_async("book.X", "bid", {"px": 100, "qty": 1, "note": LONG}) == 1
            want["bid"] = {"px": 100, "qty": 1, "note": LONG}
            assert await b.set_async("book.X", "bid", want["bid"]) == 1  # held already
            await until(lambda: tb.table.seq == 1, "seq 1 on B")
            assert await b.set_async("book.X", "bid", {"px": 101, "qty": 1, "note": LONG}) == 2
            want["bid"] = {"px": 101, "qty": 1, "note": LONG}
            for i in range(10):  # fire and forget, from both nodes
                (a if i % 2 else b).set("book.X", f"k{i}", {"i": i})
                want[f"k{i}"] = {"i": i}
            assert await a.patch_async("book.X", "bid", {"qty": 5}) > 2
            want["bid"]["qty"] = 5
            assert await b.delete_async("book.X", "k3") is not None
            del want["k3"]
            assert await a.delete_async("book.X", "k3") is None  # deleted already
            assert await a.delete_async("book.X", "never") is None
            await until(lambda: dict(ta.table) == want == dict(tb.table), "the same table")
            head = ta.table.seq
            assert head == tb.table.seq == (await redis_table(url, "book.X"))[0]
            replaced = {"bid": {**want["bid"], "qty": 6}, "k1": {"i": 1}, "new": [1, 2]}
            seq = await b.replace_async("book.X", replaced)
            await until(lambda: dict(ta.table) == replaced == dict(tb.table), "replaced")
            assert seq == ta.table.seq == tb.table.seq
            # the replace's differences only: 8 deletes, bid and new set; k1 as it was
            after = [c for c in seen_a if c.seq > head]
            assert sorted(c.key for c in after if c.op == "delete") == sorted(
                k for k in want if k not in replaced
            )
            assert sorted(c.key for c in after if c.op in ("set", "patch")) == ["bid", "new"]

            # the same seq for the same change on both nodes; patches were sent
            def changes(seen: list[Change]) -> set[tuple[int, str, str]]:
                return {(c.seq, c.key, c.op) for c in seen if c.op not in ("synced", "reset")}

            assert changes(seen_a) == changes(seen_b)
            assert "patch" in ops(seen_a)
            async with Client(url_a) as late:
                tl = await late.subscribe_table("book.X")
                await tl.wait_synced(timeout=5)
                assert dict(tl.table) == replaced and tl.table.seq == seq
            assert await a.entries_async("book.X") == replaced == await b.entries_async("book.X")
            assert a.stats().broker.changes_refused == b.stats().broker.changes_refused == 0


async def test_any_node_reads_a_table_nobody_follows_from_redis(url: str) -> None:
    async with nodes(url) as [(a, _), (b, url_b)]:
        await a.replace_async("book.R", {"x": {"n": 1}, "y": {"n": 2}})
        await a.set_async("book.R", "z", {"n": 3})
        await a.delete_async("book.R", "x")
        assert b.entries("book.R") == {}  # B does not follow it
        assert await b.entries_async("book.R") == {"y": {"n": 2}, "z": {"n": 3}}
        async with Client(url_b) as c:
            t = await c.subscribe_table("book.R")
            await t.wait_synced(timeout=5)
            assert dict(t.table) == {"y": {"n": 2}, "z": {"n": 3}} and t.table.seq == 4


async def test_a_client_recovers_its_table_on_another_node_exactly(url: str) -> None:
    """Its session gone with node A's connection, the client starts a new session on node B
    and subscribes again with its epoch and seq: B (which never followed the topic) sends
    the keys changed since, deletes included, and nothing else."""
    async with nodes(url) as [(a, url_a), (b, url_b)]:
        base_a, base_b = url_a.removesuffix("/rubris"), url_b.removesuffix("/rubris")
        async with Balancer([base_a, base_b]) as lb:
            async with Client(lb.base + "/rubris", backoff=(0.05, 0.2)) as c:
                seen: list[Change] = []
                t = await c.subscribe_table("book.M", seen.append)
                for i in range(6):
                    await a.set_async("book.M", f"k{i}", {"v": i})
                await until(lambda: t.table.seq == 6, "six keys")
                epoch = t.epoch
                lb.route(1)
                lb.cut()
                await until(lambda: c.state != "open", "the cut seen")
                a.engine.end_session(a.engine.sessions[c.session_id])  # type: ignore[index]
                assert not b.broker.follows("book.M")
                await b.set_async("book.M", "k1", {"v": 10})  # while the client is away
                await b.delete_async("book.M", "k2")
                await a.patch_async("book.M", "k4", {"w": 4})
                await until(lambda: c.state == "open" and t.table.seq == 9, "recovered on B")
                assert not c.resumed and t.recovered and t.epoch == epoch
                assert dict(t.table) == {
                    "k0": {"v": 0},
                    "k1": {"v": 10},
                    "k3": {"v": 3},
                    "k4": {"v": 4, "w": 4},
                    "k5": {"v": 5},
                }
                again = [(x.op, x.key) for x in seen if x.seq > 6]
                assert again == [("set", "k1"), ("delete", "k2"), ("set", "k4"), ("synced", "")]
                await a.set_async("book.M", "k9", 9)  # still one table
                await until(lambda: t.table.get("k9") == 9, "a change on A after the move")


async def test_patches_of_one_key_from_two_nodes_all_take_effect(url: str) -> None:
    """Merges of one key made at once on both nodes, on copies that are behind: each is made
    again on the latest value Redis holds, so every field lands; and one node's changes keep
    their order (a set after a merge sent back is held back behind it)."""
    async with nodes(url) as [(a, url_a), (b, _)]:
        async with Client(url_a) as c:
            t = await c.subscribe_table("book.P")
            await a.set_async("book.P", "k", {"base": 0})
            waits = []
            for i in range(20):
                for name, n in (("a", a), ("b", b)):
                    if i % 2:
                        n.patch("book.P", "k", {f"{name}{i}": i})  # fire and forget
                    else:
                        waits.append(n.patch_async("book.P", "k", {f"{name}{i}": i}))
            await asyncio.gather(*waits)
            want = {"base": 0, **{f"{x}{i}": i for i in range(20) for x in "ab"}}
            await until(lambda: t.table.get("k") == want, "every field")
            assert await b.entries_async("book.P") == {"k": want}
            # B's copy is behind A's change; its merge is sent back, its set waits behind it
            await a.set_async("book.P", "o", {"z": 0})
            b.patch("book.P", "o", {"x": 1})
            b.set("book.P", "o", {"y": 1})
            assert await b.set_async("book.P", "last", 1) > 0
            await until(lambda: t.table.get("o") == {"y": 1} and "last" in t.table, "in order")
            assert a.stats().broker.changes_refused + b.stats().broker.changes_refused == 0


async def test_max_keys_is_the_tables_across_nodes(url: str) -> None:
    """A keyed topic of ``max_keys`` 3 filled from both nodes: a new key past it is refused
    wherever it is set (``TableFull`` to who awaits; counted and logged otherwise), a key
    held may still change, a freed place may be taken."""
    async with nodes(url) as [(a, url_a), (b, _)]:
        async with Client(url_a) as c:
            t = await c.subscribe_table("small.s")
            await a.set_async("small.s", "k1", 1)
            await b.set_async("small.s", "k2", 2)
            await a.set_async("small.s", "k3", 3)
            with pytest.raises(TableFull, match="max_keys"):
                await b.set_async("small.s", "k4", 4)
            with pytest.raises(TableFull):
                await b.replace_async("small.s", {f"r{i}": i for i in range(4)})
            b.set("small.s", "k5", 5)  # nobody waits: counted, logged
            await until(lambda: b.stats().broker.changes_refused == 1, "counted")
            assert await b.set_async("small.s", "k1", 10) > 0  # held: not a new key
            await a.delete_async("small.s", "k2")
            assert await b.set_async("small.s", "k4", 4) > 0
            await until(lambda: dict(t.table) == {"k1": 10, "k3": 3, "k4": 4}, "the table")
            assert await a.replace_async("small.s", {"x": 1, "y": 2, "z": 3}) > 0
            await until(lambda: dict(t.table) == {"x": 1, "y": 2, "z": 3}, "replaced")


@pytest.mark.slow
async def test_a_redis_restart_with_its_data_loses_no_change() -> None:
    """Redis stopped while both nodes change a table (refused meanwhile, clearly) and started
    again with its data: the subscribers stay subscribed under the same epoch and end with
    Redis's table, every change accepted in it."""
    with RedisServer(persist=True) as server:
        async with nodes(server.url) as [(a, url_a), (b, url_b)]:
            async with Client(url_a) as ca, Client(url_b) as cb:
                ta = await ca.subscribe_table("book.D")
                tb = await cb.subscribe_table("book.D")
                want: dict[str, Any] = {}
                for i in range(5):
                    await a.set_async("book.D", f"k{i}", i)
                    want[f"k{i}"] = i
                server.kill()
                refused = 0
                for i in range(5, 60):
                    try:
                        (a if i % 2 else b).set("book.D", f"k{i % 8}", i)
                        want[f"k{i % 8}"] = i
                    except BrokerUnavailable:
                        refused += 1
                    await asyncio.sleep(0.005)
                assert refused > 20
                server.restart()
                await until(lambda: a.stats().broker.up and b.stats().broker.up, "reconnected")
                await b.delete_async("book.D", "k0")
                del want["k0"]
                await until(lambda: dict(ta.table) == want == dict(tb.table), "every change")
                assert (await redis_table(server.url, "book.D"))[1] == want
                assert ca.stats.restarted == cb.stats.restarted == 0
                assert ta.table.seq == tb.table.seq


async def test_a_redis_that_lost_the_table_restarts_its_subscribers() -> None:
    """Redis restarted without its data: the table starts again, empty, under a new epoch;
    the subscribers are told (UNSUBSCRIBED 11), subscribe again, and hold what follows."""
    with RedisServer(appendonly=False) as server:
        async with nodes(server.url) as [(a, url_a), (b, url_b)]:
            async with Client(url_a) as ca, Client(url_b) as cb:
                ta = await ca.subscribe_table("book.L")
                tb = await cb.subscribe_table("book.L")
                for i in range(5):
                    await a.set_async("book.L", f"k{i}", i)
                await until(lambda: len(ta.table) == len(tb.table) == 5, "five keys")
                epoch = ta.epoch
                server.kill()
                server.restart()
                await until(lambda: a.stats().broker.up and b.stats().broker.up, "reconnected")
                await until(lambda: ca.stats.restarted == cb.stats.restarted == 1, "told")
                await b.set_async("book.L", "after", 1)
                await until(lambda: dict(ta.table) == {"after": 1} == dict(tb.table), "afresh")
                assert ta.epoch == tb.epoch != epoch


@pytest.mark.slow
async def test_changes_made_while_redis_stalls_and_the_nodes_reconnect_all_arrive(
    url: str,
) -> None:
    """Redis answers nobody for 1.5 s and drops the nodes' subscriber connections: the
    changes made meanwhile wait in the outboxes, the nodes read what they missed (holes),
    and every subscriber ends with Redis's table."""
    async with nodes(url) as [(a, url_a), (b, url_b)]:
        async with Client(url_a) as ca, Client(url_b) as cb:
            ta = await ca.subscribe_table("book.S")
            tb = await cb.subscribe_table("book.S")
            await a.set_async("book.S", "k0", 0)
            async with Redis.from_url(url) as r:
                await r.execute_command("CLIENT", "PAUSE", 1500, "ALL")
                await r.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            want = {"k0": 0}
            for i in range(1, 40):
                try:
                    (a if i % 2 else b).set("book.S", f"k{i % 12}", i)
                    want[f"k{i % 12}"] = i
                except BrokerUnavailable:
                    pass
                await asyncio.sleep(0.02)
            await until(lambda: a.stats().broker.up and b.stats().broker.up, "answering")
            await a.delete_async("book.S", "k0")
            del want["k0"]
            await until(lambda: dict(ta.table) == want == dict(tb.table), "every change", 15)
            assert (await redis_table(url, "book.S"))[1] == want


async def test_a_node_behind_a_forgotten_delete_reads_the_table_whole_and_resets(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node B hears none of a run of changes (messages lost), during which Redis forgets
    tombstones beyond ``max_keys``: B cannot be told those deletes one by one, so it reads
    the table whole and its subscriber gets RESET and the whole table, equal to Redis's."""
    async with nodes(url) as [(a, _), (b, url_b)]:
        async with Client(url_b) as c:
            seen: list[Change] = []
            t = await c.subscribe_table("small.f", seen.append)
            for k in ("a", "b", "c"):
                await a.set_async("small.f", k, k)
            await until(lambda: len(t.table) == 3, "three keys")
            assert isinstance(b.broker, RedisBroker)
            tables = b.broker.tables
            heard = tables.heard
            monkeypatch.setattr(tables, "heard", lambda f, data: None)  # B hears nothing
            for k in ("a", "b", "c"):
                await a.delete_async("small.f", k)
            for k in ("d", "e"):
                await a.set_async("small.f", k, k)
                await a.delete_async("small.f", k)
            await a.set_async("small.f", "f", "f")  # its batch forgets the oldest tombstones
            async with Redis.from_url(url) as r:
                assert int(await r.hget("rubris:t:small.f", "f")) > t.table.seq
            monkeypatch.setattr(tables, "heard", heard)
            await a.set_async("small.f", "g", "g")  # heard: a hole, read, and a whole table
            await until(lambda: dict(t.table) == {"f": "f", "g": "g"}, "the table")
            assert "reset" in ops(seen) and b.stats().broker.tables_reset == 1
            assert t.table.seq == (await redis_table(url, "small.f"))[0]


async def test_changes_redis_numbered_again_after_losing_them_restart_the_table(
    url: str,
) -> None:
    """Redis forgets the last two changes a node heard (a failover to a replica that had not
    received them) and numbers a new change under one of their seqs: the node does not take
    it for the one it holds; the table goes on under a new epoch, its subscribers told."""
    async with nodes(url) as [(a, url_a), _]:
        async with Client(url_a) as c, Redis.from_url(url) as r:
            t = await c.subscribe_table("book.F")
            for i in range(1, 6):
                assert await a.set_async("book.F", f"k{i}", i) == i
            await until(lambda: t.table.seq == 5, "five changes")
            epoch = t.epoch
            await r.hset("rubris:t:book.F", mapping={"s": 3, "n": 3})  # k4, k5 lost
            await r.hdel("rubris:kv:book.F", "k4", "k5")
            await r.zrem("rubris:kl:book.F", "k4", "k5")
            assert await a.set_async("book.F", "k9", 9) == 4  # a seq the node holds
            await until(lambda: a.stats().broker.restarted == 1, "the topic restarted")
            await until(lambda: t.epoch != epoch and t.synced, "subscribed again")
            assert dict(t.table) == {"k1": 1, "k2": 2, "k3": 3, "k9": 9}
            assert c.stats.restarted == 1


def test_a_change_heard_is_read_back_whole() -> None:
    """The channel's form of a change (tables_lua.py): keys with colons, patches, deletes."""
    epoch, change = parse(b"77:5:a:b:c12:4:1:0:7:0:" + b'{"x":1}' + b'{"x":1,"y":2}')
    assert epoch == 77 and change == (12, "a:b:c", 4, b'{"x":1,"y":2}', False, (b'{"x":1}', False))
    assert record("k", b"13:12:3:0:0:0:") == (13, "k", 12, None, False, None)


def test_the_engine_prepares_changes_for_the_broker_and_stores_what_it_numbered() -> None:
    """The seam alone (membership.py): with a table relay joined, a change is prepared here
    (its PATCH from this node's copy, the seq of that copy as prev) and nothing is stored; a
    change numbered by the broker is stored with its seq, its PATCH kept only where this node
    holds the change it was made from; a table read whole resets the subscribers."""
    e = Engine(clock=FakeClock())
    t = e.topic("book", Mode.KEYED)
    assert isinstance(t, KeyedTopic)
    sent: list[MChange] = []
    e.join(Membership(lambda *a: 0, "n~", tables=lambda topic, c: sent.append(c)))
    value = {"px": 1, "note": LONG}
    e.apply_entries(t, 5, [(5, "k", 0, orjson.dumps(value), False, None)])
    assert t.seq == 5 and t.entries["k"].seq == 5
    assert e.set_entry(t, "k", {**value, "px": 2}) == 0 and t.seq == 5  # nothing stored
    (c,) = sent
    assert (c.op, c.key, c.prev, c.epoch) == ("S", "k", 5, t.epoch)
    assert c.patch is not None and orjson.loads(c.patch[0]) == {"px": 2}
    s, sink = connect(e)
    e.subscribe(s, t, 1, 0, 0)
    for _ in range(5):
        e.scheduler.run_cycle()
    sink.take()
    patch = (b'{"px":3}', False)
    full = orjson.dumps({**value, "px": 3})
    e.apply_entries(t, 9, [(9, "k", 5, full, False, patch)])  # made from seq 5: held here
    assert t.entries["k"].patch is not None and t.seq == 9
    e.apply_entries(t, 12, [(12, "k", 11, full, False, patch)])  # from 11: not held
    assert t.entries["k"].patch is None and t.entries["k"].seq == 12
    e.apply_entries(t, 20, [(14, "j", 0, b"1", False, None)], forgotten=13)
    assert t.seq == 20 and set(t.entries) == {"j"} and t.forgotten == 13
    for _ in range(5):
        e.scheduler.run_cycle()
    got = [(m.op, m.key) for f in sink.messages() for m in f if isinstance(m, Entry)]
    assert got[-3:] == [(EntryOp.RESET, ""), (EntryOp.SET, "j"), (EntryOp.SYNCED, "")]


async def test_the_http_api_changes_and_reads_a_table_of_every_node(url: str) -> None:
    """api/publish's keyed entries on one node are decided in Redis and read on the other
    (api/topics); a request that would take a table past max_keys with the keys another node
    made is a 409 naming the entry, nothing of it applied."""
    import httpx

    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with nodes(url) as [(a, url_a), (b, url_b)]:
        async with httpx.AsyncClient(base_url=url_a, headers=auth) as ha:
            entries = [
                {"topic": "book.H", "key": "bid", "data": {"px": 1, "note": LONG}},
                {"topic": "book.H", "key": "bid", "op": "patch", "data": {"px": 2}},
                {"topic": "book.H", "key": "ask", "data": {"px": 3}},
                {"topic": "book.H", "key": "ask", "op": "delete"},
            ]
            r = await ha.post("/api/publish", json=entries)
            assert r.status_code == 200 and r.json()["accepted"] == 4, r.text
            # another node's keys count: A plans on the table as Redis holds it (all or
            # nothing, as alone: the request's k3 is not applied either)
            await b.replace_async("small.H", {"k1": 1, "k2": 2})
            r = await ha.post(
                "/api/publish",
                json=[{"topic": "small.H", "key": "k3", "data": 3}]
                + [{"topic": "small.H", "key": "k4", "data": 4}],
            )
            assert r.status_code == 409 and r.json()["index"] == 1, r.text
        async with httpx.AsyncClient(base_url=url_b, headers=auth) as hb:
            got = (await hb.get("/api/topics/book.H")).json()
            assert got["mode"] == "keyed" and got["reset"] is True
            assert {e["key"]: e["data"] for e in got["entries"]} == {"bid": {"px": 2, "note": LONG}}
        assert await b.entries_async("small.H") == {"k1": 1, "k2": 2}
        assert await a.entries_async("book.H") == {"bid": {"px": 2, "note": LONG}}
