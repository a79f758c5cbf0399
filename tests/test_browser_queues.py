"""The browser client's queue consumers (protocol.md section 5, mode 4) in headless Chromium.

A real uvicorn serves a small Starlette app (rubris at /rubris, an empty page at /) in the test's
own event loop (tests/server.py), so a test enqueues straight into the app and reads its queue
statistics while the page consumes over a real WebSocket or long-poll. Playwright's async API
shares that loop. Every wait is on a condition, bounded by a timeout.

Console errors and uncaught page errors fail a test, except those a test expects (a handler
that throws on purpose is reported with ``reportError``, which the page shows as an error).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from playwright.async_api import ConsoleMessage, Page
from playwright.async_api import TimeoutError as PlaywrightTimeoutError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Mount, Route

from rubris_asgi import Config, Rubris, Session, Timing
from rubris_asgi.control.codel import CoDel

from .server import run_server

pytestmark = pytest.mark.browser

WAIT_MS = 15_000  # bound of one wait in the page
WAIT_S = 15.0  # bound of one wait on the server's statistics
TRANSPORTS = ["websocket", "longpoll"]

PAGE = (
    '<!doctype html><meta charset=utf-8><link rel=icon href="data:,">'
    "<title>rubris queues</title><body></body>"
)

# Runs in the page before anything else: every WebSocket is kept in window.__sockets, and the
# messages each one carries are decoded (with the client's own codec) into window.__wire:
# {socket, dir: "in"|"out", kind, topic, tags|tag|params}. Lets a test check which connection
# an ACK or NACK went out on, and what SUBSCRIBE asked for.
WIRE_TAP = """() => {
    const Real = window.WebSocket;
    window.__sockets = [];
    window.__wire = [];
    const codec = import('/rubris/client.js').then((m) => m._internal);
    let c = null;
    codec.then((x) => { c = x; });
    const utf8 = new TextDecoder();
    const kept = {
        0x0c: (m) => ({kind: 'ITEM', topic: m.topic, tag: m.tag}),
        0x0d: (m) => ({kind: 'REVOKE', topic: m.topic, tags: m.tags}),
        0x25: (m) => ({kind: 'ACK', topic: m.topic, tags: m.numbers.slice(1)}),
        0x26: (m) => ({kind: 'NACK', topic: m.topic, tag: m.tag}),
        0x22: (m) => ({kind: 'SUBSCRIBE', name: m.name, params: utf8.decode(m.params)}),
    };
    const note = (socket, dir, bytes) => {
        const msgs = dir === 'in' ? c.decodeFrame(bytes) : c.decodeClientFrame(bytes);
        for (const m of msgs) {
            if (kept[m.kind]) window.__wire.push({socket, dir, ...kept[m.kind](m)});
        }
    };
    window.WebSocket = class extends Real {
        constructor(url, protocols) {
            super(url, protocols);
            this.__index = window.__sockets.push(this) - 1;
        }
        set onmessage(fn) {
            super.onmessage = fn && ((ev) => {
                if (typeof ev.data !== 'string') note(this.__index, 'in', new Uint8Array(ev.data));
                return fn(ev);
            });
        }
        get onmessage() { return super.onmessage; }
        send(frame) {
            note(this.__index, 'out', frame instanceof Uint8Array ? frame : new Uint8Array(frame));
            return super.send(frame);
        }
    };
}"""


# ---- the server ------------------------------------------------------------------------------


def make_app(**queue: Any) -> tuple[Rubris, Starlette]:
    """rubris at /rubris with the queue channel ``jobs.{kind}`` (``queue``: its settings) and a
    snapshot channel ``plain.{name}``."""
    rubris = Rubris(Config(timing=Timing(poll_timeout=1.0, session_timeout=5.0)))

    @rubris.queue("jobs.{kind}", **queue)
    async def jobs(session: Session, kind: str) -> None:
        return None

    @rubris.shared("plain.{name}", snapshot=True)
    async def plain(session: Session, name: str) -> Any:
        return {"plain": name}

    async def index(request: Request) -> HTMLResponse:
        return HTMLResponse(PAGE)

    app = Starlette(routes=[Route("/", index), Mount("/rubris", rubris)], lifespan=rubris.lifespan)
    return rubris, app


async def until(cond: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    """Poll ``cond`` (on the server's side) until it is truthy; returns its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.02)


def queue_stats(rubris: Rubris, name: str) -> Any:
    try:
        return rubris.queue_stats(name)
    except KeyError:
        return None


def settled(rubris: Rubris, name: str, acked: int) -> Any:
    """The queue's stats once ``acked`` items are acked and nothing waits or is out."""
    s = queue_stats(rubris, name)
    if s is not None and s.acked >= acked and s.waiting == 0 and s.outstanding == 0:
        return s
    return None


# ---- the page --------------------------------------------------------------------------------


@dataclass
class QueuePage:
    """The test page, with its console and page errors recorded."""

    page: Page
    url: str
    errors: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)
    expected: list[re.Pattern[str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.page.on("console", self._on_console)
        self.page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))

    def _on_console(self, msg: ConsoleMessage) -> None:
        line = f"{msg.type}: {msg.text}"
        self.console.append(line)
        if msg.type == "error":
            self.errors.append(line)

    async def open(self, transport: str) -> None:
        await self.page.goto(self.url + "/", wait_until="load")
        await self.page.evaluate(
            """async (transport) => {
                const { connect } = await import('/rubris/client.js');
                window.client = connect('/rubris', { transport, backoffMaxMs: 500 });
                await new Promise((resolve) => {
                    window.client.on('state', (e) => { if (e.state === 'open') resolve(); });
                });
            }""",
            transport,
        )

    async def wait(self, expression: str, arg: Any = None, *, what: str) -> Any:
        try:
            handle = await self.page.wait_for_function(expression, arg=arg, timeout=WAIT_MS)
            return await handle.json_value()
        except PlaywrightTimeoutError:
            raise AssertionError(
                f"timed out waiting for {what}\n"
                f"client: {await self.evaluate('() => window.client && window.client.stats')}\n"
                "console (last 15):\n  " + "\n  ".join(self.console[-15:])
            ) from None

    async def evaluate(self, expression: str, arg: Any = None) -> Any:
        return await self.page.evaluate(expression, arg)

    async def consumer_stats(self, var: str = "consumer") -> dict[str, int]:
        return dict(await self.evaluate(f"() => window.{var}.stats"))

    def expect_error(self, pattern: str) -> None:
        self.expected.append(re.compile(pattern))

    def assert_clean(self) -> None:
        unexpected = [e for e in self.errors if not any(p.search(e) for p in self.expected)]
        assert not unexpected, "browser errors:\n  " + "\n  ".join(unexpected)


@dataclass
class Served:
    rubris: Rubris
    url: str


@contextlib.asynccontextmanager
async def serve(**queue: Any) -> AsyncIterator[Served]:
    """The app (``make_app(**queue)``) on a free port."""
    rubris, app = make_app(**queue)
    async with run_server(app) as url:
        yield Served(rubris, url)


# ---- tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_page_acks_every_item_exactly_once(page: Page, transport: str) -> None:
    """N items enqueued on the server, consumed by a page with the defaults (the server sizes
    the prefetch; CoDel on at both ends): each is handled once and ACKed once."""
    n = 300
    async with serve() as served:
        qp = QueuePage(page, served.url)
        await qp.open(transport)
        await qp.evaluate(
            """async () => {
                window.done = [];
                window.consumer = window.client.consume('jobs.work', async (item) => {
                    if (item.topic !== 'jobs.work' || !(item.tag > 0)) throw new Error('bad item');
                    if (item.value.n % 25 === 0) await new Promise((r) => setTimeout(r, 2));
                    window.done.push(item.value.n);
                });
                await window.consumer.ready;
            }"""
        )
        for i in range(n):
            served.rubris.enqueue("jobs.work", {"n": i})
        stats = await until(lambda: settled(served.rubris, "jobs.work", n), f"{n} acks")
        assert stats.acked == n and stats.dead_lettered == 0, stats  # each acked exactly once
        done = await qp.wait("(n) => window.done.length >= n && window.done", n, what="handled")
        ps = await qp.consumer_stats()
        assert set(done) == set(range(n)), ps
        # The handler saw an item twice only if the server took it back after it had started
        # (server-side CoDel's REVOKE comes too late for it; the ACK of the first delivery is
        # then ignored): at least once, as protocol.md section 5 says.
        assert len(done) - n <= stats.revoked, (ps, stats)
        assert ps["acked"] == ps["taken"] == len(done) and ps["stale"] == 0, ps
        # everything else the page received it gave back: to CoDel, or REVOKEd by the server
        given_back = ps["codelReturned"] + ps["revoked"] + ps["overflowed"]
        assert ps["received"] == ps["taken"] + given_back, ps
        await qp.evaluate("() => window.consumer.close()")
        await until(lambda: queue_stats(served.rubris, "jobs.work").consumers == 0, "unsubscribe")
        qp.assert_clean()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_throwing_handler_gets_the_item_back_with_attempt_2(
    page: Page, transport: str
) -> None:
    async with serve(codel_target=None) as served:
        qp = QueuePage(page, served.url)
        qp.expect_error(r"deliberate failure of item 2")
        await qp.open(transport)
        await qp.evaluate(
            """async () => {
                window.seen = [];
                window.consumer = window.client.consume('jobs.flaky', (item) => {
                    window.seen.push([item.value.n, item.attempt]);
                    if (item.value.n === 2 && item.attempt === 1) {
                        throw new Error('deliberate failure of item 2');
                    }
                }, { codelTarget: null });
                await window.consumer.ready;
            }"""
        )
        for i in range(5):
            served.rubris.enqueue("jobs.flaky", {"n": i})
        stats = await until(lambda: settled(served.rubris, "jobs.flaky", 5), "5 acks")
        assert stats.acked == 5 and stats.nacked == 1 and stats.requeued == 1, stats
        seen = await qp.evaluate("() => window.seen")
        assert sorted(map(tuple, seen)) == [(0, 1), (1, 1), (2, 1), (2, 2), (3, 1), (4, 1)]
        ps = await qp.consumer_stats()
        assert (ps["acked"], ps["nacked"], ps["taken"]) == (5, 1, 6), ps
        qp.assert_clean()


@pytest.mark.parametrize("prefetch", [1, 4])
async def test_the_prefetch_asked_for_bounds_what_the_page_holds(page: Page, prefetch: int) -> None:
    """SUBSCRIBE params {"prefetch": n}: never more than n unacknowledged at the page (the
    handler sees n - 1 waiting behind it at most, and the server counts n outstanding)."""
    n = 16
    async with serve(codel_target=None) as served:
        qp = QueuePage(page, served.url)
        await qp.page.add_init_script(script=f"({WIRE_TAP})()")
        await qp.open("websocket")
        await qp.evaluate(
            """async (prefetch) => {
                window.behind = [];
                window.consumer = window.client.consume('jobs.one', async (item) => {
                    window.behind.push(window.consumer.stats.buffered);
                    await new Promise((r) => setTimeout(r, 15));
                }, { prefetch, codelTarget: null });
                await window.consumer.ready;
            }""",
            prefetch,
        )
        subscribes = await qp.evaluate("() => window.__wire.filter((m) => m.kind === 'SUBSCRIBE')")
        assert [json.loads(m["params"]) for m in subscribes] == [{"prefetch": prefetch}]
        for i in range(n):
            served.rubris.enqueue("jobs.one", {"n": i})
        most = 0
        deadline = time.monotonic() + WAIT_S
        while (s := queue_stats(served.rubris, "jobs.one")) is None or s.acked < n:
            most = max(most, s.outstanding if s else 0)
            assert time.monotonic() < deadline, f"timed out: {s}"
            await asyncio.sleep(0.003)
        assert 1 <= most <= prefetch
        behind = await qp.evaluate("() => window.behind")
        assert len(behind) == n and max(behind) == prefetch - 1, behind
        qp.assert_clean()


async def test_server_side_codel_revokes_and_the_page_drops_those_items(page: Page) -> None:
    """A page that asked for a large prefetch and works slowly builds a standing queue; the
    server's CoDel takes items back with REVOKE, and the page never starts those."""
    n = 60
    async with serve(codel_target=0.020, codel_interval=0.100) as served:
        qp = QueuePage(page, served.url)
        await qp.page.add_init_script(script=f"({WIRE_TAP})()")
        await qp.open("websocket")
        await qp.evaluate(
            """async () => {
                window.done = [];
                window.consumer = window.client.consume('jobs.slow', async (item) => {
                    await new Promise((r) => setTimeout(r, 20));
                    window.done.push(item.value.n);
                }, { prefetch: 40, codelTarget: null });
                await window.consumer.ready;
            }"""
        )
        for i in range(n):
            served.rubris.enqueue("jobs.slow", {"n": i})
        stats = await until(lambda: settled(served.rubris, "jobs.slow", n), f"{n} acks", 30)
        assert stats.revoked > 0 and stats.acked == n, stats
        ps = await qp.consumer_stats()
        assert ps["revoked"] > 0 and ps["acked"] == n, ps
        done = await qp.evaluate("() => window.done")
        assert sorted(done) == list(range(n))  # a revoked item was never started
        wire = await qp.evaluate("() => window.__wire")
        revoked = {t for m in wire if m["kind"] == "REVOKE" for t in m["tags"]}
        acked = {t for m in wire if m["kind"] == "ACK" for t in m["tags"]}
        assert revoked and acked and not (revoked & acked)  # only unstarted items went back
        qp.assert_clean()


async def test_client_side_codel_gives_back_what_waits_too_long(page: Page) -> None:
    """Server-side CoDel off; the page's own CoDel (20 ms / 100 ms) NACKs items that waited in
    its buffer behind a slow handler; they come back with a higher attempt, each item is still
    done exactly once."""
    n = 60
    async with serve(codel_target=None) as served:
        qp = QueuePage(page, served.url)
        await qp.open("websocket")
        await qp.evaluate(
            """async () => {
                window.done = [];
                const busy = (ms) => {
                    const t = performance.now();
                    while (performance.now() - t < ms);
                };
                window.consumer = window.client.consume('jobs.codel', (item) => {
                    busy(10);
                    window.done.push([item.value.n, item.attempt]);
                }, { prefetch: 30, codelTarget: 20, codelInterval: 100 });
                await window.consumer.ready;
            }"""
        )
        for i in range(n):
            served.rubris.enqueue("jobs.codel", {"n": i})
        stats = await until(lambda: settled(served.rubris, "jobs.codel", n), f"{n} acks", 30)
        ps = await qp.consumer_stats()
        assert ps["codelReturned"] > 0 and ps["acked"] == n, ps
        assert stats.acked == n and stats.nacked == ps["codelReturned"], stats
        done = await qp.evaluate("() => window.done")
        assert sorted(d[0] for d in done) == list(range(n))
        assert any(attempt > 1 for _, attempt in done)  # what went back came again
        qp.assert_clean()


@pytest.mark.parametrize("resume", [True, False])
async def test_a_dropped_connection_never_acks_items_of_the_old_one(
    page: Page, resume: bool
) -> None:
    """The socket is cut while items wait in the page and one is in the handler. The server
    takes them back; the page clears its buffer, sends no ACK or NACK of the old connection's
    items on the new one, and (new session) subscribes again with the same prefetch."""
    n = 60
    async with serve(codel_target=None) as served:
        qp = QueuePage(page, served.url)
        qp.expect_error(r"WebSocket connection to .* failed|net::ERR_")
        await qp.page.add_init_script(script=f"({WIRE_TAP})()")
        await qp.open("websocket")
        await qp.evaluate(
            """async () => {
                window.done = [];
                window.consumer = window.client.consume('jobs.cut', async (item) => {
                    await new Promise((r) => setTimeout(r, 10));
                    window.done.push(item.value.n);
                }, { prefetch: 8, codelTarget: null });
                await window.consumer.ready;
            }"""
        )
        session = await qp.evaluate("() => window.client.sessionId")
        for i in range(n):
            served.rubris.enqueue("jobs.cut", {"n": i})
        await qp.wait("() => window.done.length >= 10", what="10 items done")
        await qp.evaluate(
            """(resume) => {
                if (!resume) window.client._resume = '';  // as if the session had expired
                window.__sockets.forEach((ws) => ws.close());
            }""",
            resume,
        )
        stats = await until(lambda: settled(served.rubris, "jobs.cut", n), f"{n} acks", 30)
        assert stats.acked == n and stats.dead_lettered == 0, stats
        assert (await qp.evaluate("() => window.client.sessionId") == session) is resume
        assert await qp.evaluate("() => window.client.resumed") is resume

        ps = await qp.consumer_stats()
        done = await qp.evaluate("() => window.done")
        assert set(done) == set(range(n)), ps  # at least once: all of them
        # every item the handler finished was ACKed once on its own connection, or found
        # stale (its connection gone before the ACK was written)
        assert len(done) == ps["acked"] + ps["stale"], (len(done), ps)
        # the server's acked == n above is the exactly-once; ACKs written just before the cut
        # may be lost with the socket (several in one frame when the page is slow), and those
        # items come again: at most the 8 the page held (its prefetch) are done twice
        assert n <= ps["acked"] <= n + 8, ps
        assert len(done) - n == ps["acked"] + ps["stale"] - n <= 8, (len(done), ps)
        assert ps["cleared"] + ps["stale"] > 0, ps  # the drop did catch items at the page
        wire = await qp.evaluate("() => window.__wire")
        sockets = sorted({m["socket"] for m in wire})
        assert len(sockets) >= 2, sockets
        for s in sockets:
            items = {m["tag"] for m in wire if m["socket"] == s and m["kind"] == "ITEM"}
            settled_tags = [
                t
                for m in wire
                if m["socket"] == s and m["kind"] in ("ACK", "NACK")
                for t in (m["tags"] if m["kind"] == "ACK" else [m["tag"]])
            ]
            assert set(settled_tags) <= items, (s, sorted(set(settled_tags) - items))
        subscribes = [m for m in wire if m["kind"] == "SUBSCRIBE"]
        assert len(subscribes) == (1 if resume else 2), subscribes
        assert all(json.loads(m["params"]) == {"prefetch": 8} for m in subscribes), subscribes
        qp.assert_clean()


async def test_the_async_iterator_form(page: Page) -> None:
    """`for await (const item of client.consume(name))`: the loop's body is the handler (an item
    is ACKed when the loop asks for the next); leaving the loop closes the consumer, and an item
    the body had not settled goes back to the queue (with the UNSUBSCRIBE: attempt 2 later)."""
    n = 20
    async with serve(codel_target=None) as served:
        qp = QueuePage(page, served.url)
        await qp.open("longpoll")
        for i in range(n):
            served.rubris.enqueue("jobs.iter", {"n": i})
        first = await qp.evaluate(
            """async () => {
                const got = [];
                window.consumer = window.client.consume('jobs.iter', { codelTarget: null });
                for await (const item of window.consumer) {
                    got.push([item.value.n, item.attempt]);
                    if (got.length === 10) break;  // this one is left unsettled
                }
                return got;
            }"""
        )
        assert len(first) == 10 and all(attempt == 1 for _, attempt in first)
        await until(
            lambda: (
                (s := queue_stats(served.rubris, "jobs.iter"))
                and s.consumers == 0
                and s.outstanding == 0
            ),
            "the consumer to go",
        )
        s = queue_stats(served.rubris, "jobs.iter")
        assert s.acked == 9 and s.nacked == 0, s
        second = await qp.evaluate(
            """async (left) => {
                const got = [];
                const consumer = window.client.consume('jobs.iter', { codelTarget: null });
                for await (const item of consumer) {
                    got.push([item.value.n, item.attempt]);
                    if (got.length === left) {
                        item.ack();  // done before leaving the loop
                        break;
                    }
                }
                return got;
            }""",
            n - 9,
        )
        stats = await until(lambda: settled(served.rubris, "jobs.iter", n), f"{n} acks")
        assert stats.acked == n, stats
        left = first[-1][0]
        assert [left, 2] in second  # the item the first loop left came back
        assert sorted([m for m, _ in first[:-1]] + [m for m, _ in second]) == list(range(n))
        qp.assert_clean()


async def test_subscribe_on_a_queue_topic_and_one_consumer_a_topic(page: Page) -> None:
    """subscribe() on a queue topic consumes it too (callback(value, meta), ACK on return); a
    second consume() of a topic this client already takes fails with code 6, one of a name no
    channel offers with the server's REJECTED (code 3), one of a topic that is no queue with
    code 3 too (and the client lets go of that subscription)."""
    n = 10
    async with serve(codel_target=None) as served:
        qp = QueuePage(page, served.url)
        await qp.open("websocket")
        await qp.evaluate(
            """async () => {
                window.seen = [];
                window.sub = window.client.subscribe('jobs.sub', (value, meta) => {
                    window.seen.push([value.n, meta.name, meta.attempt, meta.tag > 0]);
                });
                await window.sub.ready;
            }"""
        )
        for i in range(n):
            served.rubris.enqueue("jobs.sub", {"n": i})
        stats = await until(lambda: settled(served.rubris, "jobs.sub", n), f"{n} acks")
        assert stats.acked == n, stats
        seen = await qp.evaluate("() => window.seen")
        assert seen == [[i, "jobs.sub", 1, True] for i in range(n)]
        refused = await qp.evaluate(
            """async () => {
                const out = [];
                for (const name of ['jobs.sub', 'nothing.here', 'plain.x']) {
                    const c = window.client.consume(name, () => {});
                    try { await c.ready; out.push([name, 'ok']); }
                    catch (err) { out.push([name, err.code, c.closed]); }
                }
                return out;
            }"""
        )
        assert refused == [["jobs.sub", 6, True], ["nothing.here", 3, True], ["plain.x", 3, True]]
        # it was subscribed (SUBSCRIBED told the mode), and given back
        await until(lambda: not served.rubris.has_subscribers("plain.x"), "plain.x let go")
        qp.assert_clean()


async def test_codel_in_the_page_decides_as_the_server_does(page: Page) -> None:
    """codel.js is a port of rubris_asgi/queues/codel.py: the same sojourns at the same times
    give the same verdicts."""
    rng = random.Random(8289)
    t = 1000.0
    steps: list[tuple[float, float]] = []
    for _ in range(3000):
        t += rng.choice([1, 3, 7, 15, 40])
        regime = int(t // 700) % 3  # stretches of short, long and mixed sojourns
        low, high = [(0, 19), (21, 200), (0, 60)][regime]
        steps.append((round(rng.uniform(low, high), 3), t))
    codel = CoDel(target=20, interval=100)  # unit-free: ms here, as in the page
    expected = [codel.should_drop(s, now) for s, now in steps]
    async with serve() as served:
        await page.goto(served.url + "/", wait_until="load")
        got = await page.evaluate(
            """async (steps) => {
                const { _internal } = await import('/rubris/client.js');
                const c = new _internal.CoDel(20, 100);
                return steps.map(([s, now]) => c.shouldDrop(s, now));
            }""",
            steps,
        )
    assert any(expected) and not all(expected)
    assert got == expected
