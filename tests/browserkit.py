"""What every browser test shares: where Chromium is, how it is started, and the asyncio
``browser`` fixture (in conftest.py) that the Playwright async tests use."""

from __future__ import annotations

import os

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
