"""Exact resume and late joiners (protocol.md section 5), the browser client in headless Chromium.

A real uvicorn serves tests/apps.py's rubris at /rubris and an empty page at /, in the test's
own event loop (tests/server.py). An init script wraps the page's WebSocket: every socket is
kept in ``window.__sockets``, the messages the client sends are decoded (with the client's own
codec) into ``window.__out`` (one list per socket, one entry per frame), and while
``window.__deaf`` is set the frames the server sends are dropped before the client sees them:
what the server wrote to a connection that then dies is lost, as on a real network. The test
then cuts the socket and checks that, after the resume, every ring seq arrives exactly once, in
order, or inside a GAP.

The Python client's side is tests/test_resume_clients.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from playwright.async_api import Page
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Mount, Route

from rubris_asgi import Rubris

from .apps import make_rubris
from .server import run_server
from .test_browser_queues import PAGE, QueuePage, Served, until

pytestmark = pytest.mark.browser

TAP = """(() => {
    const Real = window.WebSocket;
    window.__sockets = [];
    window.__out = [];
    window.__deaf = false;
    let c = null;
    import('/rubris/client.js').then((m) => { c = m._internal; });
    const utf8 = new TextDecoder();
    const show = (m) => m.kind === 0x21 ? { kind: 'HELLO', resume: m.resume }
        : m.kind === 0x22 ? { kind: 'SUBSCRIBE', name: m.name, epoch: Number(m.epoch),
                              since: Number(m.since), params: utf8.decode(m.params) }
        : { kind: m.kind };
    window.WebSocket = class extends Real {
        constructor(url, protocols) {
            super(url, protocols);
            this.__index = window.__sockets.push(this) - 1;
            window.__out.push([]);
        }
        set onmessage(fn) {
            super.onmessage = fn && ((ev) => (window.__deaf ? undefined : fn(ev)));
        }
        get onmessage() { return super.onmessage; }
        send(frame) {
            const bytes = frame instanceof Uint8Array ? frame : new Uint8Array(frame);
            window.__out[this.__index].push(c.decodeClientFrame(bytes).map(show));
            return super.send(frame);
        }
    };
})();"""

# Subscribes window[key] = {events, infos, sub}: events are ["push", seq] and
# ["gap", from, count] in delivery order, infos every onSubscribed.
SUBSCRIBE = """([key, name, opts]) => {
    const rec = { events: [], infos: [] };
    window[key] = rec;
    rec.sub = window.client.subscribe(name, (value, meta) => {
        if (value !== meta.seq) rec.events.push(['wrong value', value, meta.seq]);
        rec.events.push(['push', meta.seq]);
    }, {
        ...opts,
        onGap: (g) => rec.events.push(['gap', g.from, g.count]),
        onSubscribed: (info) => rec.infos.push(info),
    });
    return rec.sub.ready.then((info) => info);
}"""


@contextlib.asynccontextmanager
async def serve() -> AsyncIterator[Served]:
    rubris = make_rubris()  # ring.* keeps 8

    async def index(request: Request) -> HTMLResponse:
        return HTMLResponse(PAGE)

    app = Starlette(routes=[Route("/", index), Mount("/rubris", rubris)], lifespan=rubris.lifespan)
    async with run_server(app) as url:
        yield Served(rubris, url)


async def open_page(page: Page, url: str) -> QueuePage:
    await page.add_init_script(script=TAP)
    qp = QueuePage(page, url)
    await qp.open("websocket")
    # cutting the socket on purpose may log a failed WebSocket in some Chromium versions
    qp.expect_error(r"WebSocket")
    return qp


def publish(rubris: Rubris, topic: str, first: int, last: int) -> None:
    for n in range(first, last + 1):
        rubris.publish(topic, n)


def assert_exact(events: list[list[Any]], total: int) -> None:
    """Every seq 1 … total exactly once, pushed or inside a GAP, in order."""
    expected = 1
    for e in events:
        assert e[0] in ("push", "gap"), events
        start, count = (e[1], 1) if e[0] == "push" else (e[1], e[2])
        assert start == expected, f"{e} where seq {expected} was due; events: {events}"
        expected = start + count
    assert expected == total + 1, f"ended before {total}: {events}"


def top(events: list[list[Any]]) -> int:
    return max((e[1] if e[0] == "push" else e[1] + e[2] - 1 for e in events), default=0)


async def cut_and_resume(qp: QueuePage) -> None:
    await qp.evaluate("() => window.__sockets[window.__sockets.length - 1].close()")
    await qp.wait(
        "() => window.__sockets.length === 2 && window.client.state === 'open'"
        " && window.client.resumed",
        what="the client to reconnect and resume",
    )


async def test_the_resuming_hello_restates_ring_positions(page: Page) -> None:
    async with serve() as served:
        rubris = served.rubris
        qp = await open_page(page, served.url)
        info = await qp.evaluate(SUBSCRIBE, ["ring", "ring.b", {}])
        await qp.evaluate(SUBSCRIBE, ["snap", "snap.b", {}])
        publish(rubris, "ring.b", 1, 3)
        await qp.wait("() => window.ring.events.length === 3", what="three ring messages")
        await cut_and_resume(qp)
        first = (await qp.evaluate("() => window.__out[1]"))[0]
        token = (await qp.evaluate("() => window.__out[0]"))[0][0]
        assert token == {"kind": "HELLO", "resume": ""}
        # HELLO with the token, then the ring's position; the snapshot is not restated
        assert first[0]["kind"] == "HELLO" and first[0]["resume"]
        assert first[1:] == [
            {
                "kind": "SUBSCRIBE",
                "name": "ring.b",
                "epoch": info["epoch"],
                "since": 3,
                "params": "",
            }
        ]
        # the answer reaches onSubscribed, as a recovery after a new session does
        infos = await qp.wait(
            "() => window.ring.infos.length === 2 && window.ring.infos", what="a second SUBSCRIBED"
        )
        assert infos[1]["recovered"] is True and infos[1]["epoch"] == info["epoch"]
        publish(rubris, "ring.b", 4, 4)
        await qp.wait("() => window.ring.events.length === 4", what="the next ring message")
        assert await qp.evaluate("() => window.ring.events") == [["push", n] for n in (1, 2, 3, 4)]
        qp.assert_clean()


@pytest.mark.parametrize("lost", [5, 20])  # within the ring of 8, and past it (a GAP)
async def test_every_ring_seq_once_or_in_a_gap_after_a_cut(page: Page, lost: int) -> None:
    async with serve() as served:
        rubris = served.rubris
        qp = await open_page(page, served.url)
        await qp.evaluate(SUBSCRIBE, ["ring", "ring.cut", {}])
        publish(rubris, "ring.cut", 1, 3)
        await qp.wait("() => window.ring.events.length === 3", what="three ring messages")
        sid = await qp.evaluate("() => window.client.sessionId")
        session = rubris.engine.sessions[sid]
        # the server writes these to the socket; the page never sees them
        await qp.evaluate("() => { window.__deaf = true; }")
        publish(rubris, "ring.cut", 4, 3 + lost)
        await until(lambda: not session.pending, "the server to write them")
        await qp.evaluate("() => new Promise((r) => setTimeout(r, 200))")
        await qp.evaluate("() => { window.__deaf = false; }")
        await cut_and_resume(qp)
        publish(rubris, "ring.cut", 4 + lost, 6 + lost)
        await qp.wait(
            """(n) => window.ring.events.some((e) => e[0] === 'push' && e[1] === n)""",
            6 + lost,
            what="the messages after the resume",
        )
        events = await qp.evaluate("() => window.ring.events")
        assert top(events) == 6 + lost
        assert_exact(events, 6 + lost)
        infos = await qp.evaluate("() => window.ring.infos")
        if lost <= 8:
            assert events == [["push", n] for n in range(1, 7 + lost)]
            assert infos[-1]["recovered"] is True
        else:
            assert [e for e in events if e[0] == "gap"] == [["gap", 4, lost - 8]]
            assert infos[-1]["recovered"] is False
        qp.assert_clean()


async def test_late_joiners_get_the_last_n(page: Page) -> None:
    async with serve() as served:
        rubris = served.rubris
        qp = await open_page(page, served.url)
        refused = await qp.evaluate(
            """() => [{ last: 0 }, { last: 1.5 }, { last: 2, params: [1] },
                      { last: 2, params: 'x' }].map((opts) => {
                    try { window.client.subscribe('ring.x', () => {}, opts); return 'accepted'; }
                    catch (err) { return err.name; }
                })"""
        )
        assert refused == ["TypeError"] * 4

        publish(rubris, "ring.late", 1, 5)
        await qp.evaluate(SUBSCRIBE, ["a", "ring.late", {"last": 3}])
        await qp.wait("() => window.a.events.length === 3", what="the last three")
        # the SUBSCRIBE asked for them
        sent = [m for f in await qp.evaluate("() => window.__out[0]") for m in f]
        asks = [m for m in sent if m["kind"] == "SUBSCRIBE" and m["name"] == "ring.late"]
        assert [(m["epoch"], m["since"], m["params"]) for m in asks] == [(0, 0, '{"last":3}')]
        # joining the active wire: from what the client delivered and keeps (3 here)
        await qp.evaluate(SUBSCRIBE, ["b", "ring.late", {"last": 2}])
        await qp.evaluate(SUBSCRIBE, ["c", "ring.late", {}])
        await qp.evaluate(SUBSCRIBE, ["d", "ring.late", {"last": 10}])
        publish(rubris, "ring.late", 6, 6)
        await qp.wait(
            "() => ['a', 'b', 'c', 'd'].every((k) => window[k].events.some((e) => e[1] === 6))",
            what="the next message everywhere",
        )
        got = {k: await qp.evaluate(f"() => window.{k}.events") for k in "abcd"}
        assert got["a"] == [["push", n] for n in (3, 4, 5, 6)]
        assert got["b"] == [["push", n] for n in (4, 5, 6)]
        assert got["c"] == [["push", 6]]
        assert got["d"] == [["push", n] for n in (3, 4, 5, 6)]  # the client kept 3

        # two listeners joining before the answer: each gets its own share of the replay
        publish(rubris, "ring.two", 1, 5)
        await qp.evaluate(
            """() => {
                window.e = { events: [] }; window.f = { events: [] }; window.g = { events: [] };
                const on = (rec) => (v, m) => rec.events.push(['push', m.seq]);
                window.client.subscribe('ring.two', on(window.e), { last: 4 });
                window.client.subscribe('ring.two', on(window.f), { last: 1 });
                window.client.subscribe('ring.two', on(window.g));
            }"""
        )
        await qp.wait("() => window.e.events.length === 4", what="the replay of four")
        publish(rubris, "ring.two", 6, 6)
        await qp.wait(
            "() => ['e', 'f', 'g'].every((k) => window[k].events.some((e) => e[1] === 6))",
            what="the next message everywhere",
        )
        got = {k: await qp.evaluate(f"() => window.{k}.events") for k in "efg"}
        assert got["e"] == [["push", n] for n in (2, 3, 4, 5, 6)]
        assert got["f"] == [["push", 5], ["push", 6]]
        assert got["g"] == [["push", 6]]
        sent = [m for f in await qp.evaluate("() => window.__out[0]") for m in f]
        asks = [m for m in sent if m["kind"] == "SUBSCRIBE" and m["name"] == "ring.two"]
        assert [m["params"] for m in asks] == ['{"last":4}']

        # a resume restates the position; `last` is not asked again
        await cut_and_resume(qp)
        first = (await qp.evaluate("() => window.__out[1]"))[0]
        restated = {m["name"]: (m["since"], m["params"]) for m in first[1:]}
        assert restated == {"ring.late": (6, ""), "ring.two": (6, "")}
        qp.assert_clean()
