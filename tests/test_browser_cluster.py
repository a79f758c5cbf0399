"""The browser client in front of two nodes sharing their topics through a real Redis.

The page comes from a load balancer (``Balancer``) that sends it to node A, then, after the
plug is pulled, to node B: the browser reconnects on its own and resumes its session, carried
to A; with its session gone, it subscribes again with what it holds and recovers what it
missed. A topic Redis lost restarts its numbering: the page subscribes again, carries on.
"""

from __future__ import annotations

from typing import Any

import pytest
from playwright.async_api import Page
from redis.asyncio import Redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route

from rubris_asgi import Rubris
from rubris_asgi.cluster import RedisBroker

from .apps import make_rubris
from .lbkit import Balancer
from .rediskit import RedisServer, redis_server  # noqa: F401 (the fixture)
from .server import run_server

WAIT_MS = 10_000
PAGE = "<!doctype html><title>cluster</title><p>cluster test page</p>"


@pytest.fixture
def url(redis_server: RedisServer) -> str:  # noqa: F811 (the fixture)
    redis_server.flush()
    return redis_server.url


def node_app(rubris: Rubris) -> Starlette:
    async def index(request: Request) -> HTMLResponse:
        return HTMLResponse(PAGE)

    async def favicon(request: Request) -> Response:
        return Response(status_code=204)

    routes = [Route("/", index), Route("/favicon.ico", favicon), Mount("/rubris", rubris)]
    return Starlette(routes=routes, lifespan=rubris.lifespan)


async def open_page(page: Page, base: str, errors: list[str]) -> None:
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    await page.goto(base + "/", wait_until="load")
    await page.evaluate(
        """async () => {
            const { connect } = await import('/rubris/client.js');
            window.got = []; window.infos = []; window.ended = [];
            window.client = connect('/rubris', { backoffMaxMs: 300 });
            await new Promise((resolve) => {
                window.client.on('state', (e) => { if (e.state === 'open') resolve(); });
            });
        }"""
    )


async def subscribe(page: Page, name: str) -> None:
    await page.evaluate(
        """async (name) => {
            const sub = window.client.subscribe(name, (value, meta) => {
                window.got.push([meta.seq, value]);
            }, {
                onSubscribed: (info) => window.infos.push(info),
                onUnsubscribed: (why) => window.ended.push(why),
            });
            await sub.ready;
        }""",
        name,
    )


async def wait(page: Page, expression: str, arg: Any = None) -> Any:
    handle = await page.wait_for_function(expression, arg=arg, timeout=WAIT_MS)
    return await handle.json_value()


async def test_a_page_moved_to_another_node_keeps_its_session_or_recovers(
    page: Page, url: str
) -> None:
    """Reconnected to node B while A lives, the page resumes its session (carried to A through
    Redis) and misses nothing; when its session is gone, it starts one on B and recovers the
    ring from Redis."""
    a = make_rubris(broker=RedisBroker(url), batches=False)
    b = make_rubris(broker=RedisBroker(url), batches=False)
    errors: list[str] = []
    async with run_server(node_app(a)) as base_a, run_server(node_app(b)) as base_b:
        async with Balancer([base_a, base_b]) as lb:
            await open_page(page, lb.base, errors)
            await subscribe(page, "ring.page")
            for i in range(5):
                a.publish("ring.page", i)
            await wait(page, "() => window.got.length === 5")
            lb.route(1)
            lb.cut()
            await wait(page, "() => window.client.state !== 'open'")
            for i in range(5, 8):
                b.publish("ring.page", i)
            await wait(page, "() => window.got.length === 8")
            assert len(b.relays.entries) == 1 and len(a.relays.homes) == 1  # resumed via B
            # no new subscription: the resume restated the ring (protocol §5), answered as a
            # recovery of the same one, nothing missing
            infos = await page.evaluate("() => window.infos")
            assert len(infos) == 2 and infos[1]["recovered"], infos
            assert infos[0]["epoch"] == infos[1]["epoch"], infos
            assert await page.evaluate("() => window.client.resumed") is True
            # its session gone (as with node A), the page starts one on B and recovers
            sid = next(iter(a.relays.homes))
            a.engine.end_session(a.engine.sessions[sid])
            await wait(page, "() => window.client.state !== 'open'")
            for i in range(8, 11):
                b.publish("ring.page", i)
            await wait(page, "() => window.got.length === 11")
            got = await page.evaluate("() => window.got")
            assert got == [[i + 1, i] for i in range(11)]
            infos = await page.evaluate("() => window.infos")
            assert len(infos) == 3 and infos[2]["recovered"]
            assert infos[0]["epoch"] == infos[2]["epoch"]
            assert await page.evaluate("() => window.client.resumed") is False
            assert b.stats().connected == 1 and not b.relays.entries
            a.publish("ring.page", 11)  # one topic still: A's publish reaches the page on B
            await wait(page, "() => window.got.length === 12")
            assert not errors, errors


async def test_a_page_subscribes_again_when_a_topic_restarts(page: Page, url: str) -> None:
    a = make_rubris(broker=RedisBroker(url), batches=False)
    errors: list[str] = []
    async with run_server(node_app(a)) as base:
        await open_page(page, base, errors)
        await subscribe(page, "ring.gone")
        a.publish("ring.gone", "one")
        await wait(page, "() => window.got.length === 1")
        async with Redis.from_url(url) as r:
            await r.delete("rubris:t:ring.gone", "rubris:r:ring.gone")
        a.publish("ring.gone", "lost")  # seq 1 of a new epoch: the page is told to subscribe again
        await wait(page, "() => window.infos.length === 2")
        a.publish("ring.gone", "two")
        await wait(page, "() => window.got.length === 2")
        got = await page.evaluate("() => window.got")
        infos = await page.evaluate("() => window.infos")
        assert got[1] == [2, "two"] and infos[1]["epoch"] != infos[0]["epoch"]
        assert not infos[1]["recovered"]
        assert await page.evaluate("() => window.ended") == []  # never ended
        assert not errors, errors
