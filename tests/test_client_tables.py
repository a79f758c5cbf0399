"""Keyed topics, presence and max_rate (protocol.md section 5b): the Python client against a
real server, over WebSocket and long-poll.

The client's table must equal ``rubris.entries(name)`` whenever it has read to the topic's head:
after sets, patches (which must travel as PATCH), deletes and replaces; after a resume that lost
frames on the way (recovered, no RESET); after a new session; and after a RESET (the topic's
epoch restarted, or tombstones forgotten while the client was away), which empties the table
before the whole of it comes again. Presence: one member per user however many tabs, joins and
leaves told once the state is whole, a resume neither. ``max_rate``: frames of a topic never
closer than 1/r s, each with the latest state.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

import pytest
from starlette.requests import HTTPConnection

from rubris_asgi import Rubris, Session
from rubris_asgi.client import (
    Change,
    Client,
    PushInfo,
    SubscribeRejected,
    TableSubscription,
)
from rubris_asgi.engine.keyed.topic import KeyedTopic
from rubris_asgi.protocol import Entry, EntryOp, Hello, Subscribe, decode_frame, iter_messages

from .apps import make_rubris, starlette_app
from .server import run_server
from .test_resume_clients import LosingPolls

TRANSPORTS = ["websocket", pytest.param("longpoll", marks=pytest.mark.slow)]
"""Both transports in the full suite; the inner loop (``-m "core and not slow"``) keeps the
WebSocket's (long-poll's own tests cover its transport; these cover tables over it)."""
WAIT = 10.0
ROW = {"price": 101.25, "size": 300, "orders": 4, "venue": "XNAS", "side": "bid"}


async def until(cond: Callable[[], Any], what: str, timeout: float = WAIT) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.01)


def user_of(conn: HTTPConnection) -> Any:
    """The user is the X-User header; none is anonymous."""
    return conn.headers.get("x-user")


def tables_app(**overrides: Any) -> Rubris:
    rubris = make_rubris(authenticate=user_of, **overrides)

    @rubris.shared("book.{sym}", keyed=True)
    async def book(session: Session, sym: str) -> Any:
        return {"a": {"px": 1}, "b": {"px": 2}} if sym == "seeded" else None

    @rubris.shared("px.{sym}", snapshot=True)
    async def px(session: Session, sym: str) -> None:
        return None

    def info(session: Session) -> Any:
        return {"name": str(session.user).upper()}

    @rubris.shared("room.{rid}", snapshot=True, presence=True, presence_info=info)
    async def room(session: Session, rid: str) -> None:
        return None

    @rubris.shared("lobby.{rid}", snapshot=True, presence="count")
    async def lobby(session: Session, rid: str) -> None:
        return None

    return rubris


def head(rubris: Rubris, name: str) -> int:
    t = rubris.engine.topics[name]
    assert isinstance(t, KeyedTopic)
    return t.seq


def caught_up(rubris: Rubris, sub: TableSubscription) -> bool:
    """The client has read to the topic's head: its table must then be the server's."""
    return sub.synced and sub.table.seq == head(rubris, sub.name)


def wire_entries(c: Client) -> list[Entry]:
    assert c.raw_frames is not None
    return [m for f in c.raw_frames for m in iter_messages(f) if isinstance(m, Entry)]


def client(base: str, transport: str, user: str | None = None, **kw: Any) -> Client:
    headers = {"x-user": user} if user else None
    return Client(base + "/rubris", transport=transport, headers=headers, **kw)  # type: ignore[arg-type]


# ---- the table follows the server's ------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_table_follows_sets_patches_deletes_and_replaces(transport: str) -> None:
    rubris = tables_app()
    async with run_server(starlette_app(rubris)) as base:
        rubris.set("book.t", "101.25", ROW)
        rubris.set("book.t", "x", 1)
        async with client(base, transport, record=True) as c:
            seen: list[tuple[str, str, Any]] = []

            def on_change(ch: Change) -> None:
                assert ch.name == "book.t"
                seen.append((ch.key, ch.op, ch.value))

            sub = await c.subscribe_table("book.t", on_change)
            await sub.wait_synced(timeout=WAIT)
            assert dict(sub.table) == rubris.entries("book.t") == {"101.25": ROW, "x": 1}
            assert seen == [("101.25", "set", ROW), ("x", "set", 1), ("", "synced", None)]
            assert sub.table.seq == head(rubris, "book.t") == 2

            # one change at a time, each read before the next (else they conflate per key)
            steps: list[Callable[[], Any]] = [
                lambda: rubris.patch("book.t", "101.25", {"size": 400}),
                lambda: rubris.set("book.t", "101.25", {**ROW, "size": 500}),  # a diff: PATCH
                lambda: rubris.set("book.t", "y", [1, 2]),
                lambda: rubris.delete("book.t", "x"),
                lambda: rubris.replace("book.t", {"101.25": {**ROW, "size": 500}, "z": "zed"}),
            ]
            for step in steps:
                step()
                await until(lambda: caught_up(rubris, sub), "the change")
                assert dict(sub.table) == rubris.entries("book.t")
            assert seen[3:] == [
                ("101.25", "patch", {**ROW, "size": 400}),
                ("101.25", "patch", {**ROW, "size": 500}),
                ("y", "set", [1, 2]),
                ("x", "delete", 1),
                ("y", "delete", [1, 2]),
                ("z", "set", "zed"),
            ]
            patches = [(e.key, e.payload) for e in wire_entries(c) if e.op == EntryOp.PATCH]
            assert patches == [("101.25", b'{"size":400}'), ("101.25", b'{"size":500}')]
            assert sub.mode == 5 and not sub.ended


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_iterating_changes_from_the_first_state_and_unsubscribing(transport: str) -> None:
    rubris = tables_app()
    async with run_server(starlette_app(rubris)) as base:
        async with client(base, transport) as c:
            # the handler's mapping is the topic's first table
            sub = await c.subscribe_table("book.seeded")
            first = [await sub.get(timeout=WAIT) for _ in range(3)]
            assert [(ch.key, ch.op, ch.value) for ch in first] == [
                ("a", "set", {"px": 1}),
                ("b", "set", {"px": 2}),
                ("", "synced", None),
            ]
            assert sub.synced and sub.table.snapshot() == rubris.entries("book.seeded")
            rubris.patch("book.seeded", "a", {"qty": 5})
            change = await sub.get(timeout=WAIT)
            assert (change.key, change.op, change.value) == ("a", "set", {"px": 1, "qty": 5})
            with pytest.raises(asyncio.TimeoutError):
                await sub.get(timeout=0.05)
            got: list[Change] = []

            async def drain() -> None:
                async for ch in sub:
                    got.append(ch)

            task = asyncio.create_task(drain())
            rubris.delete("book.seeded", "b")
            await until(lambda: len(got) == 1, "the delete")
            await sub.unsubscribe()
            await asyncio.wait_for(task, WAIT)  # the iteration ends with the subscription
            assert sub.ended and sub.end_code == 0
            assert dict(sub.table) == {"a": {"px": 1, "qty": 5}}  # what it held stays
            rubris.set("book.seeded", "c", 3)
            await asyncio.sleep(0.1)
            assert "c" not in sub.table
            # subscribed again: a new subscription, whole from its first state
            again = await c.subscribe_table("book.seeded")
            await again.wait_synced(timeout=WAIT)
            assert dict(again.table) == rubris.entries("book.seeded")


async def test_wrong_kinds_and_bad_max_rates_are_refused() -> None:
    rubris = tables_app()
    async with run_server(starlette_app(rubris)) as base:
        async with client(base, "websocket") as c:
            with pytest.raises(SubscribeRejected, match="subscribe_table") as err:
                await c.subscribe("book.k")
            assert err.value.code == 0
            with pytest.raises(SubscribeRejected, match="not a keyed topic") as err:
                await c.subscribe_table("px.k")
            assert err.value.code == 0
            with pytest.raises(SubscribeRejected) as err:  # the server refuses it on rings
                await c.subscribe("ring.k", max_rate=2)
            assert err.value.code == 1
            with pytest.raises(SubscribeRejected) as err:  # presence="count": no members
                await c.presence("lobby.1")
            assert err.value.code == 4 and "lobby.1@count" in err.value.reason
            with pytest.raises(SubscribeRejected) as err:  # a channel without presence
                await c.presence("big")
            assert err.value.code == 3
            for bad in (0, -1, True, "2", math.nan, math.inf):
                with pytest.raises(ValueError, match="max_rate"):
                    await c.subscribe_table("book.k", max_rate=bad)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="max_rate"):
                await c.subscribe("px.k", params=[1], max_rate=2)
            assert c.state == "open"


# ---- max_rate ------------------------------------------------------------------------------------

RATE = 2.0
SLACK = 0.03
"""Arrival times are read by the client, frames spaced by the server's clock at the write: the
two differ by the loop's scheduling (one loop runs both here), a few ms."""


@pytest.mark.slow
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_max_rate_spaces_a_snapshot_and_a_table(transport: str) -> None:
    rubris = tables_app()
    async with run_server(starlette_app(rubris)) as base:
        rubris.publish("px.r", -1)
        for k in range(5):
            rubris.set("book.r", f"k{k}", -1)
        async with client(base, transport) as c:
            loop = asyncio.get_running_loop()
            px: dict[int, float] = {}  # frame number (client.stats.frames): arrival
            book: dict[int, float] = {}
            last: list[Any] = []

            def on_px(value: Any, info: PushInfo) -> None:
                px.setdefault(c.stats.frames, loop.time())
                last[:] = [value]

            def on_book(ch: Change) -> None:
                book.setdefault(c.stats.frames, loop.time())

            sub = await c.subscribe("px.r", on_px, max_rate=RATE)
            table = await c.subscribe_table("book.r", on_book, max_rate=RATE)
            await table.wait_synced(timeout=WAIT)
            await until(lambda: last, "the snapshot's first value")
            # 50 changes a second of each for 2 s
            start = loop.time()
            for i in range(100):
                rubris.publish("px.r", i)
                rubris.set("book.r", f"k{i % 5}", i)
                await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - loop.time()))
            # the latest state comes within one interval of the last change
            await until(lambda: last == [99] and caught_up(rubris, table), "the latest", 1.5)
            assert dict(table.table) == {f"k{k}": 95 + k for k in range(5)}
        for name, frames in (("px.r", px), ("book.r", book)):
            times = sorted(frames.values())
            gaps = [round(b - a, 3) for a, b in zip(times, times[1:], strict=False)]
            # the first state, then one frame each 1/r s over ~2 s and the last state: 4 or 5
            assert len(times) - 1 in (4, 5), (name, gaps)
            assert min(gaps) >= 1 / RATE - SLACK, (name, gaps)
        assert sub.last_seq == 101  # seq 1 the first value, 101 the last: the rest conflated


# ---- resume, new session, RESET ----------------------------------------------------------------


def changes_of(seen: list[Change]) -> list[str]:
    return [ch.op for ch in seen]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_resume_is_exact_and_recovered(transport: str) -> None:
    rubris = tables_app()
    lossy = LosingPolls()
    async with run_server(starlette_app(rubris)) as base:
        rubris.replace("book.r", {f"k{i}": {"n": i, "pad": "x" * 40} for i in range(6)})
        kw: dict[str, Any] = {"backoff": (0.01, 0.05)}
        if transport == "longpoll":
            kw["http_transport"] = lossy
        async with client(base, transport, **kw) as c:
            seen: list[Change] = []
            held: list[int] = []  # the seq of each change before the reconnect

            def on_change(ch: Change) -> None:
                seen.append(ch)
                if not c.stats.reconnects:
                    held.append(ch.seq)  # the table's seq after it (there is no RESET here)

            sub = await c.subscribe_table("book.r", on_change)
            await until(lambda: caught_up(rubris, sub), "the first state")
            epoch = sub.epoch

            def away_changes() -> None:
                rubris.set("book.r", "k0", {"n": 100, "pad": "x" * 40})
                rubris.patch("book.r", "k1", {"n": 101})
                rubris.delete("book.r", "k2")
                rubris.delete("book.r", "k3")
                rubris.set("book.r", "k3", "back")  # deleted and set again
                rubris.set("book.r", "new", [1])

            if transport == "websocket":
                ws = getattr(c._link, "ws", None)
                assert ws is not None
                ws.transport.pause_reading()
                away_changes()  # written to a socket that is never read again
                s = rubris.engine.sessions[c.session_id]  # type: ignore[index]
                await until(lambda: not s.pending, "the server to write the changes")
                await asyncio.sleep(0.05)
                ws.transport.abort()
                rubris.delete("book.r", "k4")  # and while the client is away
            else:
                lossy.losing = True
                away_changes()  # their responses are lost on the way
                await until(lambda: lossy.lost > 0, "a lost response")
                rubris.delete("book.r", "k4")
            await until(lambda: c.stats.reconnects == 1 and c.state == "open", "the resume")
            assert c.resumed
            rubris.patch("book.r", "k5", {"n": 105})
            await until(lambda: caught_up(rubris, sub), "everything")
            assert dict(sub.table) == rubris.entries("book.r")
            assert set(sub.table) == {"k0", "k1", "k3", "k5", "new"}
            assert sub.recovered and sub.epoch == epoch
            assert "reset" not in changes_of(seen)
            if transport == "longpoll":  # what the resuming HELLO restated: the table's seq
                (hello_frame,) = lossy.hellos[1:]
                hello, restated = decode_frame(hello_frame)
                assert isinstance(hello, Hello) and hello.resume
                assert isinstance(restated, Subscribe) and restated.name == "book.r"
                assert (restated.epoch, restated.since) == (epoch, held[-1])


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_new_session_subscribes_again_from_what_it_holds(transport: str) -> None:
    rubris = tables_app()
    async with run_server(starlette_app(rubris)) as base:
        rubris.replace("book.n", {"a": 1, "b": 2, "c": 3})
        async with client(base, transport, backoff=(0.01, 0.05)) as c:
            seen: list[Change] = []
            sub = await c.subscribe_table("book.n", seen.append)
            await sub.wait_synced(timeout=WAIT)
            old = c.session_id
            # the connection is lost and the server forgets the session (as after its
            # timeout): the client's resume starts a new session
            if transport == "websocket":
                ws = getattr(c._link, "ws", None)
                assert ws is not None
                ws.transport.abort()
            rubris.engine.end_session(rubris.engine.sessions[old])  # type: ignore[index]
            rubris.delete("book.n", "a")
            rubris.set("book.n", "d", 4)
            await until(lambda: c.session_id != old and c.state == "open", "a new session")
            assert not c.resumed
            await until(lambda: caught_up(rubris, sub), "everything")
            assert dict(sub.table) == rubris.entries("book.n") == {"b": 2, "c": 3, "d": 4}
            assert sub.recovered and "reset" not in changes_of(seen)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_restarted_topic_resets_the_table_and_fills_it_again(transport: str) -> None:
    rubris = tables_app()
    async with run_server(starlette_app(rubris)) as base:
        rubris.replace("book.e", {"a": 1, "b": 2})
        async with client(base, transport) as c:
            seen: list[Change] = []
            sub = await c.subscribe_table("book.e", seen.append)
            await sub.wait_synced(timeout=WAIT)
            epoch = sub.epoch
            t = rubris.engine.topics["book.e"]
            # its numbering begins again (as when the servers sharing it lost it): the client
            # subscribes again with the epoch it holds, which the topic no longer has
            rubris.engine.restart_topic(t, epoch + 1)
            rubris.set("book.e", "c", 3)
            await until(lambda: sub.epoch == epoch + 1 and caught_up(rubris, sub), "the reset")
            assert dict(sub.table) == rubris.entries("book.e") == {"c": 3}
            assert not sub.recovered and c.stats.restarted == 1
            after = changes_of(seen)[changes_of(seen).index("synced") + 1 :]
            assert after == ["reset", "set", "synced"]


async def test_a_resume_after_forgotten_tombstones_resets() -> None:
    rubris = tables_app()
    async with run_server(starlette_app(rubris)) as base:
        rubris.replace("book.f", {"a": 1, "b": 2, "c": 3})
        async with client(base, "websocket", backoff=(0.01, 0.05)) as c:
            seen: list[Change] = []
            sub = await c.subscribe_table("book.f", seen.append)
            await sub.wait_synced(timeout=WAIT)
            ws = getattr(c._link, "ws", None)
            assert ws is not None
            ws.transport.pause_reading()
            rubris.delete("book.f", "a")  # never read
            s = rubris.engine.sessions[c.session_id]  # type: ignore[index]
            await until(lambda: not s.pending, "the server to write the delete")
            ws.transport.abort()
            # the server forgets the delete before the client is back: it cannot tell it
            engine = rubris.engine
            assert engine.forget_tombstones(engine.clock() + 3600) == 1
            await until(lambda: c.stats.reconnects == 1 and c.state == "open", "the resume")
            await until(lambda: caught_up(rubris, sub), "the whole table")
            assert c.resumed and not sub.recovered
            assert dict(sub.table) == rubris.entries("book.f") == {"b": 2, "c": 3}
            assert changes_of(seen)[-4:] == ["reset", "set", "set", "synced"]


# ---- presence ---------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_presence_members_tabs_joins_and_leaves(transport: str) -> None:
    rubris = tables_app()
    async with run_server(starlette_app(rubris)) as base:
        async with (
            client(base, transport, "carol") as watcher,
            client(base, transport, "alice") as tab1,
            client(base, transport, "alice") as tab2,
            client(base, transport, "bob") as bob,
        ):
            events: list[tuple[str, str, Any]] = []
            counts: list[tuple[int, int]] = []
            p = await watcher.presence(
                "room.1",
                on_join=lambda m, v: events.append(("join", m, v)),
                on_leave=lambda m, v: events.append(("leave", m, v)),
                on_update=lambda m, v: events.append(("update", m, v)),
            )
            n = await watcher.presence_count("room.1", lambda m, s: counts.append((m, s)))
            await p.wait_synced(timeout=WAIT)
            await n.wait_synced(timeout=WAIT)
            assert p.count == 0 and dict(p.members) == {} and events == []
            assert (n.members, n.sessions) == (0, 0) and p.name == "room.1@presence"

            def alice(sessions: int) -> dict[str, Any]:
                return {"sessions": sessions, "info": {"name": "ALICE"}}

            one = await tab1.subscribe("room.1")
            await until(lambda: events, "alice's join")
            two = await tab2.subscribe("room.1")  # a second tab: the same member
            await bob.subscribe("room.1")
            await until(lambda: p.count == 2 and n.sessions == 3, "three sessions, two members")
            assert events == [
                ("join", "alice", alice(1)),
                ("update", "alice", alice(2)),
                ("join", "bob", {"sessions": 1, "info": {"name": "BOB"}}),
            ]
            assert dict(p.members) == rubris.entries("room.1@presence")
            assert (n.members, n.sessions) == (2, 3) and counts[-1] == (2, 3)
            del events[:]
            await tab1.unsubscribe(one)
            await until(lambda: events, "alice's update")
            await bob.close()  # its session waits for a resume: still a member
            await tab2.unsubscribe(two)
            await until(lambda: len(events) == 2, "alice's leave")
            assert events == [("update", "alice", alice(1)), ("leave", "alice", alice(1))]
            assert list(p.members) == ["bob"] and n.members == 1
            rubris.engine.end_session(rubris.engine.sessions[bob.session_id])  # type: ignore[index]
            await until(lambda: len(events) == 3, "bob's leave")
            assert events[2][:2] == ("leave", "bob") and p.count == 0
            assert (n.members, n.sessions) == (0, 0)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_resume_is_not_a_leave(transport: str) -> None:
    rubris = tables_app()
    lossy = LosingPolls()
    async with run_server(starlette_app(rubris)) as base:
        kw: dict[str, Any] = {"backoff": (0.01, 0.05)}
        if transport == "longpoll":
            kw["http_transport"] = lossy
        async with (
            client(base, "websocket", "carol") as watcher,
            client(base, transport, "dave", **kw) as dave,
        ):
            events: list[tuple[str, str]] = []
            p = await watcher.presence(
                "room.2",
                on_join=lambda m, v: events.append(("join", m)),
                on_leave=lambda m, v: events.append(("leave", m)),
                on_update=lambda m, v: events.append(("update", m)),
            )
            await p.wait_synced(timeout=WAIT)
            await dave.subscribe("room.2")
            await until(lambda: events == [("join", "dave")], "dave's join")
            members = rubris.engine.topics["room.2@presence"]
            seq = members.seq
            if transport == "websocket":
                ws = getattr(dave._link, "ws", None)
                assert ws is not None
                ws.transport.abort()
            else:
                lossy.losing = True
                rubris.publish("room.2", "poke")  # a frame for dave, lost on the way
            await until(lambda: dave.stats.reconnects == 1 and dave.state == "open", "a resume")
            assert dave.resumed
            await asyncio.sleep(0.2)  # a leave would have come by now
            assert events == [("join", "dave")] and members.seq == seq
            assert dict(p.members) == {"dave": {"sessions": 1, "info": {"name": "DAVE"}}}


async def test_a_presence_resumed_tells_what_happened_meanwhile_and_a_reset_the_difference() -> (
    None
):
    rubris = tables_app()
    async with run_server(starlette_app(rubris)) as base:
        async with (
            client(base, "websocket", "carol", backoff=(0.01, 0.05)) as watcher,
            client(base, "websocket", "erin") as erin,
            client(base, "websocket", "frank") as frank,
        ):
            events: list[tuple[str, str]] = []
            p = await watcher.presence(
                "room.3",
                on_join=lambda m, v: events.append(("join", m)),
                on_leave=lambda m, v: events.append(("leave", m)),
            )
            mine = await erin.subscribe("room.3")
            await until(lambda: events == [("join", "erin")], "erin")
            ws = getattr(watcher._link, "ws", None)
            assert ws is not None
            ws.transport.abort()
            await erin.unsubscribe(mine)
            await frank.subscribe("room.3")
            await until(lambda: watcher.stats.reconnects == 1 and len(events) == 3, "the news")
            assert p.recovered and events[1:] == [("leave", "erin"), ("join", "frank")]
            # a RESET (the presence topic's numbering restarted) is no leave of everyone: the
            # callbacks hear the difference once the new state is whole, here nothing
            t = rubris.engine.topics["room.3@presence"]
            rubris.engine.restart_topic(t, t.epoch + 1)
            rubris.set("room.3@presence", "frank", {"sessions": 1, "info": {"name": "FRANK"}})
            await until(lambda: not p.recovered and p.synced and p.count == 1, "the new state")
            await asyncio.sleep(0.1)
            assert events[3:] == [] and list(p.members) == ["frank"]


async def test_presence_count_alone_and_rate_limited() -> None:
    rubris = tables_app()
    async with run_server(starlette_app(rubris)) as base:
        async with client(base, "longpoll", "gina") as g, client(base, "websocket") as anon:
            n = await g.presence_count("lobby.1", max_rate=10)
            await n.wait_synced(timeout=WAIT)
            assert (n.members, n.sessions) == (0, 0)
            await anon.subscribe("lobby.1")
            await until(lambda: n.members == 1, "the anonymous member")
            value, info = await n.get(timeout=WAIT)  # iterated, it is a Subscription
            assert value == {"members": 0, "sessions": 0} and info.name == "lobby.1@count"
            await n.unsubscribe()
            assert n.ended
