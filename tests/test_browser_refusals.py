"""The browser client's connection errors name their subject and the fix (issue 36, item 2).

A wrong mount path is "no rubris endpoint at URL: is the mount path right?", not "not
authorised"; an origin refused (a proxy that rewrites Host, as Vite's ``changeOrigin`` does)
names the Origin and ``allowed_origins``. Neither is retried: the client closes with the error.
Chromium sends the page's own Origin; the proxy's rewrite is played by a route that fetches the
request with a foreign one.
The Python client's side is tests/test_client_refusals.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from playwright.async_api import Page, Route
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Mount
from starlette.routing import Route as StarletteRoute

from rubris_asgi import Config, Rubris, Timing

from .server import run_server
from .test_browser_queues import PAGE, QueuePage

pytestmark = pytest.mark.browser

# connect(url, {transport}) and the first error it reports, with the state it ends in
FIRST_ERROR = """async ([url, transport]) => {
    const { connect } = await import('/rubris/client.js');
    const client = connect(url, { transport, backoffMaxMs: 200 });
    const error = await new Promise((resolve) => client.on('error', resolve));
    await new Promise((resolve) => setTimeout(resolve, 300));  // a retry would show by now
    return { message: error.message, code: error.code, state: client.state };
}"""

FOREIGN = "http://localhost:5173"


def app(allowed: list[str] | None = None) -> tuple[Rubris, Starlette]:
    rubris = Rubris(Config(timing=Timing(poll_timeout=1.0)), allowed_origins=allowed or [])

    async def index(request: Request) -> HTMLResponse:
        return HTMLResponse(PAGE)

    routes = [StarletteRoute("/", index), Mount("/rubris", rubris)]
    return rubris, Starlette(routes=routes, lifespan=rubris.lifespan)


@pytest.mark.parametrize("transport", ["auto", "longpoll"])
async def test_a_wrong_mount_path_says_no_rubris_endpoint(page: Page, transport: str) -> None:
    _, served = app()
    async with run_server(served) as url:
        qp = QueuePage(page, url)
        qp.expect_error(r"404|403|WebSocket")  # the browser's own lines on a failed request
        await page.goto(url + "/", wait_until="load")
        out: dict[str, Any] = await qp.evaluate(FIRST_ERROR, ["/nowhere", transport])
    assert f"no rubris endpoint at {url}/nowhere/lp" in out["message"], out
    assert "is the mount path right?" in out["message"], out
    assert out["state"] == "closed", out
    qp.assert_clean()


async def test_an_origin_refusal_names_the_origin_and_allowed_origins(page: Page) -> None:
    rubris, served = app(allowed=["https://app.example"])

    async def foreign_origin(route: Route) -> None:
        # Chromium keeps the page's own Origin on a continued request: the proxy's rewrite is
        # played by fetching it ourselves with the foreign one
        response = await route.fetch(headers={**route.request.headers, "origin": FOREIGN})
        await route.fulfill(response=response)

    async with run_server(served) as url:
        qp = QueuePage(page, url)
        qp.expect_error(r"403")
        await page.goto(url + "/", wait_until="load")
        await page.route("**/rubris/lp", foreign_origin)
        out: dict[str, Any] = await qp.evaluate(FIRST_ERROR, ["/rubris", "longpoll"])
    assert f"origin '{FOREIGN}' is not allowed" in out["message"], out
    assert "allowed_origins" in out["message"], out
    assert out["state"] == "closed" and rubris.engine.sessions == {}, out
    qp.assert_clean()
