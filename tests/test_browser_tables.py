"""Keyed topics and presence (protocol.md section 5b), the browser client in headless Chromium.

A real uvicorn serves a small app (rubris at /rubris, an empty page at /) in the test's own event
loop (tests/server.py), so a test changes a table with ``rubris.set/patch/delete`` while a page
follows it over a real WebSocket or long-poll, and compares the page's ``entries`` (a Map) with
``rubris.entries(...)``. An init script taps the page's WebSockets as tests/test_browser_resume.py
does: what the client sends (HELLO, SUBSCRIBE) and the ENTRY ops it receives are decoded with the
client's own codec, ``window.__deaf`` drops what the server sends (what a dying connection loses)
and ``window.__blocked`` sends new sockets to a closed port (the network is down).

The engine's side is tests/test_keyed.py and tests/test_presence.py.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from playwright.async_api import Browser, Page
from starlette.applications import Starlette
from starlette.requests import HTTPConnection, Request
from starlette.responses import HTMLResponse
from starlette.routing import Mount, Route

from rubris_asgi import Config, Reject, Rubris, Session, Timing

from .server import run_server
from .test_browser_queues import PAGE, TRANSPORTS, QueuePage, Served, until

pytestmark = pytest.mark.browser

NOTE = "n" * 120  # makes a value large enough that a change of one member goes as a PATCH

TAP = """(() => {
    const Real = window.WebSocket;
    window.__sockets = [];
    window.__out = [];
    window.__ops = [];
    window.__deaf = false;
    window.__blocked = false;
    let c = null;
    import('/rubris/client.js').then((m) => { c = m._internal; });
    const utf8 = new TextDecoder();
    const show = (m) => m.kind === 0x21 ? { kind: 'HELLO', resume: m.resume }
        : m.kind === 0x22 ? { kind: 'SUBSCRIBE', name: m.name, epoch: Number(m.epoch),
                              since: Number(m.since), params: utf8.decode(m.params) }
        : { kind: m.kind };
    window.WebSocket = class extends Real {
        constructor(url, protocols) {
            super(window.__blocked ? 'ws://127.0.0.1:9/' : url, protocols);
            this.__index = window.__sockets.push(this) - 1;
            window.__out.push([]);
        }
        set onmessage(fn) {
            super.onmessage = fn && ((ev) => {
                if (window.__deaf) return undefined;
                for (const m of c.decodeFrame(new Uint8Array(ev.data))) {
                    if (m.kind === 0x0e) window.__ops.push([m.op, m.key, m.seq, m.compressed]);
                }
                return fn(ev);
            });
        }
        get onmessage() { return super.onmessage; }
        send(frame) {
            const bytes = frame instanceof Uint8Array ? frame : new Uint8Array(frame);
            window.__out[this.__index].push(c.decodeClientFrame(bytes).map(show));
            return super.send(frame);
        }
    };
})();"""

# Subscribes window[key] = {changes, infos, sub}: changes are [op, key, seq] in delivery order
# (each checked against the Map: onChange runs once the table holds the change).
TABLE = """([key, name, opts]) => {
    const rec = { changes: [], infos: [], wrong: [] };
    window[key] = rec;
    rec.sub = window.client.subscribeTable(name, {
        ...opts,
        onChange: (c) => {
            rec.changes.push([c.op, c.key, c.seq]);
            const held = rec.sub.entries.get(c.key);
            if ((c.op === 'set' || c.op === 'patch') && held !== c.value) rec.wrong.push(c);
            if (c.op === 'delete' && rec.sub.entries.has(c.key)) rec.wrong.push(c);
        },
        onSubscribed: (info) => rec.infos.push(info),
    });
    return rec.sub.whenSynced().then(() => rec.sub.info);
}"""


def user_of(conn: HTTPConnection) -> str | None:
    """The user a test page names in the client's URL (``/rubris?user=alice``)."""
    return conn.query_params.get("user")


def make_app() -> tuple[Rubris, Starlette]:
    rubris = Rubris(
        Config(timing=Timing(poll_timeout=1.0, session_timeout=5.0)),
        compress_at=None,
        authenticate=user_of,
    )

    @rubris.shared("book.{sym}", keyed=True)
    async def book(session: Session, sym: str) -> Any:
        if sym == "NOPE":
            raise Reject("unknown symbol")
        return {"100.0": level(0)} if sym.startswith("init") else None

    @rubris.shared("big.{name}", keyed=True, compress_at=64)
    async def big(session: Session, name: str) -> None:
        return None

    @rubris.shared("snap.{name}", snapshot=True)
    async def snap(session: Session, name: str) -> Any:
        return {"n": 0}

    @rubris.shared("ring.{name}", ring=8)
    async def ring(session: Session, name: str) -> None:
        return None

    @rubris.shared(
        "room.{id}", snapshot=True, presence=True, presence_info=lambda s: {"user": s.user}
    )
    async def room(session: Session, id: str) -> Any:  # noqa: A002
        return {"room": id}

    @rubris.shared("lobby.{id}", snapshot=True, presence="count")
    async def lobby(session: Session, id: str) -> Any:  # noqa: A002
        return {"lobby": id}

    async def index(request: Request) -> HTMLResponse:
        return HTMLResponse(PAGE)

    app = Starlette(routes=[Route("/", index), Mount("/rubris", rubris)], lifespan=rubris.lifespan)
    return rubris, app


@contextlib.asynccontextmanager
async def serve() -> AsyncIterator[Served]:
    rubris, app = make_app()
    async with run_server(app) as url:
        yield Served(rubris, url)


async def open_page(
    page: Page, url: str, transport: str = "websocket", user: str | None = None
) -> QueuePage:
    """The test page, tapped, with ``window.client`` open on ``transport`` as ``user``."""
    await page.add_init_script(script=TAP)
    qp = QueuePage(page, url)
    await page.goto(url + "/", wait_until="load")
    await qp.evaluate(
        """async ([transport, mount]) => {
            const { connect } = await import('/rubris/client.js');
            window.client = connect(mount, { transport, backoffMaxMs: 500 });
            await new Promise((resolve) => {
                window.client.on('state', (e) => { if (e.state === 'open') resolve(); });
            });
        }""",
        [transport, "/rubris" + (f"?user={user}" if user else "")],
    )
    # cutting or blocking sockets on purpose logs failed WebSockets in some Chromium versions
    qp.expect_error(r"WebSocket")
    return qp


async def entries(qp: QueuePage, key: str) -> dict[str, Any]:
    return dict(await qp.evaluate(f"() => Object.fromEntries(window.{key}.sub.entries)"))


async def caught_up(qp: QueuePage, key: str, seq: int) -> None:
    await qp.wait(f"(seq) => window.{key}.sub.seq >= seq", seq, what=f"the table at seq {seq}")


def level(n: int) -> dict[str, Any]:
    return {"px": 100.0 + n, "qty": n, "note": NOTE}


def subscribes(qp_out: list[list[list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """The SUBSCRIBEs in ``window.__out`` (per socket, per frame, its messages), in order."""
    return [m for sock in qp_out for f in sock for m in f if m["kind"] == "SUBSCRIBE"]


def sent(qp_out: list[list[list[dict[str, Any]]]], name: str) -> list[dict[str, Any]]:
    return [m for m in subscribes(qp_out) if m["name"] == name]


# ---- tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_page_holds_the_servers_table(page: Page, transport: str) -> None:
    """The first table (the handler's), then sets, patches and deletes: after each step the
    page's Map equals the server's; a change of one member of a large value comes as a PATCH."""
    async with serve() as served:
        rubris = served.rubris
        name = "book.init" + transport
        qp = await open_page(page, served.url, transport)
        info = await qp.evaluate(TABLE, ["book", name, {}])
        assert info["mode"] == 5 and info["name"] == name
        assert await entries(qp, "book") == rubris.entries(name) == {"100.0": level(0)}
        assert await qp.evaluate("() => window.book.changes.map((c) => c[0])") == ["set", "synced"]

        seq = 0
        for n in range(1, 6):
            seq = rubris.set(name, f"{100 + n}.0", level(n))
        await caught_up(qp, "book", seq)
        assert await entries(qp, "book") == rubris.entries(name)
        patches = 5
        for n in range(patches):  # one at a time: each one the page holds the change before
            seq = rubris.patch(name, "101.0", {"qty": 10 + n, "gone": None, "new": {"k": n}})
            await caught_up(qp, "book", seq)
        assert (await entries(qp, "book"))["101.0"] == {
            **level(1),
            "qty": 10 + patches - 1,
            "new": {"k": patches - 1},
        }
        got = await qp.evaluate("() => window.book.changes.filter((c) => c[0] === 'patch')")
        assert len(got) == patches, got
        assert await entries(qp, "book") == rubris.entries(name)
        for key in ("100.0", "103.0"):
            seq = rubris.delete(name, key) or seq
        seq = rubris.set(name, "200.0", level(200))
        await caught_up(qp, "book", seq)
        assert await entries(qp, "book") == rubris.entries(name)
        assert "100.0" not in rubris.entries(name) and len(rubris.entries(name)) == 5
        deletes = await qp.evaluate("() => window.book.changes.filter((c) => c[0] === 'delete')")
        assert [d[1] for d in deletes] == ["100.0", "103.0"]
        assert await qp.evaluate("() => window.book.wrong") == []
        assert await qp.evaluate("() => window.book.sub.synced") is True
        if transport == "websocket":
            ops = await qp.evaluate("() => window.__ops.map((o) => o[0])")
            assert ops.count(2) == patches and ops[1] == 5, ops  # PATCH on the wire; SYNCED
        qp.assert_clean()


async def test_compressed_entries_a_plain_subscriber_and_a_second_table(page: Page) -> None:
    """Deflated ENTRYs (a channel with compress_at) inflate in order; subscribe() on a keyed
    topic gets each change as its value; a second subscribeTable() of the same name shares the
    table and starts with what it holds (a set per entry, then synced)."""
    async with serve() as served:
        rubris = served.rubris
        qp = await open_page(page, served.url)
        for i in range(20):
            rubris.set("big.t", f"k{i}", {"text": "rubris " * 40, "i": i})
        await qp.evaluate(TABLE, ["a", "big.t", {}])
        await qp.evaluate(
            """() => {
                window.plain = [];
                window.client.subscribe('big.t', (c, meta) => window.plain.push([c.op, c.key,
                    meta.seq === c.seq, meta.name]));
            }"""
        )
        seq = rubris.set("big.t", "k20", {"text": "rubris " * 40, "i": 20})
        await caught_up(qp, "a", seq)
        assert await entries(qp, "a") == rubris.entries("big.t")
        assert await qp.evaluate("() => window.client.stats.compressed") > 0
        assert any(o[3] for o in await qp.evaluate("() => window.__ops"))
        plain = await qp.wait(
            "() => window.plain.some((p) => p[1] === 'k20') && window.plain", what="the set"
        )
        # joined a table already whole: the 20 entries held, synced, then the new one
        assert [p[0] for p in plain] == ["set"] * 20 + ["synced", "set"]
        assert all(p[2] and p[3] == "big.t" for p in plain)
        await qp.evaluate(TABLE, ["b", "big.t", {}])
        assert await entries(qp, "b") == rubris.entries("big.t")
        changes = await qp.evaluate("() => window.b.changes")
        assert [c[0] for c in changes] == ["set"] * 21 + ["synced"]
        # one SUBSCRIBE for all three: they share the wire
        assert len(sent(await qp.evaluate("() => window.__out"), "big.t")) == 1
        # a subscription that ends keeps what it held, the others go on
        await qp.evaluate("() => window.b.sub.unsubscribe()")
        seq = rubris.delete("big.t", "k0") or 0
        await caught_up(qp, "a", seq)
        assert len(await entries(qp, "a")) == 20 and len(await entries(qp, "b")) == 21
        qp.assert_clean()


@pytest.mark.parametrize("forget", [False, True])
async def test_a_resumed_table_equals_the_servers(page: Page, forget: bool) -> None:
    """The WebSocket dies (what the server wrote to it lost), changes are made meanwhile; the
    resuming HELLO restates the table (epoch, since = its seq) and the page ends with the
    server's table: only the keys changed since, or (its tombstones forgotten meanwhile) RESET
    and the whole table."""
    async with serve() as served:
        rubris = served.rubris
        name = "book.resume"
        for n in range(10):
            rubris.set(name, f"k{n}", level(n))
        qp = await open_page(page, served.url)
        info = await qp.evaluate(TABLE, ["book", name, {}])
        held = await qp.evaluate("() => window.book.sub.seq")
        assert held == info["head"] == 10
        sid = await qp.evaluate("() => window.client.sessionId")
        session = rubris.engine.sessions[sid]

        await qp.evaluate("() => { window.__deaf = true; }")
        rubris.set(name, "k0", level(100))  # written to the socket; the page never sees it
        rubris.delete(name, "k1")
        await until(lambda: not session.pending, "the server to write them")
        await qp.evaluate("() => { window.__blocked = true; }")
        await qp.evaluate("() => window.__sockets[0].close()")
        await qp.wait("() => window.client.state === 'reconnecting'", what="the drop")
        rubris.patch(name, "k2", {"qty": 99})
        rubris.delete(name, "k3")
        rubris.set(name, "k10", level(10))
        if forget:  # the deletes of k1 and k3 can no longer be told
            rubris.engine.forget_tombstones(rubris.engine.clock() + 3600)
        await qp.evaluate("() => { window.__deaf = false; window.__blocked = false; }")
        await qp.wait(
            "() => window.client.state === 'open' && window.client.resumed", what="the resume"
        )
        head = rubris.engine.topics[name].seq
        await caught_up(qp, "book", head)
        await qp.wait("() => window.book.sub.synced", what="the table whole again")
        assert await entries(qp, "book") == rubris.entries(name)
        assert "k1" not in rubris.entries(name) and "k3" not in rubris.entries(name)

        frames = await qp.evaluate("() => window.__out")
        resuming = next(f[0] for f in frames[1:] if f and f[0][0]["kind"] == "HELLO")
        assert resuming[0]["resume"] and resuming[1:] == [
            {"kind": "SUBSCRIBE", "name": name, "epoch": info["epoch"], "since": held, "params": ""}
        ]
        infos = await qp.evaluate("() => window.book.infos")
        assert infos[-1]["recovered"] is (not forget)
        changes = await qp.evaluate("() => window.book.changes")
        after = changes[[c[0] for c in changes].index("synced") + 1 :]
        if forget:
            assert after[0][0] == "reset" and after[-1][0] == "synced"
            assert sorted(c[1] for c in after if c[0] == "set") == sorted(rubris.entries(name))
        else:  # what changed while away, each key once, as its latest state
            assert sorted((c[0], c[1]) for c in after) == [
                ("delete", "k1"),
                ("delete", "k3"),
                ("set", "k0"),
                ("set", "k10"),
                ("set", "k2"),
                ("synced", ""),
            ]
        assert await qp.evaluate("() => window.book.wrong") == []
        seq = rubris.set(name, "k11", level(11))
        await caught_up(qp, "book", seq)
        assert await entries(qp, "book") == rubris.entries(name)
        qp.assert_clean()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_new_session_subscribes_again_with_epoch_and_since(
    page: Page, transport: str
) -> None:
    """The session ends on the server while the page is away (its long-poll gets 404, its
    WebSocket cannot reconnect in time): the new session's SUBSCRIBE carries the table's epoch
    and seq, and gets only what changed."""
    async with serve() as served:
        rubris = served.rubris
        name = "book.again" + transport
        for n in range(5):
            rubris.set(name, f"k{n}", level(n))
        qp = await open_page(page, served.url, transport)
        info = await qp.evaluate(TABLE, ["book", name, {}])
        sid = await qp.evaluate("() => window.client.sessionId")
        qp.expect_error(r"404")  # the poll of the ended session
        if transport == "websocket":
            await qp.evaluate("() => { window.__blocked = true; window.__sockets[0].close(); }")
            await qp.wait("() => window.client.state === 'reconnecting'", what="the drop")
        rubris.engine.end_session(rubris.engine.sessions[sid])
        rubris.set(name, "k0", level(50))
        rubris.delete(name, "k4")
        rubris.set(name, "k9", level(9))
        await qp.evaluate("() => { window.__blocked = false; }")
        await qp.wait(
            "(sid) => window.client.state === 'open' && window.client.sessionId !== sid",
            sid,
            what="a new session",
        )
        head = rubris.engine.topics[name].seq
        await caught_up(qp, "book", head)
        assert await entries(qp, "book") == rubris.entries(name)
        infos = await qp.evaluate("() => window.book.infos")
        assert len(infos) == 2 and infos[-1]["recovered"] is True
        changes = await qp.evaluate("() => window.book.changes")
        assert [c[0] for c in changes].count("reset") == 0
        assert sorted(c[1] for c in changes[6:]) == ["", "k0", "k4", "k9"]  # 5 sets, synced
        if transport == "websocket":
            again = sent(await qp.evaluate("() => window.__out"), name)[-1]
            assert (again["epoch"], again["since"]) == (info["epoch"], 5)
        qp.assert_clean()


async def test_max_rate(page: Page) -> None:
    """`maxRate` goes as SUBSCRIBE params {"max_rate": r} on tables and snapshot topics; a ring
    refuses it (code 1); a bad one throws; a second rate for one table fails (code 6)."""
    async with serve() as served:
        qp = await open_page(page, served.url)
        await qp.evaluate(TABLE, ["t", "book.rated", {"maxRate": 4}])
        snap = await qp.evaluate(
            """() => new Promise((resolve) => {
                window.client.subscribe('snap.rated', (v) => resolve(v), { maxRate: 2.5 });
            })"""
        )
        assert snap == {"n": 0}
        refused = await qp.evaluate(
            """() => window.client.subscribe('ring.rated', () => {}, { maxRate: 1 }).ready
                .then(() => 'accepted', (err) => [err.code, err.reason])"""
        )
        assert refused[0] == 1 and "max_rate" in refused[1]
        thrown = await qp.evaluate(
            """() => [0, -1, 'fast', Infinity, NaN].map((r) => {
                try { window.client.subscribeTable('book.x', { maxRate: r }); return 'accepted'; }
                catch (err) { return err.name; }
            })"""
        )
        assert thrown == ["RangeError"] * 5
        other = await qp.evaluate(
            """() => window.client.subscribeTable('book.rated', { maxRate: 8 }).whenSynced()
                .then(() => 'synced', (err) => err.code)"""
        )
        assert other == 6
        out = await qp.evaluate("() => window.__out")
        params = {m["name"]: json.loads(m["params"]) for m in subscribes(out)}
        assert params == {
            "book.rated": {"max_rate": 4},
            "snap.rated": {"max_rate": 2.5},
            "ring.rated": {"max_rate": 1},
        }
        qp.assert_clean()


async def test_refusals(page: Page) -> None:
    """A refused table rejects `ready` and `whenSynced()`; a topic that is not keyed fails the
    table (code 3) and is let go; presence of a channel without it is refused (3), of a
    count-only channel too (4)."""
    async with serve() as served:
        qp = await open_page(page, served.url)
        got = await qp.evaluate(
            """async () => {
                const code = (p) => p.then(() => 'ok', (err) => err.code);
                const errs = [];
                const onError = (e) => errs.push(e.code);
                const nope = window.client.subscribeTable('book.NOPE', { onError });
                const snap = window.client.subscribeTable('snap.notatable', { onError });
                return {
                    nope: [await code(nope.ready), await code(nope.whenSynced()), nope.closed],
                    snap: [await code(snap.ready), await code(snap.whenSynced()), snap.closed],
                    presence: await code(window.client.presence('snap.x').ready),
                    countOnly: await code(window.client.presence('lobby.1').ready),
                    errs,
                };
            }"""
        )
        assert got == {
            "nope": [10, 10, True],
            "snap": [3, 3, True],
            "presence": 3,
            "countOnly": 4,
            "errs": [10, 3],
        }
        # the snapshot topic was let go: the server holds no subscription of it
        sid = await qp.evaluate("() => window.client.sessionId")
        session = served.rubris.engine.sessions[sid]
        await until(lambda: "snap.notatable" not in session.names, "the UNSUBSCRIBE")
        qp.assert_clean()


async def test_presence_across_pages(browser: Browser) -> None:
    """Two tabs of alice are one member (two sessions), bob another; joins come at the first
    SYNCED, a second tab is an update, an unsubscribe a leave; the count follows."""
    async with serve() as served:
        contexts = [await browser.new_context() for _ in range(3)]
        try:
            pages = [await c.new_page() for c in contexts]
            alice1, alice2, bob = [
                await open_page(p, served.url, user=u)
                for p, u in zip(pages, ["alice", "alice", "bob"], strict=True)
            ]
            join = "() => window.client.subscribe('room.1', () => {}).ready"
            await alice1.evaluate(
                "() => { window.room = window.client.subscribe('room.1', () => {}); }"
            )
            await alice1.evaluate("() => window.room.ready")
            await bob.evaluate(
                "() => { window.room = window.client.subscribe('room.1', () => {}); }"
            )
            await bob.evaluate("() => window.room.ready")
            await alice1.evaluate(
                """async () => {
                    window.told = [];
                    const tell = (what) => (member, value) => {
                        window.told.push([what, member, value.sessions]);
                    };
                    window.who = window.client.presence('room.1', {
                        onJoin: tell('join'), onLeave: tell('leave'), onUpdate: tell('update'),
                    });
                    window.counts = [];
                    window.count = window.client.presenceCount('room.1', (c) => {
                        window.counts.push(c);
                    });
                    await window.who.whenSynced();
                    await window.count.whenSynced();
                }"""
            )
            members = await alice1.evaluate("() => Object.fromEntries(window.who.members)")
            assert members == {
                "alice": {"sessions": 1, "info": {"user": "alice"}},
                "bob": {"sessions": 1, "info": {"user": "bob"}},
            }
            assert sorted(await alice1.evaluate("() => window.told")) == [
                ["join", "alice", 1],
                ["join", "bob", 1],
            ]
            assert await alice1.evaluate("() => [window.who.count, window.count.members]") == [2, 2]

            await alice2.evaluate(join)  # a second tab: the same member, a second session
            await alice1.wait(
                "() => window.who.members.get('alice').sessions === 2", what="alice's second tab"
            )
            await alice1.wait("() => window.count.sessions === 3", what="the count")
            await bob.evaluate("() => window.room.unsubscribe()")
            await alice1.wait("() => !window.who.members.has('bob')", what="bob to leave")
            await alice1.wait("() => window.count.members === 1", what="the count")
            assert await alice1.evaluate("() => window.told.slice(2)") == [
                ["update", "alice", 2],
                ["leave", "bob", 1],
            ]
            assert await alice1.evaluate("() => [window.who.count, window.count.sessions]") == [
                1,
                2,
            ]
            counts = await alice1.evaluate("() => window.counts")
            assert counts[0] == {"members": 2, "sessions": 2}
            assert counts[-1] == {"members": 1, "sessions": 2}

            # a RESET (alice1 away while bob came and went, the tombstone forgotten) tells the
            # differences only: alice is not told to leave and join again
            await bob.evaluate(join)
            await alice1.wait("() => window.who.members.has('bob')", what="bob back")
            await alice1.evaluate("() => { window.__blocked = true; window.__sockets[0].close(); }")
            await alice1.wait("() => window.client.state === 'reconnecting'", what="the drop")
            # bob's tab and alice's second tab close: their sessions end (here at once, not
            # after the session timeout), and bob's tombstone is forgotten
            engine = served.rubris.engine
            for gone in (bob, alice2):
                sid = await gone.evaluate(
                    "() => { window.client.close(); return window.client.sessionId; }"
                )
                engine.end_session(engine.sessions[sid])
            engine.forget_tombstones(engine.clock() + 3600)
            told = len(await alice1.evaluate("() => window.told"))
            await alice1.evaluate("() => { window.__blocked = false; }")
            await alice1.wait(
                "() => window.client.state === 'open' && window.who.synced"
                " && window.who.members.size === 1",
                what="the members after the resume",
            )
            assert await alice1.evaluate("(n) => window.told.slice(n)", told) == [
                ["leave", "bob", 1],
                ["update", "alice", 1],
            ]
            assert 4 in await alice1.evaluate("() => window.__ops.map((o) => o[0])")  # a RESET
            # count-only channels: the count, not the members
            await alice1.evaluate("() => window.client.subscribe('lobby.1', () => {}).ready")
            lobby = await alice1.evaluate(
                """() => new Promise((resolve) => {
                    window.client.presenceCount('lobby.1', (c) => resolve(c));
                })"""
            )
            assert lobby == {"members": 1, "sessions": 1}
            for qp in (alice1, alice2, bob):
                qp.assert_clean()
        finally:
            for c in contexts:
                await c.close()
