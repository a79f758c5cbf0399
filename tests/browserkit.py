"""What every browser test shares: where Chromium is, how it is started, the ``chromium``
fixture of the sync Playwright tests, and the asyncio ``browser`` fixture (in conftest.py) that
the Playwright async tests use."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported when used: conftest.py loads this module without Playwright
    from playwright.sync_api import Browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
HAVE_CHROMIUM = os.path.exists(CHROMIUM)
MISSING_CHROMIUM = (
    f"{CHROMIUM} is missing: the browser tests need Debian's chromium "
    "(apt-get install chromium; .ci/run does it)"
)


@pytest.fixture
def chromium() -> Iterator[Browser]:
    """A headless Chromium for one test (sync Playwright); import it into the test module."""
    from playwright.sync_api import sync_playwright

    if not HAVE_CHROMIUM:
        pytest.fail(MISSING_CHROMIUM, pytrace=False)
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()
