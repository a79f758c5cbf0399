"""Fixtures shared by test modules, and the markers of the suite's parts.

``python3 -m pytest`` runs everything (the README's test command, what CI runs). The parts that
need more than Python carry a marker, so a developer's inner loop can leave them out::

    python3 -m pytest -m "core and not slow"

- ``browser``: headless Chromium through Playwright (the ``browser``, ``page`` and ``chromium``
  fixtures, the ``test_browser*.py`` modules);
- ``spark``: a local SparkSession (the ``spark`` fixture, the Spark examples);
- ``redis``: a real ``redis-server`` the test starts (the ``redis_server`` / ``redis_url``
  fixtures, a parameter named ``redis``, and modules that start their own);
- ``node``: Node.js and npm (the TypeScript check of the browser client);
- ``install``: a fresh virtual environment installed from PyPI (the README's commands);
- ``core``: every test with none of the markers above: Python alone.

``slow`` (given by hand) marks a scenario that takes seconds by design.

Markers are given from the fixtures a test uses (``pytest_collection_modifyitems`` below), so a
new test is marked by what it needs. Playwright and PySpark are imported only by the tests that
use them: with ``-m "not browser"`` the suite runs without Playwright installed.
"""

from __future__ import annotations

import fnmatch
import importlib.util
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from websockets.asyncio.server import serve
from websockets.typing import Subprotocol

from .browserkit import (
    CHROMIUM,
    CHROMIUM_ARGS,
    HAVE_CHROMIUM,
    MISSING_CHROMIUM,
    chromium,  # noqa: F401 (the sync tests' fixture)
)
from .sparkkit import spark  # noqa: F401 (the session's SparkSession)
from .test_client_unit import FakeServer

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page

FIXTURE_MARKS = {
    "browser": "browser",
    "page": "browser",
    "chromium": "browser",
    "spark": "spark",
    "redis_server": "redis",
    "redis_url": "redis",
}
"""A test that uses the fixture (directly or through another) gets the marker."""

PARTS = ("browser", "spark", "redis", "node", "install")
"""The markers of what a test needs besides Python."""

IMPORTED_BY = {
    "browser": ("playwright", ("test_browser*.py", "test_example_batches.py")),
    "spark": ("pyspark", ("test_spark*.py",)),
    "redis": (
        "redis",
        (
            "test_*redis*.py",
            "test_faults.py",
            "test_scaleout.py",
            "test_send_to.py",
            "test_clusterkit.py",
            "test_relay_window.py",
        ),
    ),
}
"""The package a part's modules import at the top, and those modules: left out of collection
when the package is missing and the part is deselected (``-m "not browser"``)."""


def pytest_ignore_collect(collection_path: object, config: pytest.Config) -> bool | None:
    name = Path(str(collection_path)).name
    for marker, (package, patterns) in IMPORTED_BY.items():
        if (
            any(fnmatch.fnmatch(name, p) for p in patterns)
            and importlib.util.find_spec(package) is None
        ):
            expr = config.option.markexpr or ""
            if f"not {marker}" in expr or expr.strip() == "core":
                return True
            raise pytest.UsageError(
                f"{name} needs {package}, which is not installed: install the test extra "
                f"(python3 -m pip install -e '.[test]') or leave these tests out with "
                f'-m "not {marker}" (or -m core)'
            )
    return None


@pytest.hookimpl(tryfirst=True)  # before -m deselects by markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        marks = {mark for fixture, mark in FIXTURE_MARKS.items() if fixture in names}
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "redis" in callspec.params.values():
            marks.add("redis")
        for mark in marks:
            item.add_marker(mark)
        if all(item.get_closest_marker(name) is None for name in PARTS):
            item.add_marker("core")


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    """Headless Chromium for the Playwright async tests (test_browser.py has its own, sync)."""
    from playwright.async_api import async_playwright

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
