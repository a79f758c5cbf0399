"""Fixtures shared by test modules."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from playwright.async_api import Browser, Page, async_playwright
from websockets.asyncio.server import serve
from websockets.typing import Subprotocol

from .browserkit import (
    CHROMIUM,
    CHROMIUM_ARGS,
    HAVE_CHROMIUM,
    MISSING_CHROMIUM,
    chromium,  # noqa: F401 (the sync tests' fixture)
)
from .test_client_unit import FakeServer


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    """Headless Chromium for the Playwright async tests (test_browser.py has its own, sync)."""
    if not HAVE_CHROMIUM:
        # Not a skip: CI installs chromium, and a suite that quietly skips hides a broken setup.
        pytest.fail(MISSING_CHROMIUM, pytrace=False)
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            await b.close()


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    """A fresh page in its own context; one wait in it is bounded by 15 s."""
    context = await browser.new_context()
    context.set_default_timeout(15_000)
    try:
        yield await context.new_page()
    finally:
        await context.close()


@pytest.fixture
async def server() -> AsyncIterator[FakeServer]:
    """A fake rubris server on 127.0.0.1 that the client unit tests script frame by frame."""
    fake = FakeServer()
    async with serve(
        fake.handler,
        "127.0.0.1",
        0,
        subprotocols=[Subprotocol("rubris.v1")],
        compression=None,
    ) as srv:
        fake.port = srv.sockets[0].getsockname()[1]
        yield fake


from .sparkkit import spark  # noqa: F401, E402
