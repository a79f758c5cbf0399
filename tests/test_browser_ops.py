"""The operations page of the example app, in headless Chromium, as an operator opens it.

``python -m example_app`` runs as a subprocess; the demo page is open in one tab (sessions,
deliveries, a queue worked by the tab), the ops page in another with the API token as the
HTTP Basic password. The page must go live, its charts must move, the slowest-sessions and
errors tables must be there, and nothing may reach the console. Without credentials the page
is refused.

test-output/ops.png is written on every run; ``RUBRIS_UPDATE_DOCS_SCREENSHOT=1`` also writes
docs/images/ops.png (the screenshot in docs/operations.md).
"""

from __future__ import annotations

import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page

from .test_browser import API_TOKEN, ROOT, Demo, DemoServer, free_port

pytestmark = pytest.mark.browser

WAIT_MS = 15_000


def points(page: Page, chart: str) -> list[str]:
    """The drawn series of one chart, as SVG point lists."""
    return page.eval_on_selector_all(
        f'[data-chart="{chart}"] polyline, [data-chart="{chart}"] path',
        "els => els.map(e => e.getAttribute('points') || e.getAttribute('d') || '')",
    )


@pytest.mark.timeout(180)
def test_the_ops_page_shows_the_demo_live(chromium: Browser, tmp_path: Path) -> None:
    server = DemoServer(free_port(), tmp_path)
    server.start()
    try:
        # refused without credentials, before any page is drawn
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{server.url}/rubris/ops", timeout=5)
        assert refused.value.code == 401
        assert refused.value.headers["WWW-Authenticate"] == 'Basic realm="rubris ops"'

        demo_ctx = chromium.new_context(viewport={"width": 1280, "height": 900})
        demo = Demo(demo_ctx.new_page(), server)
        demo.open("/")
        demo.wait_open("websocket")

        ops_ctx = chromium.new_context(
            viewport={"width": 1400, "height": 1000},
            http_credentials={"username": "ops", "password": API_TOKEN},
        )
        ops_ctx.set_default_timeout(WAIT_MS)
        page = ops_ctx.new_page()
        console: list[str] = []
        page.on("console", lambda m: _note(console, m))
        page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
        r = page.goto(f"{server.url}/rubris/ops")
        assert r is not None and r.status == 200
        page.wait_for_function(
            "document.querySelector('[data-status]')?.textContent.trim() === 'live'"
        )
        # rates need two snapshots; the charts need a few seconds of them
        page.wait_for_function(
            'document.querySelectorAll(\'[data-chart="throughput"] polyline, '
            '[data-chart="throughput"] path\').length > 0'
        )
        time.sleep(3)
        first = points(page, "throughput")
        time.sleep(3)
        second = points(page, "throughput")
        assert first and second and first != second, "the deliveries chart did not move"
        for chart in ("cycle-latency", "publish-latency", "sessions", "capacity", "topics"):
            assert page.locator(f'[data-chart="{chart}"]').count() == 1, chart
        sessions = page.locator('[data-tile="sessions"]').inner_text()
        assert any(ch.isdigit() and ch != "0" for ch in sessions), sessions
        for table in ("slowest", "topics", "queues", "errors"):
            assert page.locator(f'[data-table="{table}"]').count() == 1, table
        text = page.locator("body").inner_text()
        assert "reprice" in text  # the demo's work queue, in the queues table
        assert "prices." in text or "trades" in text  # a busy topic of the demo

        out = ROOT / "test-output" / "ops.png"
        out.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(out), full_page=True)
        if os.environ.get("RUBRIS_UPDATE_DOCS_SCREENSHOT") == "1":
            shutil.copy(out, ROOT / "docs" / "images" / "ops.png")
        assert console == [], console
        ops_ctx.close()
        demo_ctx.close()
    finally:
        server.stop()


def _note(console: list[str], m: ConsoleMessage) -> None:
    if m.type in ("error", "warning"):
        console.append(f"{m.type}: {m.text}")
