"""The operations page of the example app, in headless Chromium, as an operator opens it.

``python3 -m example_app`` runs as a subprocess; the demo page is open in two tabs, one over
WebSocket and one over long-poll (sessions, deliveries, a queue worked by the tabs), for some
seconds before the ops page is opened in another with the API token as the HTTP Basic password.
The page must go live with its "last 5 minutes" charts already drawn from the server's history
(nobody was looking while it was taken), its charts must move, every chart must say what it
measures, publish to frame must be shown apart for long-poll (whose figure includes waiting for
the client's polls) with the server's part of it, the slowest-sessions and errors tables must be
there, and nothing may reach the console. Without credentials the page is refused.

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
HISTORY_S = 8
"""Seconds the demo runs, both tabs open, before the ops page is: the history it must show."""


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
        lp_ctx = chromium.new_context(viewport={"width": 1280, "height": 900})
        lp_demo = Demo(lp_ctx.new_page(), server)
        lp_demo.open("/?transport=longpoll")
        lp_demo.wait_open("longpoll")
        # the server samples the page's figures on its own: no ops page is open yet
        time.sleep(HISTORY_S)

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
        # at its first answer, the charts hold the seconds before the page was opened
        opened = longest_run(page, "throughput")
        assert opened >= HISTORY_S - 2, f"{opened} points at first draw: no history served"
        sessions_drawn = longest_run(page, "sessions")
        assert sessions_drawn >= HISTORY_S - 2, sessions_drawn
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
        # every chart says what it measures
        captions = page.eval_on_selector_all(
            "[data-chart]",
            "els => els.map(e => [e.dataset.chart, "
            "e.querySelector('[data-caption]')?.textContent ?? '', "
            "e.querySelector('h3')?.title ?? ''])",
        )
        assert len(captions) >= 9
        for name, caption, tooltip in captions:
            assert len(caption) > 40 and tooltip == caption, name
        ws_caption = page.locator('[data-caption="publish-latency"]').inner_text()
        assert "WebSocket" in ws_caption and "server's own delay" in ws_caption
        # long-poll's figure apart, with why it differs and the server's part of it
        lp_chart = page.locator('[data-chart="longpoll-latency"]')
        assert lp_chart.locator("svg.plot").is_visible()
        assert "waiting for the client's next polls" in lp_chart.inner_text()
        page.wait_for_function(
            """() => [...document.querySelectorAll('[data-chart="longpoll-latency"] .series')]
                .map(g => g.dataset.series).join() === "p50,p99,server's part p99"
                && document.querySelectorAll('[data-chart="longpoll-latency"] polyline').length"""
        )
        latency = page.locator('[data-tile="latency"]').inner_text()
        assert "WebSocket p99" in latency and "long-poll p99" in latency, latency
        assert "server's part" in latency, latency
        sessions = page.locator('[data-tile="sessions"]').inner_text()
        assert any(ch.isdigit() and ch != "0" for ch in sessions), sessions
        for table in ("slowest", "topics", "queues", "errors"):
            assert page.locator(f'[data-table="{table}"]').count() == 1, table
        # the 401s that asked for credentials (the request above, and Chromium's first one,
        # sent without them until the challenge) are no error: the table does not count them
        errors = page.locator('[data-table="errors"]').inner_text()
        assert "HTTP 401" not in errors, errors
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
        lp_ctx.close()
        demo_ctx.close()
    finally:
        server.stop()


def longest_run(page: Page, chart: str) -> int:
    """The points of a chart's longest drawn run (a series' polyline)."""
    runs = points(page, chart)
    return max((len(r.split()) for r in runs), default=0)


def _note(console: list[str], m: ConsoleMessage) -> None:
    if m.type in ("error", "warning"):
        console.append(f"{m.type}: {m.text}")
