"""The browser client's errors name their subject (issue 36, item 3), in headless Chromium.

A refused subscribe's ``RubrisError`` names the topic, a failed call's the method, once
whatever the server's reason says; ``reason`` keeps the server's own text and ``topic`` /
``method`` what was asked. The page and its checks are tests/test_browser_queues.py's; the
Python side of the same texts is tests/test_error_texts.py.
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

from rubris_asgi import Config, Reject, Rubris, Session, Timing

from .server import run_server
from .test_browser_queues import PAGE, TRANSPORTS, QueuePage, Served

pytestmark = pytest.mark.browser

# Each attempt's outcome: the error's message, code, reason and what it names.
ATTEMPTS = """async () => {
    const outcome = (err) => ({
        message: err.message, code: err.code, reason: err.reason ?? null,
        topic: err.topic ?? null, method: err.method ?? null,
    });
    const out = {};
    const attempts = {
        unknownTopic: () => window.client.subscribe('prics.AAPL', () => {}).ready,
        refusedTopic: () => window.client.subscribe('prices.NOPE', () => {}).ready,
        unknownQueue: () => window.client.consume('jbos.resize', () => {}).ready,
        unknownMethod: () => window.client.call('plce_order', { qty: 1 }),
        refusedCall: () => window.client.call('place_order', { qty: 0 }),
        refusedStream: () => window.client.stream('count', -1, () => {}),
    };
    for (const [key, attempt] of Object.entries(attempts)) {
        try { await attempt(); out[key] = 'ok'; }
        catch (err) { out[key] = outcome(err); }
    }
    return out;
}"""


@contextlib.asynccontextmanager
async def serve() -> AsyncIterator[Served]:
    rubris = Rubris(Config(timing=Timing(poll_timeout=1.0, session_timeout=5.0)), batches=False)

    @rubris.shared("prices.{symbol}", snapshot=True)
    async def prices(session: Session, symbol: str) -> Any:
        if symbol == "NOPE":
            raise Reject("unknown symbol")
        return {"px": 1}

    @rubris.rpc("place_order")
    async def place_order(session: Session, args: Any) -> Any:
        raise Reject("qty must be at least 1")

    @rubris.rpc("count")
    async def count(session: Session, args: Any) -> AsyncIterator[int]:
        if args < 0:
            raise Reject("cannot count to a negative number")
        yield 0

    async def index(request: Request) -> HTMLResponse:
        return HTMLResponse(PAGE)

    app = Starlette(routes=[Route("/", index), Mount("/rubris", rubris)], lifespan=rubris.lifespan)
    async with run_server(app) as url:
        yield Served(rubris, url)


def refused(message: str, code: int, reason: str, **what: str) -> dict[str, Any]:
    return {
        "message": message,
        "code": code,
        "reason": reason,
        "topic": what.get("topic"),
        "method": what.get("method"),
    }


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_refusals_name_the_topic_or_method(page: Page, transport: str) -> None:
    async with serve() as served:
        qp = QueuePage(page, served.url)
        await qp.open(transport)
        out = await qp.evaluate(ATTEMPTS)
        assert out == {
            # the server's reason names the topic: the client does not say it again
            "unknownTopic": refused(
                "subscribe refused: unknown topic 'prics.AAPL'",
                3,
                "unknown topic 'prics.AAPL'",
                topic="prics.AAPL",
            ),
            # the application's reason does not: the client says which topic it was
            "refusedTopic": refused(
                "subscribe 'prices.NOPE' refused: unknown symbol",
                10,
                "unknown symbol",
                topic="prices.NOPE",
            ),
            "unknownQueue": refused(
                "subscribe refused: unknown topic 'jbos.resize'",
                3,
                "unknown topic 'jbos.resize'",
                topic="jbos.resize",
            ),
            "unknownMethod": refused(
                "call failed: unknown method 'plce_order'",
                3,
                "unknown method 'plce_order'",
                method="plce_order",
            ),
            "refusedCall": refused(
                "call 'place_order' failed: qty must be at least 1",
                10,
                "qty must be at least 1",
                method="place_order",
            ),
            "refusedStream": refused(
                "call 'count' failed: cannot count to a negative number",
                10,
                "cannot count to a negative number",
                method="count",
            ),
        }
        qp.assert_clean()
