"""The browser client's ``watchBatch`` (protocol.md 8c) in headless Chromium.

A real uvicorn serves rubris (batch tracking in memory) at /rubris and an empty page at /, in
the test's own event loop (tests/server.py): the test opens, seals and acks a batch through
``rubris.batches`` while the page watches ``batch.{id}`` over a real WebSocket or long-poll.
The launch, the page and its error checks are tests/test_browser_queues.py's.
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

from rubris_asgi import Config, Rubris, Timing
from rubris_asgi.batches import MemoryBatchStore

from .server import run_server
from .test_browser_queues import (
    PAGE,
    TRANSPORTS,
    QueuePage,
    Served,
    until,
)

pytestmark = pytest.mark.browser

N = 5

# Starts a watch in the page: window.updates gets every state, window.outcome the end.
WATCH = """([id, timeout]) => {
    window.updates = [];
    window.outcome = null;
    window.client.watchBatch(id, (state) => { window.updates.push(state); },
                             timeout === null ? {} : { timeout })
        .then((state) => { window.outcome = { ok: state }; },
              (err) => { window.outcome = { name: err.name, code: err.code }; });
}"""


@contextlib.asynccontextmanager
async def serve() -> AsyncIterator[Served]:
    rubris = Rubris(
        Config(timing=Timing(poll_timeout=1.0, session_timeout=5.0)), batches=MemoryBatchStore()
    )

    async def index(request: Request) -> HTMLResponse:
        return HTMLResponse(PAGE)

    app = Starlette(routes=[Route("/", index), Mount("/rubris", rubris)], lifespan=rubris.lifespan)
    async with run_server(app) as url:
        yield Served(rubris, url)


def state(st: str, total: int, done: int, completed: bool = False) -> dict[str, Any]:
    return {"state": st, "total": total, "done": done, "failed": 0, "completed": completed}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_page_watches_a_batch_to_completion(page: Page, transport: str) -> None:
    async with serve() as served:
        rubris = served.rubris
        qp = QueuePage(page, served.url)
        await qp.open(transport)
        batch = await rubris.batches.open()
        ids = (await rubris.batches.add(batch, N)).ids()
        await rubris.batches.seal(batch)
        await qp.evaluate(WATCH, [batch, None])
        await qp.wait("() => window.updates.length === 1", what="the first state")
        for k, item in enumerate(ids, 1):
            await rubris.batches.ack([item])
            # one ack at a time, each seen before the next (a snapshot would conflate them)
            await qp.wait("(k) => window.updates.some((u) => u.done === k)", k, what=f"done == {k}")
        outcome = await qp.wait("() => window.outcome", what="watchBatch to settle")
        assert outcome == {"ok": state("complete", N, N, True)}
        updates = await qp.evaluate("() => window.updates")
        assert updates[0] == state("sealed", N, 0)
        assert [u["done"] for u in updates] == list(range(N + 1))  # every step of progress
        assert updates[-1] == outcome["ok"]
        await until(lambda: not rubris.has_subscribers(f"batch.{batch}"), "the page let go")

        # a late watch of the finished batch resolves at once with its final state
        await qp.evaluate(WATCH, [batch, None])
        late = await qp.wait("() => window.outcome", what="the late watch")
        assert late["ok"]["state"] == "complete" and late["ok"]["done"] == N
        assert await qp.evaluate("() => window.updates.length") == 1
        qp.assert_clean()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_unknown_batch_rejects(page: Page, transport: str) -> None:
    async with serve() as served:
        qp = QueuePage(page, served.url)
        await qp.open(transport)
        await qp.evaluate(WATCH, ["nosuchbatch", None])
        outcome = await qp.wait("() => window.outcome", what="the refusal")
        assert outcome == {"name": "RubrisError", "code": 3}
        assert await qp.evaluate("() => window.updates") == []
        assert "batch.nosuchbatch" not in served.rubris.engine.topics
        # the client is fine afterwards: a known batch can be watched
        batch = await served.rubris.batches.open()
        await qp.evaluate(WATCH, [batch, None])
        await qp.wait("() => window.updates.length === 1", what="a state of a known batch")
        assert (await qp.evaluate("() => window.updates"))[0] == state("open", 0, 0)
        qp.assert_clean()


async def test_a_timeout_rejects_and_lets_go(page: Page) -> None:
    async with serve() as served:
        rubris = served.rubris
        qp = QueuePage(page, served.url)
        await qp.open("websocket")
        batch = await rubris.batches.open()
        await rubris.batches.add(batch, 2)
        await qp.evaluate(WATCH, [batch, 300])
        outcome = await qp.wait("() => window.outcome", what="the timeout")
        assert outcome == {"name": "RubrisError", "code": "timeout"}
        assert await qp.evaluate("() => window.updates") == [state("open", 2, 0)]
        await until(lambda: not rubris.has_subscribers(f"batch.{batch}"), "the page let go")
        qp.assert_clean()


async def test_closing_the_client_rejects_a_watch(page: Page) -> None:
    async with serve() as served:
        qp = QueuePage(page, served.url)
        await qp.open("websocket")
        batch = await served.rubris.batches.open()
        await qp.evaluate(WATCH, [batch, None])
        await qp.wait("() => window.updates.length === 1", what="the first state")
        await qp.evaluate("() => window.client.close()")
        outcome = await qp.wait("() => window.outcome", what="the rejection")
        assert outcome == {"name": "RubrisError", "code": "closed"}
        qp.assert_clean()
